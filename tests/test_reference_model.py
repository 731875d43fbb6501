"""The plain-PyTorch reference equals transformers' GlmMoeDsaForCausalLM; its MTP draft round behaves as stated."""

from pathlib import Path

import pytest
import torch

from sglang_glm_tools.checkpoint import build_config, make_tiny_checkpoint, write_checkpoint
from sglang_glm_tools.reference import (
    DsaConfig,
    GlmDsaForCausalLM,
    accepted_length,
    draft_round,
    greedy_continuation,
    load_reference_model,
    reference_draft_round,
    select_topk,
)
from sglang_glm_tools.reference import layers as ref_layers

PLANS = {
    "all_full": ["full"] * 4,
    "shared": ["full", "shared", "shared", "full"],
}


@pytest.fixture(scope="module", params=sorted(PLANS))
def ckpt(request, tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp(request.param),
                                config_overrides={"indexer_types": PLANS[request.param]})


@pytest.fixture(scope="module")
def hf_model(ckpt):
    from transformers import GlmMoeDsaForCausalLM

    return GlmMoeDsaForCausalLM.from_pretrained(ckpt).eval()


def prompts(batch=2, length=48, seed=0):
    return torch.randint(1, 512, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_logits_match_transformers_float32(ckpt, hf_model):
    ids = prompts()
    assert ids.shape[1] > DsaConfig.from_pretrained(ckpt).index_topk
    ref = load_reference_model(ckpt, torch.float32)
    want, got = hf_model(ids).logits, ref(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # teeth: the same prompt with dense attention gives other logits, so the top-k mattered
    assert (ref(ids, dense=True).logits - want).abs().max() > 1e-3


@torch.no_grad()
def test_float64_reference_close_to_transformers(ckpt, hf_model):
    ids = prompts(seed=1)
    got = load_reference_model(ckpt, torch.float64)(ids).logits
    torch.testing.assert_close(got, hf_model(ids).logits.double(), rtol=0, atol=1e-5)


@torch.no_grad()
def test_greedy_tokens_equal_transformers_generate(ckpt, hf_model):
    ids = prompts(batch=1, length=30, seed=2)
    want = hf_model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = greedy_continuation(load_reference_model(ckpt, torch.float32), ids, 12)
    assert torch.equal(got, want[:, ids.shape[1]:])


def test_topk_tie_rule_prefers_lower_position():
    scores = torch.tensor([[[1.0, 3.0, 3.0, 2.0, 3.0]]])
    causal = torch.ones(1, 1, 5, dtype=torch.bool)
    assert select_topk(scores, causal, 2)[0, 0].tolist() == [False, True, True, False, False]
    causal[..., 1] = False
    assert select_topk(scores, causal, 2)[0, 0].tolist() == [False, False, True, False, True]


def test_shared_layers_own_no_indexer(ckpt):
    ref = load_reference_model(ckpt, torch.float32)
    plan = list(ref.cfg.indexer_types) + ["full"]
    for layer, kind in zip(ref.model.layers, plan):
        assert hasattr(layer.self_attn, "indexer") == (kind == "full")


def test_hub_state_dict_roundtrip_loads_in_transformers(ckpt, tmp_path):
    from transformers import GlmMoeDsaForCausalLM

    ref = load_reference_model(ckpt, torch.float32)
    cfg = build_config(base=ref.cfg.to_hf_dict(), mtp=True)
    out = write_checkpoint(tmp_path / "copy", cfg, ref.hub_state_dict())
    again = load_reference_model(out, torch.float32)
    ids = prompts(seed=3)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, ref(ids).logits)
        hf = GlmMoeDsaForCausalLM.from_pretrained(out).eval()
        torch.testing.assert_close(hf(ids).logits, ref(ids).logits, rtol=0, atol=2e-5)


# ---------------------------------------------------------------- MTP


@pytest.fixture(scope="module")
def ref64(ckpt):
    return load_reference_model(ckpt, torch.float64)


@torch.no_grad()
def test_draft_step0_is_the_mtp_layer_on_shifted_tokens(ref64):
    ids = prompts(seed=4)
    nxt, dr = reference_draft_round(ref64, ids, 3)
    target = ref64(ids)
    full = torch.cat([ids, nxt], 1)
    n = ids.shape[1]
    mtp = ref64.mtp_forward(full[:, 1:], target.hidden, torch.arange(n).expand(2, n))
    assert torch.equal(dr.logits[:, 0], mtp.logits[:, -1])
    assert torch.equal(dr.tokens, dr.logits.argmax(-1))
    assert dr.tokens.shape == (2, 3) and dr.logits.shape == (2, 3, ref64.cfg.vocab_size)


@torch.no_grad()
def test_index_share_runs_no_indexer_after_step0(ref64, monkeypatch):
    calls = []
    original = ref_layers.Indexer.forward
    monkeypatch.setattr(ref_layers.Indexer, "forward", lambda self, *a: calls.append(1) or original(self, *a))
    ids = prompts(seed=5)
    target = ref64(ids)
    full = torch.cat([ids, target.logits[:, -1:].argmax(-1)], 1)
    calls.clear()
    draft_round(ref64, full, target.hidden, 5, index_share=True)
    assert len(calls) == 1
    calls.clear()
    draft_round(ref64, full, target.hidden, 5, index_share=False)
    assert len(calls) == 5


@torch.no_grad()
def test_carry_and_share_switches_change_only_later_steps(ref64):
    ids = prompts(length=40, seed=6)
    _, post = reference_draft_round(ref64, ids, 4, post_norm_carry=True)
    _, pre = reference_draft_round(ref64, ids, 4, post_norm_carry=False)
    _, unshared = reference_draft_round(ref64, ids, 4, index_share=False)
    assert torch.equal(post.logits[:, 0], pre.logits[:, 0])
    assert torch.equal(post.logits[:, 0], unshared.logits[:, 0])
    assert (post.logits[:, 1] - pre.logits[:, 1]).abs().max() > 1e-6
    assert (post.logits[:, 1] - unshared.logits[:, 1]).abs().max() > 1e-9


def test_accepted_length_counts_leading_matches():
    drafts = torch.tensor([[1, 2, 3], [1, 9, 3], [7, 2, 3]])
    target = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    assert accepted_length(drafts, target).tolist() == [3, 1, 0]


def test_mtp_trainable_in_float32():
    cfg = DsaConfig.from_dict(build_config({"num_hidden_layers": 2}).to_dict() | {"num_nextn_predict_layers": 1})
    model = GlmDsaForCausalLM(cfg)
    ids = prompts(length=24)
    out = model(ids, distill=True)
    mtp = model.mtp_forward(ids, out.hidden, torch.arange(24).expand(2, 24), distill=True)
    (out.logits.logsumexp(-1).mean() + mtp.logits.mean() + out.indexer_kl + mtp.indexer_kl).backward()
    assert model.model.layers[0].self_attn.indexer.wq_b.weight.grad is not None
    assert model.mtp_layer.eh_proj.weight.grad is not None


# ---------------------------------------------------------------- the committed trained model

ROOT = Path(__file__).resolve().parent.parent
GLM_DSA_MINI = ROOT / "assets/glm-dsa-mini"


@torch.no_grad()
def test_glm_dsa_mini_greedy_equals_transformers():
    from transformers import AutoTokenizer, GlmMoeDsaForCausalLM

    cfg = DsaConfig.from_pretrained(GLM_DSA_MINI)
    assert set(cfg.indexer_types) == {"full"} and cfg.num_hidden_layers >= 8 and cfg.num_nextn_predict_layers == 1
    tok = AutoTokenizer.from_pretrained(GLM_DSA_MINI)
    text = (ROOT / "benchmarks/train/data/heldout.txt").read_text()[:4000]
    ids = tok(text, return_tensors="pt").input_ids[:, :96]
    assert ids.shape[1] > cfg.index_topk
    ref = load_reference_model(GLM_DSA_MINI, torch.float32)
    hf = GlmMoeDsaForCausalLM.from_pretrained(GLM_DSA_MINI, dtype=torch.float32).eval()
    want = hf.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(greedy_continuation(ref, ids, 8), want[:, ids.shape[1]:])
    _, draft = reference_draft_round(ref, ids, 3)
    assert draft.tokens.shape == (1, 3)


def test_fp8_group_rounding_is_the_nearest_e4m3_value():
    """Each value lands on the e4m3 grid point nearest to it in its group's scale (brute force over all 256 codes)."""
    x = torch.randn(3, 256, dtype=torch.float64) * torch.logspace(-4, 2, 256, dtype=torch.float64)
    rounded = ref_layers.fp8_group_rounded(x, 128)
    amax = x.unflatten(-1, (2, 128)).abs().amax(-1, keepdim=True)
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    grid = grid[grid.isfinite()]
    scaled = (x.unflatten(-1, (2, 128)) * (448.0 / amax)).unsqueeze(-1)
    nearest = grid[(scaled - grid).abs().argmin(-1)]
    assert torch.equal(rounded, (nearest * (amax * (1 / 448.0))).flatten(-2))
    assert not torch.equal(rounded, x)


def test_fp8_activation_rounding_reaches_exactly_the_served_fp8_gemms(tmp_path):
    """The GPU suite's reference for an FP8 checkpoint: every FP8 linear but kv_b_proj (absorbed into BF16
    weights by the server) reads e4m3-rounded inputs, routed experts through their MoE; nothing else does."""
    dims = dict(hidden_size=256, q_lora_rank=128, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=64,
                v_head_dim=128, num_attention_heads=2, num_key_value_heads=2, index_head_dim=128,
                intermediate_size=256, moe_intermediate_size=128, indexer_types=["full", "shared", "full", "shared"])
    path = make_tiny_checkpoint(tmp_path / "fp8", config_overrides=dims, fp8=True)
    plain = load_reference_model(path)
    rounded = load_reference_model(path, fp8_activations=True)
    hooked = {n for n, m in rounded.named_modules() if isinstance(m, torch.nn.Linear) and m._forward_pre_hooks}
    moes = {n for n, m in rounded.named_modules() if isinstance(m, ref_layers.MoE) and m.fp8_group == 128}
    from safetensors.torch import load_file

    fp8 = {k.removesuffix(".weight_scale_inv") for k in load_file(str(path / "model.safetensors"))
           if k.endswith(".weight_scale_inv")}
    assert hooked == {n for n in fp8 if ".experts." not in n and not n.endswith("kv_b_proj")}
    assert moes == {n.split(".experts.")[0] for n in fp8 if ".experts." in n} and moes
    assert not any(n.endswith(("weights_proj", "eh_proj", "lm_head", "mlp.gate")) for n in hooked)
    # the GPU suite's margin follows this flag
    assert plain.fp8_weights and rounded.fp8_weights
    assert not load_reference_model(make_tiny_checkpoint(tmp_path / "bf16", config_overrides=dims)).fp8_weights
    with torch.no_grad():
        a, b = plain(prompts(1, 24)).logits, rounded(prompts(1, 24)).logits
    assert not torch.equal(a, b) and (a - b).abs().mean() < 0.25 * a.abs().mean()  # 3 mantissa bits a GEMM input
