"""peer_report.py pairs SGLang's own path with the plugin per config and workload, within one run;
several runs give the union of their pairs."""

import json
import subprocess
import sys
from pathlib import Path

GPU_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "serving" / "gpu"


def row(config, workload, plugin, tpot=None, ttft=None, **extra):
    return {"config": config, "workload": workload, "plugin": plugin, "median_tpot_ms": tpot,
            "median_ttft_ms": ttft, "meta": {"hardware": "NVIDIA H200"}, **extra}


def test_pairs_per_config_and_workload(tmp_path):
    rows = [
        row("indexcache", "decode_b1", "sglang", tpot=6.0, peer_indexer="deepgemm"),
        row("indexcache", "decode_b1", None, tpot=5.0),
        row("indexcache", "prefill_32k", "sglang", tpot=0.0, ttft=900.0, peer_indexer="deepgemm"),
        row("indexcache", "prefill_32k", None, tpot=0.0, ttft=1000.0),
        row("fp8_kv", "decode_b32", "sglang", tpot=20.0),
        row("fp8_kv", "decode_b32", "flashmla", tpot=10.0),  # a plugin copy: its own row
        {"config": "eagle_3_4", "plugin": "sglang", "error": "server exited"},
    ]
    other_run = [row("eagle_3_4", "decode_b1", "sglang", tpot=8.0), row("eagle_3_4", "decode_b1", None, tpot=4.0),
                 row("indexcache", "decode_b1", None, tpot=1.0)]  # its peer ran in the first file: no pair
    results = [tmp_path / "run1" / "results.jsonl", tmp_path / "run2" / "results.jsonl"]
    for path, run in zip(results, (rows, other_run)):
        path.parent.mkdir()
        path.write_text("".join(json.dumps(r) + "\n" for r in run))
    subprocess.run([sys.executable, str(GPU_BENCH / "peer_report.py"), *map(str, results), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    table = json.loads((tmp_path / "peer.json").read_text())
    assert table == [
        {"what": "fp8_kv decode_b32 (plugin@flashmla)", "metric": "median_tpot_ms", "sglang": 20.0, "plugin": 10.0,
         "ratio": 2.0, "sglang_indexer": "torch", "run": "run1"},
        {"what": "indexcache decode_b1", "metric": "median_tpot_ms", "sglang": 6.0, "plugin": 5.0, "ratio": 1.2,
         "sglang_indexer": "deepgemm", "run": "run1"},
        {"what": "indexcache prefill_32k", "metric": "median_ttft_ms", "sglang": 900.0, "plugin": 1000.0, "ratio": 0.9,
         "sglang_indexer": "deepgemm", "run": "run1"},
        {"what": "eagle_3_4 decode_b1", "metric": "median_tpot_ms", "sglang": 8.0, "plugin": 4.0, "ratio": 2.0,
         "sglang_indexer": "torch", "run": "run2"},  # a run that did not record it ran the fall-back
    ]
    assert ("| indexcache decode_b1 | median_tpot_ms | 6.00 ms | 5.00 ms | 1.20x | deepgemm | run1 |"
            in (tmp_path / "peer.md").read_text())
    assert (tmp_path / "peer.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
