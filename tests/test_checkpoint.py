"""The tiny-checkpoint writer: hub layout, plan-aware indexer tensors, MTP layer, FP8, transformers loads it."""

import json

import pytest
import torch
from safetensors.torch import load_file

from sglang_glm_tools.checkpoint import (
    FP8_BLOCK,
    dequantize_fp8_block,
    dequantized_state_dict,
    make_tiny_checkpoint,
    quantize_fp8_block,
    write_dequantized_twin,
)

PLAN = ["full", "shared", "full", "shared"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), config_overrides={"indexer_types": PLAN})


@pytest.fixture(scope="module")
def tensors(ckpt):
    return load_file(str(ckpt / "model.safetensors"))


def test_config_carries_the_published_fields_sglangs_own_path_reads(ckpt):
    """SGLang's own GLM-DSA model (issue 30's peer) raises without the routing fields and silently
    runs its indexer RoPE half-split without indexer_rope_interleave (found on the H200 and on CPU)."""
    from transformers import AutoConfig

    written = json.loads((ckpt / "config.json").read_text())
    assert {k: written.get(k) for k in ("moe_layer_freq", "topk_method", "scoring_func")} == {
        "moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
    loaded = AutoConfig.from_pretrained(str(ckpt))
    assert loaded.indexer_rope_interleave is True and loaded.rope_interleave is True


def test_experts_stored_per_expert(ckpt, tensors):
    cfg = json.loads((ckpt / "config.json").read_text())
    for i in range(cfg["first_k_dense_replace"], cfg["num_hidden_layers"] + 1):
        for e in range(cfg["n_routed_experts"]):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"model.layers.{i}.mlp.experts.{e}.{proj}.weight" in tensors
        assert f"model.layers.{i}.mlp.shared_experts.gate_proj.weight" in tensors
        assert f"model.layers.{i}.mlp.gate.e_score_correction_bias" in tensors
    assert not any("gate_up_proj" in k for k in tensors)


def test_indexer_tensors_only_on_full_layers_and_mtp(tensors):
    for i, kind in enumerate(PLAN + ["full"]):
        has = any(k.startswith(f"model.layers.{i}.self_attn.indexer.") for k in tensors)
        assert has == (kind == "full"), i


def test_mtp_layer_tensors(ckpt, tensors):
    cfg = json.loads((ckpt / "config.json").read_text())
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    assert cfg["num_nextn_predict_layers"] == 1
    p = f"model.layers.{n}"
    assert tensors[f"{p}.eh_proj.weight"].shape == (h, 2 * h)
    for norm in ("enorm", "hnorm", "shared_head.norm", "input_layernorm", "post_attention_layernorm"):
        assert tensors[f"{p}.{norm}.weight"].shape == (h,)
    assert torch.equal(tensors[f"{p}.shared_head.head.weight"], tensors["lm_head.weight"])
    assert torch.equal(tensors[f"{p}.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    assert tensors[f"{p}.self_attn.indexer.wq_b.weight"].shape[0] == cfg["index_n_heads"] * cfg["index_head_dim"]
    assert f"{p}.mlp.experts.0.gate_proj.weight" in tensors
    assert not any(k.startswith(f"model.layers.{n + 1}.") for k in tensors)


def test_no_mtp_variant(tmp_path):
    path = make_tiny_checkpoint(tmp_path, mtp=False, tokenizer=None)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 0
    assert not any(k.startswith(f"model.layers.{cfg['num_hidden_layers']}.") for k in load_file(str(path / "model.safetensors")))


def test_transformers_loads_and_generates_varied_tokens(ckpt):
    from transformers import AutoTokenizer, GlmMoeDsaForCausalLM

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = GlmMoeDsaForCausalLM.from_pretrained(ckpt).eval()
    ids = tok("def parse(self, text):\n    return text.split()\n", return_tensors="pt").input_ids
    assert ids.shape[1] > 16  # longer than index_topk: sparsity is active
    out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    new = out[0, ids.shape[1]:].tolist()
    assert len(set(new)) > 4, new
    assert len(tok) <= model.config.vocab_size


def test_fp8_block_roundtrip_within_e4m3_error():
    w = torch.randn(300, 200) * torch.logspace(-3, 0, 200)
    q, scale = quantize_fp8_block(w)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 2)
    back = dequantize_fp8_block(q, scale)
    block_scale = scale.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:300, :200]
    # e4m3: 3 mantissa bits (relative half-ulp 2^-4); subnormal floor 2^-9 times the block scale
    assert torch.all((back - w).abs() <= w.abs() * 2**-4 + block_scale * 2**-9 + 1e-12)


def test_fp8_checkpoint_and_dequantized_twin(tmp_path, tensors):
    fp8 = make_tiny_checkpoint(tmp_path / "fp8", config_overrides={"indexer_types": PLAN}, fp8=True)
    cfg = json.loads((fp8 / "config.json").read_text())
    q = cfg["quantization_config"]
    assert q["quant_method"] == "fp8" and q["weight_block_size"] == [128, 128] and q["fmt"] == "e4m3"
    raw = load_file(str(fp8 / "model.safetensors"))
    assert raw["model.layers.1.self_attn.q_b_proj.weight"].dtype == torch.float8_e4m3fn
    assert "model.layers.1.self_attn.q_b_proj.weight_scale_inv" in raw
    n = cfg["num_hidden_layers"]
    for kept in ("lm_head.weight", "model.layers.1.mlp.gate.weight", "model.layers.0.self_attn.indexer.weights_proj.weight",
                 f"model.layers.{n}.eh_proj.weight", f"model.layers.{n}.enorm.weight"):
        assert raw[kept].dtype == torch.float32, kept
        assert kept.rsplit(".", 1)[0] + ".weight_scale_inv" not in raw
    deq = dequantized_state_dict(fp8)
    assert deq.keys() == tensors.keys()
    for k, w in tensors.items():
        assert torch.allclose(deq[k], w, rtol=2**-4, atol=1e-4), k

    from transformers import GlmMoeDsaForCausalLM

    twin = write_dequantized_twin(fp8, tmp_path / "twin")
    assert "quantization_config" not in json.loads((twin / "config.json").read_text())
    model = GlmMoeDsaForCausalLM.from_pretrained(twin).eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(40)[None]).logits).all()
