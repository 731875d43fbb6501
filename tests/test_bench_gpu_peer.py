"""bench_gpu.py's peer runs (issue 30): `CONFIG@sglang` serves SGLang's own GLM-DSA path, which needs
FlashMLA (`--peer-site`); its flags follow the config's KV dtype and speculation."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

GPU_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "serving" / "gpu"
MODEL = Path(__file__).resolve().parents[1] / "assets" / "glm-dsa-mini"


def bench_gpu(*args, tmp_path):
    return subprocess.run([sys.executable, str(GPU_BENCH / "bench_gpu.py"), "--model", str(MODEL),
                           "--out", str(tmp_path), *args], capture_output=True, text=True)


def test_a_peer_run_needs_flash_mla(tmp_path):
    r = bench_gpu("--run", "indexcache@sglang:decode_b1", tmp_path=tmp_path)
    assert r.returncode != 0 and "add --peer-site DIR" in r.stderr, r.stderr
    r = bench_gpu("--peer-site", str(tmp_path), "--run", "indexcache@sglang:decode_b1", tmp_path=tmp_path)
    assert r.returncode != 0 and "no flash_mla package" in r.stderr, r.stderr


def test_peer_flags_follow_the_kv_dtype_and_speculation():
    code = ("import json, bench_gpu as b; from sglang_glm_tools import peer; k = b.configs(8); "
            "print(json.dumps({n: peer.flags(k[n]) for n in ('indexcache', 'fp8_kv', 'eagle_3_4')}))")
    flags = json.loads(subprocess.run([sys.executable, "-c", code], cwd=GPU_BENCH, capture_output=True, text=True,
                                      check=True).stdout)
    bf16, fp8, mtp = flags["indexcache"], flags["fp8_kv"], flags["eagle_3_4"]
    assert bf16[:2] == ["--attention-backend", "dsa"] and bf16.count("flashmla_sparse") == 2
    assert fp8.count("flashmla_kv") == 2 and "flashmla_sparse" not in fp8
    assert mtp[-2:] == ["--speculative-dsa-topk-backend", "torch"] and "--speculative-dsa-topk-backend" not in bf16


def test_the_peer_indexer_runs_on_deep_gemm_only_where_the_site_holds_it(tmp_path):
    """Without deep_gemm in the peer's site, SGLang's DSA indexer must be told to use its torch
    fall-back (else it imports deep_gemm and the scheduler dies); with it, it must not be."""
    from sglang_glm_tools import peer

    assert peer.indexer(tmp_path) == "torch"
    assert peer.env(tmp_path)["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "1"
    (tmp_path / "deep_gemm").mkdir()
    assert peer.indexer(tmp_path) == "deepgemm"
    env = peer.env(tmp_path)
    assert "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH" not in env and env["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert env["SGLANG_PLUGINS"] == "gpu_standin"


def test_peer_flags_and_log_check_shared_by_bench_gpu_and_profile_decode(tmp_path, monkeypatch):
    sys.path.insert(0, str(GPU_BENCH))
    import bench_gpu
    from sglang_glm_tools import peer

    own = peer.flags(["--kv-cache-dtype", "fp8_e4m3"])
    for card_gb, pool in ((150.0, ["0.5", "2048"]), (85.0, ["0.70", "512"])):  # an H200, an H100
        monkeypatch.setattr(bench_gpu, "card_gb", lambda: card_gb)
        flags = bench_gpu.peer_flags(["--kv-cache-dtype", "fp8_e4m3"], tmp_path)
        assert flags == ["--kv-cache-dtype", "fp8_e4m3", *own, "--mem-fraction-static", pool[0],
                         "--cuda-graph-max-bs-prefill", pool[1]]
    log = tmp_path / "server.log"
    log.write_text("SGLang's own model loaded\n")
    bench_gpu.check_peer_log(log, "indexcache@sglang")
    log.write_text(f"... {peer.PLUGIN_MODEL_LOG_LINE}F S S S) ...\n")
    with pytest.raises(SystemExit, match="the plugin's model served"):
        bench_gpu.check_peer_log(log, "indexcache@sglang")
