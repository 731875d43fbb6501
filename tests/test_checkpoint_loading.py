"""Loading GLM-DSA checkpoints into SGLang: IndexCache accounting, FP8, and bad checkpoints.

Each test starts real SGLang (sglang.Engine on CPU) and reads what the scheduler logged.
"""

import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from sglang_glm_tools.checkpoint import make_tiny_checkpoint, write_dequantized_twin
from serving import engine, failed_launch, greedy, hf_greedy

pytestmark = pytest.mark.slow

PLAN = "FFSF"
PROMPTS = [[(7 * i + 3) % 500 + 2 for i in range(40)], [(3 * i + 1) % 500 + 2 for i in range(25)]]


def _indexer_tensors(path, layer):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = [k for k in f.keys() if k.startswith(f"model.layers.{layer}.self_attn.indexer.")]
        return len(names), sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in names)


@pytest.fixture(scope="module")
def ckpt_all_full(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("all_full"), config_overrides={"indexer_types": ["full"] * 4}, seed=4
    )


@pytest.fixture(scope="module")
def ckpt_fp8_all_full(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("fp8"),
        config_overrides={"indexer_types": ["full"] * 4, "q_lora_rank": 128},  # q_a's rows fill whole blocks
        fp8=True,
        seed=5,
    )


def test_shared_layers_own_no_indexer_and_no_index_cache(ckpt_all_full, capfd):
    count, nbytes = _indexer_tensors(ckpt_all_full, 2)
    assert count == 5  # wq_b, wk, k_norm.{weight,bias}, weights_proj
    with engine(
        ckpt_all_full, log_level="info", json_model_override_args={"index_topk_pattern": PLAN}
    ) as llm:
        assert llm.get_weights_by_name("model.layers.2.self_attn.indexer.wq_b.weight") is None
        assert llm.get_weights_by_name("model.layers.1.self_attn.indexer.wq_b.weight") is not None
        assert llm.get_weights_by_name("model.layers.2.self_attn.fused_qkv_a_proj_with_mqa.weight") is not None
    log = capfd.readouterr()
    log = log.out + log.err
    assert f"IndexCache plan (override index_topk_pattern): {PLAN}" in log
    assert (
        f"IndexCache: skipped {count} indexer tensors ({nbytes} bytes, FP8 scales included) "
        f"of 1 shared layers [2]" in log
    )
    assert "Index-K cache: 3 full layers" in log
    assert "1 shared layers hold none" in log


def test_fp8_checkpoint_accounting_and_dequantized_twin(ckpt_fp8_all_full, tmp_path):
    count, nbytes = _indexer_tensors(ckpt_fp8_all_full, 2)
    assert count == 7  # FP8 wq_b and wk carry weight_scale_inv
    # SGLang's FP8 block-linear path needs bf16 activations and, on CPU, AMX; this machine has
    # none, so serving stops after the plugin has loaded every tensor. Pin exactly that.
    log = failed_launch(
        ckpt_fp8_all_full, "--dtype", "bfloat16", "--log-level", "info",
        "--json-model-override-args", json.dumps({"index_topk_pattern": PLAN}),
    )
    assert (
        f"IndexCache: skipped {count} indexer tensors ({nbytes} bytes, FP8 scales included) "
        f"of 1 shared layers [2]" in log
    )
    assert "Fp8LinearMethod on CPU requires that CPU has AMX support" in log

    # The same checkpoint, dequantized, serves token-exact against transformers.
    twin = write_dequantized_twin(ckpt_fp8_all_full, tmp_path / "twin")
    shared = ["full" if c == "F" else "shared" for c in PLAN]
    want = hf_greedy(twin, PROMPTS, 10, indexer_types=shared)
    with engine(twin, json_model_override_args={"index_topk_pattern": PLAN}) as llm:
        assert greedy(llm, PROMPTS, 10) == want


def test_fp8_blocks_that_q_a_and_kv_a_cannot_share_fail(tmp_path):
    """q_a_proj and kv_a_proj_with_mqa run as one block-quantized GEMM: with q_lora_rank off the block
    grid their scales cannot stack, and start-up says so instead of serving misaligned scales."""
    ckpt = make_tiny_checkpoint(tmp_path / "fp8", config_overrides={"q_lora_rank": 64}, fp8=True, mtp=False)
    log = failed_launch(ckpt, "--dtype", "bfloat16")
    assert "q_lora_rank = 64 with weight_block_size [128, 128]" in log, log[-3000:]


def test_q_a_and_kv_a_share_a_gemm_only_where_their_scales_stack():
    """Unquantized, block FP8 on the block grid, and FP8 quantized after loading stack two checkpoint tensors'
    rows; a per-tensor FP8 scale each, or a block grid q_a's rows do not fill, would not: refused by name."""
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.quantization.w8a8_int8 import W8A8Int8Config

    from sglang_glm.models.attention import check_fusable_a_proj

    for ok in (None, Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128]), Fp8Config()):
        check_fusable_a_proj(2048, ok)
    with pytest.raises(ValueError, match="q_lora_rank = 1000 with weight_block_size"):
        check_fusable_a_proj(1000, Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128]))
    with pytest.raises(ValueError, match="quantization 'fp8' without weight_block_size"):
        check_fusable_a_proj(2048, Fp8Config(is_checkpoint_fp8_serialized=True))
    with pytest.raises(ValueError, match="quantization 'w8a8_int8'"):
        check_fusable_a_proj(2048, W8A8Int8Config({}))


def test_q_a_and_kv_a_rows_and_block_scales_stack_in_either_order():
    """The fused projection's weight is q_a's rows over kv_a's, and so is its block-scale grid: dequantized,
    it equals the two checkpoint tensors dequantized and stacked (kv_a arriving first waits for q_a)."""
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang_glm_tools.checkpoint import dequantize_fp8_block, quantize_fp8_block

    from sglang_glm.models.weights import TensorLoader, dequantized_weight

    torch.manual_seed(0)
    fused = "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa"
    linear = ReplicatedLinear(256, 128 + 80, bias=False, prefix=fused,
                              quant_config=Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128]))
    params = {f"{fused}.{n}": p for n, p in linear.named_parameters()}
    parts = {name: quantize_fp8_block(torch.randn(rows, 256)) for name, rows in (("q_a_proj", 128),
                                                                              ("kv_a_proj_with_mqa", 80))}
    loader = TensorLoader(params, [], "test")
    for name in ("kv_a_proj_with_mqa", "q_a_proj"):
        if name == "q_a_proj":
            assert loader.unloaded(params) == [f"model.layers.0.self_attn.q_a_proj.{t}" for t in ("weight",
                                                                                              "weight_scale_inv")]
        for tensor, suffix in zip(parts[name], ("weight", "weight_scale_inv")):
            loader.load(f"model.layers.0.self_attn.{name}.{suffix}", tensor)
    assert loader.unloaded(params) == []
    want = torch.cat([dequantize_fp8_block(*parts[name]) for name in ("q_a_proj", "kv_a_proj_with_mqa")])
    assert torch.equal(dequantized_weight(linear), want)


def test_full_layer_missing_indexer_tensors_fails(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", config_overrides={"index_topk_pattern": PLAN})
    log = failed_launch(ckpt, "--json-model-override-args", '{"index_topk_pattern": "FFFF"}')
    assert re.search(r"full layers \[2\] need indexer tensors the checkpoint lacks", log)
    assert "model.layers.2.self_attn.indexer.wq_b.weight" in log


@pytest.mark.parametrize(
    "extra, message",
    [
        ("model.layers.1.self_attn.mystery.weight", "has no parameter in GlmMoeDsaForCausalLM"),
        ("model.layers.9.mlp.gate.weight", "belongs to layer 9, but the config has num_hidden_layers = 4"),
    ],
)
def test_unknown_tensors_fail(tmp_path, extra, message):
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", mtp=False)
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors[extra] = torch.zeros(4)
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    log = failed_launch(ckpt)
    assert extra in log and message in log


@pytest.mark.parametrize("dropped", ["model.layers.1.self_attn.q_a_proj.weight",  # kv_a's rows wait for it
                                     "model.layers.3.self_attn.kv_a_proj_with_mqa.weight", "lm_head.weight",
                                     "model.layers.2.mlp.experts.3.down_proj.weight"])
def test_missing_tensors_fail(tmp_path, dropped):
    """A parameter the checkpoint does not fill would serve its initial values; loading stops instead.
    One routed expert's tensor counts too: SGLang stacks a layer's experts into one parameter."""
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", mtp=False)
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors[dropped]
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    log = failed_launch(ckpt)
    assert "the checkpoint lacks 1 tensors this model needs" in log and dropped in log, log[-3000:]


EAGLE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "2")


@pytest.mark.parametrize("dropped, message", [
    ("model.layers.4.", "the checkpoint has no MTP layer (no tensors under model.layers.4.*"),
    ("model.layers.4.mlp.experts.1.up_proj.weight", "the checkpoint's MTP layer (model.layers.4.*) lacks 1 tensors"),
], ids=["whole_layer", "one_expert"])
def test_mtp_layer_missing_tensors_fails(tmp_path, dropped, message):
    """With MTP on, the draft loads the MTP layer: a checkpoint without it, or with one expert tensor missing
    (stacked into a parameter that other experts fill), stops start-up naming what is missing."""
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt")
    tensors = load_file(str(ckpt / "model.safetensors"))
    tensors = {k: v for k, v in tensors.items() if not k.startswith(dropped)}
    save_file(tensors, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    log = failed_launch(ckpt, *EAGLE)
    assert message in log, log[-3000:]
    if dropped.endswith(".weight"):
        assert dropped in log


def test_dummy_load_format_serves_target_and_mtp(tmp_path):
    """`--load-format dummy` (SGLang's benchmarking loader) skips load_weights; the models'
    post_load_weights must still absorb kv_b_proj, for the target and for the MTP draft."""
    ckpt = make_tiny_checkpoint(tmp_path, seed=5)
    with engine(
        ckpt, load_format="dummy", speculative_algorithm="EAGLE", speculative_num_steps=2,
        speculative_eagle_topk=1, speculative_num_draft_tokens=3,
    ) as llm:
        outs = llm.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": 6})
    assert [len(o["output_ids"]) for o in outs] == [6, 6]
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in outs)  # the MTP draft ran


def test_second_mtp_layer_fails(tmp_path):
    """A config with two MTP layers: the second one's tensors would be loaded by nobody."""
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": 2}))
    log = failed_launch(ckpt, *EAGLE)
    assert "num_nextn_predict_layers = 2: the MTP draft serves GLM-5's one MTP layer" in log, log[-3000:]


def test_expert_inventory_checks_each_group_on_its_own_terms():
    """Routed experts must all carry what any of them carries (FP8 scales); a shared expert kept in
    BF16 beside FP8 routed experts is complete; a layer's missing shared expert is named (fused, no
    parameter of its own would show it)."""
    from types import SimpleNamespace

    from sglang_glm.models.weights import ExpertInventory

    inv = ExpertInventory(SimpleNamespace(n_routed_experts=2, n_shared_experts=1))
    for proj in ("gate", "up", "down"):
        for expert in ("experts.0", "experts.1"):
            for kind in ("weight", "weight_scale_inv"):
                if (expert, proj, kind) != ("experts.1", "down", "weight_scale_inv"):
                    inv.see(f"model.layers.3.mlp.{expert}.{proj}_proj.{kind}")
        inv.see(f"model.layers.3.mlp.shared_experts.{proj}_proj.weight")
        inv.see(f"model.layers.4.mlp.experts.0.{proj}_proj.weight")
        inv.see(f"model.layers.4.mlp.experts.1.{proj}_proj.weight")
    inv.see("model.layers.3.mlp.gate.e_score_correction_bias")
    assert inv.missing() == [
        "model.layers.3.mlp.experts.1.down_proj.weight_scale_inv",
        *(f"model.layers.4.mlp.shared_experts.{proj}_proj.weight" for proj in ("gate", "up", "down")),
    ]


RULE = """
from types import SimpleNamespace
from sglang_glm.cpu_compat import activate; activate()
from sglang.srt.runtime_context import get_context
from sglang.srt.server_args import ServerArgs
get_context().set_server_args(ServerArgs(model_path="rule", device="cpu"))
from sglang_glm.models.glm_dsa import GlmMoeDsaForCausalLM
from sglang_glm.models.glm_dsa_nextn import GlmMoeDsaForCausalLMNextN
for cls in (GlmMoeDsaForCausalLM, GlmMoeDsaForCausalLMNextN):
    for routed in (256, 8):
        config = SimpleNamespace(architectures=[cls.__name__], n_routed_experts=routed, n_shared_experts=1)
        print(cls.__name__, routed, cls.shared_experts_fusion_disable_reason(config, None))
"""


def test_sglangs_fusion_rule_reaches_both_classes():
    """SGLang's loader asks each class whether to fuse the shared expert: GLM-5.2's experts (256 routed,
    one shared) under the name SGLang gives each model pass its config gate, and only this machine's
    platform (no CUDA) stops the fusion; 8 routed experts do not pass. A class whose architecture name
    SGLang did not match would never fuse on a GPU, silently."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", RULE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    reasons = {}
    for line in out.stdout.strip().splitlines():
        cls, routed, reason = line.split(" ", 2)
        reasons[cls, int(routed)] = reason
    for cls in ("GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN"):
        assert reasons[cls, 256].startswith("Only Deepseek V3/R1 on NV-platform with capability >= 80"), reasons
        assert reasons[cls, 8] == "Config does not support fused shared expert(s).", reasons
