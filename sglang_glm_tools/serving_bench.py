"""What the serving benchmarks (benchmarks/serving, CPU; benchmarks/serving/gpu) share: the server
under test and SGLang's own `python -m sglang.bench_serving` as the client.

`server` starts the plugin's CPU launcher on a CPU machine, `python -m sglang.launch_server` on a GPU
one; `write_dataset` turns the repository's held-out text into a local ShareGPT-layout dataset (no
hub download); `run_bench_serving` runs one benchmark, in its own process or a kept `BenchClient`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from sglang_glm.cpu_compat import CPU_SERVER_ARGS
from sglang_glm_tools.server import launched_server


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


@contextlib.contextmanager
def server(model: Path, extra: list[str], log_path: Path, max_running: int, timeout=600):
    """The server in its own process group; yields (url, None) or (None, error text)."""
    launcher = "sglang_glm.cpu_compat.launch_server" if on_cpu() else "sglang.launch_server"

    def cmd(port):
        return [sys.executable, "-m", launcher, "--model-path", str(model), "--host", "127.0.0.1",
                "--port", str(port), "--max-running-requests", str(max_running),
                "--enable-metrics", "--decode-log-interval", "1", *extra, *(CPU_SERVER_ARGS if on_cpu() else [])]

    t0 = time.time()
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(launched_server(cmd, log_path, timeout))
        except (RuntimeError, TimeoutError) as exc:
            tail = log_path.read_text().strip().splitlines()[-5:]
            yield None, f"{exc}: " + " | ".join(tail)
            return
        print(f"  server up in {time.time() - t0:.0f}s: {' '.join(extra)}", flush=True)
        yield url, None


def write_dataset(path: Path, heldout: Path, n: int = 200, chunk: int = 1200) -> Path:
    """The held-out text (`heldout`, the benchmarks' benchmarks/train/data/heldout.txt) as ShareGPT-layout
    conversations (human: a chunk, gpt: the next)."""
    text = heldout.read_text()
    rows = []
    for i in range(n):
        a = (i * 977) % max(1, len(text) - 2 * chunk)
        rows.append({"id": str(i), "conversations": [
            {"from": "human", "value": text[a:a + chunk]},
            {"from": "gpt", "value": text[a + chunk:a + 2 * chunk]},
        ]})
    path.write_text(json.dumps(rows))
    return path


# `python -m sglang.bench_serving`, except that SGLang 0.5.23's benchmark package imports HF `datasets`
# at import time (for MMMU) and that package is not part of the CPU environment; the random dataset
# over a local file never calls it, so a stand-in module that refuses to be used is enough.
CLIENT = """
import sys, types
try:
    import datasets
except ImportError:
    m = types.ModuleType("datasets")
    def load_dataset(*a, **k):
        raise RuntimeError("HF datasets is not installed; use a local random/custom dataset")
    m.load_dataset = load_dataset
    sys.modules["datasets"] = m
sys.argv[0] = "sglang.bench_serving"
from sglang.benchmark.serving import cli_main
"""

# One run per process; BenchClient keeps a process for many runs (importing SGLang's benchmark
# package takes longer than a short workload runs): one argv as a JSON line on stdin per run.
DONE = "@@bench_serving_done"
CLIENT_ONCE = CLIENT + "cli_main()\n"
CLIENT_LOOP = CLIENT + f"""
import json, traceback
for line in sys.stdin:
    sys.argv = ["sglang.bench_serving", *json.loads(line)]
    try:
        cli_main()
        rc = 0
    except BaseException:  # argparse's SystemExit too: the loop serves the next run
        traceback.print_exc(file=sys.stdout)
        rc = 1
    print("{DONE}", rc, flush=True)
"""


class BenchClient:
    """A bench_serving process that stays up between runs (`run` as run_bench_serving's)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", CLIENT_LOOP], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

    def run(self, argv: list[str], out: Path) -> tuple[int, str]:
        self.proc.stdin.write(json.dumps([*argv, "--output-file", str(out)]) + "\n")
        self.proc.stdin.flush()
        lines = []
        for line in self.proc.stdout:
            if line.startswith(DONE):
                return int(line.split()[1]), "".join(lines)
            lines.append(line)
        raise RuntimeError("bench_serving client exited: " + "".join(lines)[-2000:])

    def __enter__(self) -> "BenchClient":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_bench_serving(argv: list[str], out: Path, timeout: float, client: BenchClient | None = None) -> dict:
    """`python -m sglang.bench_serving ARGV --output-file OUT` (in `client`'s process when given);
    its result line. The client's output goes to OUT with the suffix .log."""
    out.unlink(missing_ok=True)
    print("  python -m sglang.bench_serving " + " ".join([*argv, "--output-file", str(out)]), flush=True)
    if client is None:
        cmd = [sys.executable, "-c", CLIENT_ONCE, *argv, "--output-file", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    else:
        rc, log = client.run(argv, out)
    (out.with_suffix(".log")).write_text(log)
    if rc != 0 or not out.exists():
        raise RuntimeError(f"bench_serving failed ({rc}): {log[-2000:]}")
    return json.loads(out.read_text().strip().splitlines()[-1])
