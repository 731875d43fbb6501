"""The GPU suite's tests without a result in a pytest-xdist log that its timeout cut, started or not.

    python3 scripts/gpu_suite_unfinished.py gpu_suite.log selected_ids.txt

selected_ids.txt is `pytest --collect-only -q`'s output for the same selection (the lines with `::`);
xdist prints a node id as a worker starts it (at a line's start, sometimes followed by other output)
and `-rA` a result line per finished test.
"""

import re
import sys


def unfinished(log: str, selected: list[str]) -> tuple[int, list[str]]:
    """(tests with a result, '<id> (started|not started)' for each selected test without one)."""
    done = set(re.findall(r"(?:PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (tests/gpu/\S+::\S+)", log))
    started = set(re.findall(r"^(tests/gpu/\S+::\S+)", log, re.M))
    return len(done), [f"{t} ({'started' if t in started else 'not started'})" for t in selected if t not in done]


def main() -> None:
    log = open(sys.argv[1], errors="replace").read()
    selected = [line.strip() for line in open(sys.argv[2]) if "::" in line]
    reported, missing = unfinished(log, selected)
    print(f"cut by GPU_SUITE_TIMEOUT: {reported} of {len(selected)} selected tests reported; without a result:",
          *missing or ["(none)"], sep="\n  ")


if __name__ == "__main__":
    main()
