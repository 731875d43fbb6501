"""What both launch-config tuners share: picking the fastest correct launch, and writing SGLang-format
config files ({batch: launch})."""

from __future__ import annotations

import json
from pathlib import Path


def merge_into(path: Path, entries: dict[int, dict], anchors: list[int], sglang_launch) -> None:
    """Write `entries` ({batch: launch}) into the config file at `path`, over what it holds, and SGLang's
    own launch at each anchor batch the file lacks (SGLang takes the entry nearest a call's batch, so
    without them a prefill chunk would run the largest tuned batch's launch)."""
    merged = {**(json.loads(path.read_text()) if path.exists() else {}), **{str(m): c for m, c in entries.items()}}
    for M in anchors:
        merged.setdefault(str(M), sglang_launch(M))
    path.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: int(kv[0]))), indent=1) + "\n")


def fastest_launch(run, candidates, base: tuple[float, dict], against, tol: float, label: str):
    """(seconds, launch): the fastest of `candidates` whose output `run(launch)` is within `tol` (relative
    norm) of `against`, timed by bench_kernels.bench; `base` (SGLang's own launch and its time) unless
    one beats it. A launch that is wrong, or that Triton cannot build here, is reported and skipped."""
    from bench_kernels import bench

    best = base
    for launch in candidates:
        try:
            err = ((run(launch).float() - against).norm() / against.norm()).item()
            if not err < tol:
                print(f"  {label} {launch}: WRONG (rel err {err:.1e})", flush=True)
                continue
            t = bench(lambda: run(launch), rep=30)
        except Exception as exc:  # a launch Triton cannot build here is no candidate
            print(f"  {label} {launch}: {type(exc).__name__}", flush=True)
            continue
        if t < best[0]:
            best = (t, launch)
    return best
