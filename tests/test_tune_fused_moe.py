"""tune_fused_moe.py's shapes, candidate launches and inputs, and SGLang's fused MoE kernel running the
candidates under TRITON_INTERPRET (the GPU run times them)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "kernels"))
import tuning as tune_files  # noqa: E402
import tune_fused_moe as tune  # noqa: E402


def test_glm52_expert_shapes_per_rank(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks/serving/gpu/make_glm52_shaped.py"), str(tmp_path / "m")],
                   check=True, capture_output=True)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    # SGLang fuses the shared expert into the kernel: expert 256, in every token's top-k
    assert tune.expert_shapes(cfg, 1) == (257, 2048, 6144, 9)
    assert tune.expert_shapes(cfg, 8) == (257, 256, 6144, 9)
    assert tune.expert_shapes(cfg, 1, fused=False) == (256, 2048, 6144, 8)  # --disable-shared-experts-fusion
    assert tune.expert_shapes(cfg, 1, experts=64) == (64, 2048, 6144, 8)  # the deep proxy's: not fused


def test_candidates_fit_the_batch():
    for M in (1, 4, 16, 32, 64, 128, 4096):
        cands = tune.candidates(M)
        assert cands and len({json.dumps(c, sort_keys=True) for c in cands}) == len(cands)
        assert all(c["BLOCK_SIZE_K"] == tune.BLOCK for c in cands)
    # decode and verify batches: an expert holds a token or two, so the smallest token tile (SGLang's
    # SM90 kernel swaps operands below 64 rows)
    assert {c["BLOCK_SIZE_M"] for c in tune.candidates(4)} == {16}
    assert max(c["BLOCK_SIZE_M"] for c in tune.candidates(64)) < 64
    assert {c["BLOCK_SIZE_M"] for c in tune.candidates(4096)} == {32, 64, 128}


def test_quantized_experts_and_their_reference():
    import torch

    w1, s1, w2, s2 = tune.quantized_experts(3, 256, 384, device="cpu")
    assert w1.shape == (3, 512, 384) and s1.shape == (3, 4, 3) and w2.shape == (3, 384, 256) and s2.shape == (3, 3, 2)
    assert w1.dtype == torch.float8_e4m3fn and w1.float().abs().amax() <= 448
    d = tune.dequantized(w2, s2, 1)
    assert torch.equal(d[128:256, 128:256], w2[1, 128:256, 128:256].float() * s2[1, 1, 1])
    x, weights, ids = tune.routed_tokens(5, 3, 384, 2, device="cpu")
    assert ids.shape == (5, 2) and all(len(set(r)) == 2 for r in ids.tolist())
    _, fused_weights, fused_ids = tune.routed_tokens(5, 4, 384, 3, shared=1, device="cpu")
    assert (fused_ids[:, -1] == 3).all() and (fused_ids[:, :-1] < 3).all() and (fused_weights[:, -1] == 1).all()
    assert all(len(set(r)) == 3 for r in fused_ids.tolist())
    # one token, one expert at weight 1: the reference is down(silu(gate) * up)
    ref = tune.reference(x[:1], torch.ones(1, 1), ids[:1, :1], w1, s1, w2, s2)
    h = tune.dequantized(w1, s1, int(ids[0, 0])) @ x[0].float()
    want = tune.dequantized(w2, s2, int(ids[0, 0])) @ (torch.nn.functional.silu(h[:256]) * h[256:])
    assert torch.allclose(ref[0], want)


INTERPRETED = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from sglang_glm.cpu_compat import activate; activate()
from sglang_glm.cpu_compat.ops import bind_interpreted_moe_align; bind_interpreted_moe_align()
import tune_fused_moe as tune
from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config
fused_moe_triton_config.get_device_name = lambda: "NVIDIA H200"  # SGLang names its config file by GPU
tune.publish_runtime_context("cpu", "tune_fused_moe")
E, N, K, topk, M = 8, 256, 256, 2, 3
experts = tune.quantized_experts(E, N, K, device="cpu")
x, weights, ids = tune.routed_tokens(M, E, K, topk, device="cpu")
own = tune.experts_with(None, x, weights, ids, *experts).float()  # SGLang's default launch
ref = tune.reference(x, weights, ids, *experts)
print("sglang", ((own - ref).norm() / ref.norm()).item())
cands = tune.candidates(M)
for launch in (cands[0], cands[-1]):
    with tune.launch_config(launch):  # the launch is what SGLang's kernel is handed, not its default
        w1, _, w2, _ = experts
        assert fused_moe_triton_config.try_get_optimal_moe_config(
            w1.shape, w2.shape, topk, "fp8_w8a8", M, block_shape=[128, 128]) == launch
    out = tune.experts_with(launch, x, weights, ids, *experts).float()
    print(launch, ((out - own).norm() / own.norm()).item())
"""


def test_candidates_run_through_sglangs_fused_moe():
    """Under TRITON_INTERPRET (CPU), SGLang's fused MoE kernel takes the tuner's launches (the keys and
    values a shipped file will carry) and gives its default launch's output; that output is the float32
    reference's within the activations' FP8 rounding (coarser here: the interpreter's e4m3 cast truncates)."""
    import os

    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", INTERPRETED, str(ROOT / "benchmarks" / "kernels")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line.rsplit(" ", 1) for line in proc.stdout.strip().splitlines()[-3:]]
    assert lines[0][0] == "sglang" and float(lines[0][1]) < 0.15, proc.stdout
    assert all(float(err) < 1e-3 for _, err in lines[1:]), proc.stdout


def test_files_keep_tuned_batches_and_get_sglangs_launch_at_the_anchors(tmp_path):
    path = tmp_path / "E=8.json"
    tuned, sglang = {"BLOCK_SIZE_M": 16}, {"BLOCK_SIZE_M": 64}
    tune_files.merge_into(path, {1: tuned}, [256, 4096], lambda M: dict(sglang, M=M))
    assert json.loads(path.read_text()) == {"1": tuned, "256": dict(sglang, M=256), "4096": dict(sglang, M=4096)}
    # a later run tunes 256 and 4: the tuned entry replaces the anchor, the others stay
    tune_files.merge_into(path, {4: tuned, 256: tuned}, [256, 4096], lambda M: sglang)
    assert json.loads(path.read_text()) == {"1": tuned, "4": tuned, "256": tuned, "4096": dict(sglang, M=4096)}
    assert list(json.loads(path.read_text())) == ["1", "4", "256", "4096"]  # sorted by batch


def test_the_fastest_correct_launch_wins(monkeypatch):
    """tuning.fastest_launch: a wrong launch and one that fails to build are skipped, however fast; SGLang's
    own launch stays unless a correct one beats it."""
    import types

    import torch

    want = torch.ones(4)
    outputs = {"right": want + 1e-4, "wrong": want * 2, "slow": want}
    times = {"right": 1.0, "wrong": 0.1, "slow": 5.0, "broken": 0.1}

    def run(launch):
        if launch == "broken":
            raise RuntimeError("no build")
        return outputs[launch]

    monkeypatch.setitem(sys.modules, "bench_kernels", types.SimpleNamespace(
        bench=lambda fn, rep: times[next(k for k, v in outputs.items() if fn() is v)]))
    assert tune_files.fastest_launch(run, ["wrong", "broken", "slow", "right"], (2.0, "own"), want, 1e-2, "x") \
        == (1.0, "right")
    assert tune_files.fastest_launch(run, ["wrong", "broken", "slow"], (2.0, "own"), want, 1e-2, "x") == (2.0, "own")
