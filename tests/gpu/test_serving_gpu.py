"""The plugin inside real SGLang 0.5.23 on a CUDA GPU, over HTTP (`sglang.launch_server`).

Each test starts its own server (they run side by side on one GPU under pytest-xdist), serves a
batch of ragged prompts longer than index_topk, a chunked long prompt and a radix-cache repeat,
and judges the bfloat16 tokens (the repeat's too) against the float64 reference with the margin rule
(gpu_serving.py). Controls show the rule can fail: a changed plan, sparsity removed.
"""

import pytest
import requests
import torch

from gpu_serving import (CHAIN, PROMPTS, TREE, agreement, assert_per_position_acceptance, generate, gpu_server, make_model,
                          record, results_dir, serve_and_judge)

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize(
    "name, args",
    [
        # No --attention-backend: the plugin's CUDA default (glm_dsa_triton) with CUDA graphs on.
        ("triton_graphs", ()),
        ("triton_eager", ("--attention-backend", "glm_dsa_triton", "--disable-cuda-graph")),
        ("triton_mixed_chunk", ("--attention-backend", "glm_dsa_triton", "--enable-mixed-chunk")),
        ("torch_eager", ("--attention-backend", "glm_dsa_torch", "--disable-cuda-graph")),
        ("triton_fp8_kv", ("--kv-cache-dtype", "fp8_e4m3")),
    ],
)
def test_served_tokens_agree_with_reference(models, name, args):
    with gpu_server(models["glm52"], name, *args) as url:
        info = requests.get(url + "/get_server_info", timeout=30).json()
        backend = info.get("attention_backend")
        got, result, _ = serve_and_judge(url, models["glm52"], name)
    record(name + "_tokens", tokens=got, attention_backend=backend)
    if name == "triton_graphs":
        assert backend == "glm_dsa_triton", info
    result.assert_agrees()


@pytest.mark.parametrize("name, args", [("triton_64_heads", ()), ("triton_64_heads_fp8_kv", ("--kv-cache-dtype", "fp8_e4m3"))])
def test_64_heads_served_by_the_warp_specialized_kernel(models, name, args):
    """64 heads per rank: on Hopper the Triton backend runs sparse MLA in the SM90 Gluon kernel
    (sparse_mla_sm90.py), BF16 KV or FP8 KV (its producer dequantizes); its tokens are judged by
    the same rule, CUDA graphs on."""
    from glm_dsa_kernels.sparse_mla import default_config, warp_specialized_available

    if not warp_specialized_available("cuda"):
        pytest.skip("the warp-specialized kernel needs an SM90 GPU and Triton with Gluon")
    assert default_config(16, 64, 128, bool(args), 132, warp_specialized=True).warp_specialized
    with gpu_server(models["glm52_64h"], name, *args) as url:
        _, result, _ = serve_and_judge(url, models["glm52_64h"], name)
    result.assert_agrees()


def test_triton_backend_refuses_other_geometries_at_launch(models):
    """A model outside the Triton kernels' geometry (the bundled model's: latent 48, rope 32, indexer
    8 x 48) once stopped the H200 scheduler at its first forward on a bare kernel assert; the default
    CUDA launch must refuse it naming each field, its value and the fix."""
    mini = make_model(models["glm52"].parent, "mini_geometry", seed=5, overrides=dict(
        kv_lora_rank=48, qk_rope_head_dim=32, index_n_heads=8, index_head_dim=48))
    with pytest.raises(RuntimeError, match="server exited"):
        with gpu_server(mini, "triton_other_geometry"):
            pass
    log = (results_dir() / "server_triton_other_geometry.log").read_text()
    for text in ("kv_lora_rank=48", "qk_rope_head_dim=32", "index_n_heads=8", "index_head_dim=48",
                 "kv_lora_rank=512", "--attention-backend glm_dsa_torch"):
        assert text in log, (text, log[-3000:])


def test_fp8_block_weights_served_through_sglang_fp8_linear(models):
    """The FP8 block-quantized checkpoint (128 x 128 e4m3 blocks) against its dequantized float64 reference,
    whose FP8 linears round their inputs to e4m3 as SGLang's GEMMs do (checked here against its own quantizer)."""
    from sglang.kernels.ops.quantization.fp8_kernel import per_token_group_quant_fp8

    from sglang_glm_tools.reference.layers import fp8_group_rounded

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(64, 512, device="cuda", generator=g) * torch.logspace(-3, 2, 512, device="cuda")).bfloat16()
    codes, scales = per_token_group_quant_fp8(x, 128)
    sglang = (codes.float().unflatten(-1, (4, 128)) * scales.unsqueeze(-1)).flatten(-2)
    ours = fp8_group_rounded(x.float(), 128)
    flipped = ((sglang - ours).abs() > 1e-6 * sglang.abs()).sum().item()  # another e4m3 code, not a last-bit scale
    record("fp8_activation_rounding", flipped=flipped, inexact=(sglang != ours).sum().item(), elements=x.numel())
    assert flipped <= x.numel() // 1000, flipped  # session 28, H100, before the formula matched: 29 inexact
    path = models["glm52_fp8"]
    with gpu_server(path, "fp8_weights") as url:
        _, result, _ = serve_and_judge(url, path, "fp8_weights")
    log = (results_dir() / "server_fp8_weights.log").read_text()
    assert "type=GlmMoeDsaForCausalLM, quant=fp8" in log, "SGLang did not load the checkpoint as FP8"
    result.assert_agrees()


def test_tuned_gemm_and_moe_configs_reach_sglang(models):
    """Launch configs the plugin ships for a shape (sglang_glm/gemm_configs/ and moe_configs/, hooks/gemm.py
    and hooks/moe.py) reach SGLang's block-FP8 GEMM and fused MoE kernel in a GLM-DSA server: SGLang's Hopper
    GEMM with swapped, split-K tiles at batch 1 and plain tiles at 64 for every linear of a 384-wide FP8
    checkpoint (a width no other test serves), 16- and 32-row token tiles for its routed experts, its log
    names each file, and the tokens still agree with the float64 reference."""
    import json
    import sys
    from pathlib import Path

    import sglang_glm
    import torch
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_config_file_name

    from sglang_glm.hooks.gemm import config_file_name

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"))
    from tune_fp8_gemm import linear_shapes
    from tune_fused_moe import expert_shapes

    path = models["glm52_fp8_h384"]
    cfg = json.loads((path / "config.json").read_text())
    launches = {"1": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4,
                          num_stages=4, SWAP_AB=True, SPLIT_K=2),
                "64": dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4,
                           num_stages=3)}
    moe_launches = {"1": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4,
                              num_stages=4),
                    "64": dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=128, BLOCK_SIZE_K=128, GROUP_SIZE_M=1, num_warps=4,
                               num_stages=3)}
    plugin = Path(sglang_glm.__file__).parent  # the installed plugin the servers import
    files = {linear: config_file_name(n, k, torch.cuda.get_device_name(), 128, 128)
             for linear, (n, k) in linear_shapes(cfg, 1).items() if 384 in (n, k)}
    names = set(files.values())
    # SGLang may fuse the shared expert into its MoE kernel; every other linear is a block-FP8 GEMM
    required = {name for linear, name in files.items() if not linear.startswith("shared expert")}
    E, N, _, _ = expert_shapes(cfg, 1)
    moe_name = get_config_file_name(E, N, "fp8_w8a8", [128, 128])
    written = [plugin / "gemm_configs" / name for name in names] + [plugin / "moe_configs" / moe_name]
    try:
        for name in names:
            (plugin / "gemm_configs" / name).write_text(json.dumps(launches))
        (plugin / "moe_configs").mkdir(exist_ok=True)
        (plugin / "moe_configs" / moe_name).write_text(json.dumps(moe_launches))
        with gpu_server(path, "tuned_gemm") as url:
            _, result, _ = serve_and_judge(url, path, "tuned_gemm")
    finally:
        for file in written:
            file.unlink(missing_ok=True)
    log = (results_dir() / "server_tuned_gemm.log").read_text()
    used = {name for name in names if f"block-FP8 GEMM {name}: the plugin's tuned launch configs" in log}
    moe_used = f"fused MoE {moe_name}: the plugin's tuned launch configs" in log
    record("tuned_gemm_files", used=sorted(used), shipped=sorted(names), moe_file=moe_name, moe_used=moe_used)
    assert required <= used, sorted(required - used)
    assert moe_used, (moe_name, [line for line in log.splitlines() if "MoE" in line][-5:])
    result.assert_agrees()


SHARE_OFF = ("--json-model-override-args", '{"index_share_for_mtp_iteration": false}')


@pytest.mark.parametrize(
    "name, args",
    [
        ("mtp_chain_share_on", CHAIN),
        ("mtp_chain_share_off", CHAIN + SHARE_OFF),
        ("mtp_chain_no_overlap", CHAIN + ("--disable-overlap-schedule",)),
        ("mtp_tree_share_on", TREE),
        ("mtp_tree_share_off", TREE + SHARE_OFF),
        ("mtp_tree_torch", TREE + ("--attention-backend", "glm_dsa_torch", "--disable-cuda-graph")),
        # what SGLang does by itself for GLM-5.2's 256 routed experts (this model has 8)
        ("mtp_chain_fused_shared_expert", CHAIN + ("--enforce-shared-experts-fusion",)),
    ],
)
def test_mtp_lossless_with_acceptance(models, name, args):
    """EAGLE with the MTP layer (chains and trees; trees run with page size 1; SGLang's overlap
    scheduler on, its default, and off; the shared expert fused into the routed experts' kernel):
    verified tokens agree with the reference, and acceptance is reported per request, per draft
    position too (meta_info and Prometheus)."""
    with gpu_server(models["glm52"], name, *args, "--enable-metrics") as url:
        got, result, outs = serve_and_judge(url, models["glm52"], name)
        metrics = requests.get(url + "/metrics", timeout=30).text
    if "--enforce-shared-experts-fusion" in args:
        log = (results_dir() / f"server_{name}.log").read_text(errors="replace")
        for model in ("GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN"):
            assert f"{model} runs each MoE layer's shared expert as routed expert 8 " in log, model
    accept = [o["meta_info"].get("spec_accept_length") for o in outs]
    per_position = [o["meta_info"].get("spec_accept_per_position") for o in outs]
    record(name + "_acceptance", spec_accept_length=accept, spec_accept_per_position=per_position)
    result.assert_agrees()
    assert all(a is not None and a >= 1.0 for a in accept), accept
    assert_per_position_acceptance(outs, args)
    assert "sglang_glm:spec_verify_rounds_total" in metrics


def test_mtp_sampled_requests_are_served(models):
    """temperature > 0 with MTP on: verified by SGLang's GPU rejection sampler, not refused."""
    with gpu_server(models["glm52"], "mtp_sampled", *CHAIN, "--speculative-use-rejection-sampling") as url:
        outs = generate(url, PROMPTS, temperature=0.8, top_p=1.0)
        greedy = generate(url, PROMPTS[:1])
        health = requests.get(url + "/health", timeout=30).status_code
    record("mtp_sampled", lengths=[len(o["output_ids"]) for o in outs],
           spec_accept_length=[o["meta_info"].get("spec_accept_length") for o in outs])
    assert all(len(o["output_ids"]) > 0 for o in outs) and health == 200
    assert len(greedy[0]["output_ids"]) > 0


def test_control_changed_plan_is_rejected(models):
    """An all-full checkpoint served with a plan that shares three layers must fail the rule."""
    path = models["all_full"]
    with gpu_server(path, "control_plan", "--json-model-override-args", '{"index_topk_pattern": "FSSS"}') as url:
        outs = generate(url, PROMPTS)
    result = agreement(path, PROMPTS, outs)
    record("control_plan", **result.as_dict())
    with pytest.raises(AssertionError):
        result.assert_agrees()


def test_control_sparsity_removed_is_rejected(models):
    """Served dense (index_topk above every context): the sparse reference rejects it, the dense one accepts it."""
    path = models["glm52"]
    with gpu_server(path, "control_dense", "--json-model-override-args", '{"index_topk": 4096}') as url:
        outs = generate(url, PROMPTS)
    sparse = agreement(path, PROMPTS, outs)
    dense = agreement(path, PROMPTS, outs, dense=True)
    record("control_dense", sparse=sparse.as_dict(), dense=dense.as_dict())
    with pytest.raises(AssertionError):
        sparse.assert_agrees()
    dense.assert_agrees()


@pytest.mark.parametrize("name, spec", [("triton_prefill_graphs", ()), ("triton_prefill_graphs_mtp", CHAIN)])
def test_prefill_under_breakable_cuda_graphs(models, name, spec):
    """`--cuda-graph-backend-prefill breakable` on glm_dsa_triton: prefills replay SGLang's breakable
    graphs (attention and the indexer's store + top-k run eagerly between captured segments, on the
    real rows of the padded batch) and the tokens agree with the reference, the chunked long prompt
    and the radix-cache repeat included, also with MTP (the README's GPU command). No prefill served
    from a graph fails the test."""
    args = ("--cuda-graph-backend-prefill", "breakable", "--cuda-graph-max-bs-prefill", "1024", *spec)
    with gpu_server(models["glm52"], name, *args) as url:
        got, result, _ = serve_and_judge(url, models["glm52"], name)
    served = [line for line in (results_dir() / f"server_{name}.log").read_text().splitlines()
              if "Prefill batch" in line]
    replays = sum("cuda graph: True" in line for line in served)
    record(name + "_prefills", prefills=len(served), graph_replays=replays)
    assert replays > 0, served[-5:]
    result.assert_agrees()
