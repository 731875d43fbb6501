"""tune_fp8_gemm.py's shape list and candidate launches (the GPU run times them; these parts are pure)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
import tune_fp8_gemm as tune  # noqa: E402


def glm52_config(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks/serving/gpu/make_glm52_shaped.py"), str(tmp_path / "m")],
                   check=True, capture_output=True)
    return json.loads((tmp_path / "m" / "config.json").read_text())


def test_glm52_linear_shapes_per_rank(tmp_path):
    cfg = glm52_config(tmp_path)
    one, eight = tune.linear_shapes(cfg, 1), tune.linear_shapes(cfg, 8)
    assert one["q_b_proj"] == (64 * 256, 2048) and eight["q_b_proj"] == (64 * 256 // 8, 2048)
    assert one["o_proj"] == (6144, 64 * 256) and eight["o_proj"] == (6144, 2048)
    # q_a and kv_a: one replicated GEMM
    assert one["fused_qkv_a_proj_with_mqa"] == eight["fused_qkv_a_proj_with_mqa"] == (2048 + 576, 6144)
    assert one["dense gate_up"] == (2 * 12288, 6144) and eight["shared expert down"] == (6144, 2048 // 8)
    assert all(k % tune.BLOCK == 0 for _, k in [*one.values(), *eight.values()])


def test_the_shipped_configs_are_the_served_shapes(tmp_path):
    """One file per GPU tuned on (H200, H100) for each block-FP8 linear the model builds at TP 1 (q_a and kv_a
    as their one fused GEMM), none for a shape it no longer runs."""
    from sglang_glm.hooks import gemm

    served = set(tune.linear_shapes(glm52_config(tmp_path), 1).values())
    for gpu in ("NVIDIA_H200", "NVIDIA_H100_80GB_HBM3"):
        shipped = {tuple(int(f.split("=")[1]) for f in p.name.split(",")[:2]) for p in gemm.TUNED.glob(f"*{gpu},*.json")}
        assert shipped == served, gpu


def test_candidates_split_only_what_k_has_and_swap_only_small_batches():
    for M, N, K in ((1, 6144, 16384), (16, 576, 6144), (64, 24576, 6144), (512, 6144, 256), (4096, 2048, 6144)):
        cands = tune.candidates(M, N, K)
        assert cands and len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands)
        assert all(c.get("SPLIT_K", 1) <= K // tune.BLOCK and c["BLOCK_SIZE_K"] == tune.BLOCK for c in cands)
        assert any(c.get("SWAP_AB") for c in cands) == (M <= 64)
        assert all(c["BLOCK_SIZE_M"] >= min(M, 16) or not c.get("SWAP_AB") for c in cands)
    # batch 1 on o_proj: 48 weight tiles of 128 rows leave 84 of 132 SMs idle unless K is split
    assert {c["SPLIT_K"] for c in tune.candidates(1, 6144, 16384) if c.get("SWAP_AB") and c["BLOCK_SIZE_N"] == 128} \
        == {1, 2, 4, 8}


def test_quantized_inputs_reference_is_the_dequantized_product():
    import torch

    a8, a_s, w8, w_s, ref = tune.quantized_inputs(3, 200, 256, device="cpu")  # N not a block multiple
    assert w8.shape == (200, 256) and w_s.shape == (2, 2) and a_s.shape == (3, 2)
    a = a8.float() * a_s.repeat_interleave(128, 1)
    w = w8.float() * w_s.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)
    assert torch.allclose(ref, a @ w.T)
    assert (a8.float().abs().amax() <= 448) and (w8.float().abs().amax() <= 448)


def test_sglang_default_is_the_launch_sglang_runs_without_a_file(monkeypatch):
    """The tuner writes SGLANG_DEFAULT where SGLang's own launch wins or for prefill anchors: it must be
    the launch SGLang's block-FP8 GEMM runs for a shape it has no file for."""
    import torch
    from sglang.kernels.ops.gemm import fp8_kernel

    seen = {}

    class Capture:
        def __getitem__(self, grid):
            return lambda *args, **launch: seen.update(launch)

    monkeypatch.setattr(fp8_kernel, "get_w8a8_block_fp8_configs", lambda *a: None)
    monkeypatch.setattr(fp8_kernel, "get_platform", lambda: type("NotHopper", (), {"is_sm90": False})())
    monkeypatch.setattr(fp8_kernel, "select_w8a8_block_fp8_matmul_kernel", lambda M, N, config: Capture())
    a8, a_s, w8, w_s, _ = tune.quantized_inputs(3, 256, 256, device="cpu")
    fp8_kernel.w8a8_block_fp8_matmul_triton(a8, w8, a_s, w_s, [tune.BLOCK, tune.BLOCK], torch.bfloat16)
    assert {k: seen[k] for k in tune.SGLANG_DEFAULT} == tune.SGLANG_DEFAULT
    assert tune.sglang_launch(None, 4096) == tune.SGLANG_DEFAULT
    assert tune.sglang_launch({1: {"a": 1}, 64: {"b": 2}}, 40) == {"b": 2}


INTERPRETED = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from sglang_glm.cpu_compat import activate; activate()
import tune_fp8_gemm as tune
from sglang.kernels.ops.gemm import fp8_kernel
fp8_kernel.get_platform = lambda: type("Hopper", (), {"is_sm90": True})()  # the launcher picks its SM90 kernel
M, N, K = 3, 200, 512
inputs = tune.quantized_inputs(M, N, K, device="cpu")
cands = tune.candidates(M, N, K)
picks = [next(c for c in cands if c.get("SWAP_AB") and c["SPLIT_K"] == 1),
         next(c for c in cands if c.get("SWAP_AB") and c["SPLIT_K"] == 4),
         next(c for c in cands if not c.get("SWAP_AB") and c.get("SPLIT_K", 1) == 2),
         None]  # SGLang's default launch
for launch in picks:
    out = tune.matmul_with(launch, M, *inputs[:4])
    err = ((out.float() - inputs[-1]).norm() / inputs[-1].norm()).item()
    print(launch, err)
    assert err < 1e-2, (launch, err)
"""


def test_candidates_run_through_sglangs_own_launcher():
    """Under TRITON_INTERPRET (CPU), SGLang's Hopper kernel takes the tuner's swapped and split-K launches
    (the keys and values a shipped file will carry) and matches the float32 reference, as its default does."""
    import os

    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", INTERPRETED, str(ROOT / "benchmarks" / "kernels")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("\n") == 4


def test_the_draft_heads_shape_per_rank(tmp_path):
    cfg = glm52_config(tmp_path)
    assert tune.draft_head_shape(cfg, 1) == {"draft head": (154880, 6144)}
    assert tune.draft_head_shape(cfg, 8) == {"draft head": (19360, 6144)}
    assert tune.draft_head_shape(dict(cfg, vocab_size=1000), 8) == {"draft head": (128, 6144)}  # 1024 / 8
    assert tune.draft_head_shape(dict(cfg, vocab_size=1000), 3) == {"draft head": (384, 6144)}  # 1152 / 3
