"""bench_mtp.py's tables: every config's speedup is against the run's `--plain` server, batch by batch,
and mtp_speed.json reports the `--headline` config (issue 29's format)."""

import json
import subprocess
import sys
from pathlib import Path

GPU_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "serving" / "gpu"


def row(config, batch, repeat, tpot, accept=None):
    return {"config": config, "workload": f"text_b{batch}", "batch": batch, "repeat": repeat,
            "median_tpot_ms": tpot, "median_itl_ms": tpot, "accept_length": accept,
            "meta": {"hardware": "test", "model_path": "m"}}


def test_speedups_are_against_the_named_plain_server(tmp_path):
    rows = [row("indexcache", 1, r, 9.0) for r in range(3)]
    rows += [row("prefill_graphs", 1, r, t) for r, t in enumerate([2.0, 3.0, 4.0])]
    rows += [row("eagle_3_4_prefill_graphs", 1, r, t, 3.6) for r, t in enumerate([1.0, 1.0, 2.0])]
    results = tmp_path / "mtp_results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    subprocess.run([sys.executable, "bench_mtp.py", "--tables", str(results), "--plain", "prefill_graphs",
                    "--headline", "eagle_3_4_prefill_graphs"], cwd=GPU_BENCH, check=True, capture_output=True)
    head = json.loads((tmp_path / "mtp_speed.json").read_text())
    assert (head["config"], head["plain"]) == ("eagle_3_4_prefill_graphs", "prefill_graphs")
    b1 = head["batch"]["1"]
    # medians 3.0 / 1.0; per-round ratios 2.0, 3.0, 2.0
    assert (b1["plain_tpot_ms"], b1["mtp_tpot_ms"], b1["speedup"]) == (3.0, 1.0, 3.0)
    assert b1["speedup_range"] == [2.0, 3.0] and b1["accept_length"] == 3.6
    shapes = json.loads((tmp_path / "mtp_shapes.json").read_text())["shapes"]
    assert shapes["indexcache"]["1"]["speedup"] == round(3.0 / 9.0, 3)  # a plain config against the plain one
