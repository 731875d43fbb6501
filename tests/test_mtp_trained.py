"""MTP speculative decoding on the trained GLM-DSA mini model, served by real SGLang (EAGLE, CPU).

With the flags users type (`--speculative-algorithm EAGLE --speculative-num-steps 5
--speculative-eagle-topk 1 --speculative-num-draft-tokens 6`), and with a draft tree (topk 3) on a
target plan whose last layers are shared:
- lossless: greedy tokens == transformers' greedy tokens (MTP off == transformers is
  test_serving_engine's subject);
- the drafts themselves: the first round's 5 draft tokens and their logits == the float64
  plain-PyTorch reference MTP round (post-norm carry, shared top-k);
- a request's acceptance in a mixed batch == its acceptance alone;
- acceptance length > 1.5 at 5 steps; per-position acceptance derived from meta_info;
- index share: the MTP indexer runs in every draft-extend pass and in NO draft step >= 1
  (counted from the draft model's trace), and the draft layer owns an indexer even when the
  target's plan marks its last layers shared;
- temperature > 0 is refused on CPU (verification there is greedy only);
- with the shared expert fused into the routed experts' kernel (SGLang's fusion, forced on CPU), the
  target still serves transformers' tokens and the draft the float64 reference's logits.
"""

from pathlib import Path

import pytest
import torch

import mtp_trace
from serving import engine, hf_greedy
from sglang_glm.mtp.acceptance import AcceptanceStats

pytestmark = pytest.mark.slow

MINI = Path(__file__).resolve().parents[1] / "assets" / "glm-dsa-mini"
TEXT = Path(__file__).resolve().parents[1] / "benchmarks" / "train" / "data" / "heldout.txt"
if not MINI.exists():
    pytest.skip(f"trained model not found at {MINI}", allow_module_level=True)

STEPS = 5
NEW_TOKENS = 24
LENGTHS = (52, 41, 33, 26)  # distinct, to match trace rows to prompts
SPEC = dict(speculative_algorithm="EAGLE", speculative_num_steps=STEPS)
SHARED_EXPERT = "model.layers.1.mlp.shared_experts.gate_up_proj.weight"
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS}


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MINI))
    text = TEXT.read_text()
    return [tok(text[i * 9000 : i * 9000 + 600])["input_ids"][:n] for i, n in enumerate(LENGTHS)]


def _stats(outs) -> AcceptanceStats:
    s = AcceptanceStats()
    for o in outs:
        s.add_meta_info(o["meta_info"])
    return s


def _first_round(records, prompts):
    """Per prompt: the 5 draft logits of the first round (prefill draft-extend + 4 draft steps)."""
    first = records[0]
    assert first["kind"] == "extend" and first["extend_seq_lens"] == [len(p) for p in prompts], (
        "the first draft-extend is the prefill of the whole batch"
    )
    steps = records[1:STEPS]
    assert [r["kind"] for r in steps] == ["step"] * (STEPS - 1)
    for r in steps:
        assert torch.equal(r["req_pool_indices"], first["req_pool_indices"])
    return torch.stack([first["logits"]] + [r["logits"] for r in steps], dim=1)  # [B, 5, V]


def test_chain_drafts_match_float64_reference_and_serve_losslessly(prompts, tmp_path, monkeypatch):
    from sglang_glm_tools.reference import load_reference_model, reference_draft_round

    trace_dir = tmp_path / "trace"
    mtp_trace.enable(monkeypatch, trace_dir)
    with engine(MINI, speculative_eagle_topk=1, speculative_num_draft_tokens=STEPS + 1, **SPEC) as llm:
        # SGLang fuses a shared expert only on CUDA: here it is its own MLP (the fused test's control)
        assert llm.get_weights_by_name(SHARED_EXPERT) is not None
        batch = llm.generate(input_ids=prompts, sampling_params=GREEDY)
        records = mtp_trace.load(trace_dir)
        alone = []
        for p in prompts:
            llm.flush_cache()
            alone.append(llm.generate(input_ids=[p], sampling_params=GREEDY)[0])
        with pytest.raises(Exception, match="verifies drafts greedily"):
            llm.generate(input_ids=[prompts[0]], sampling_params={"temperature": 0.7, "max_new_tokens": 4})

    # Lossless.
    assert [o["output_ids"] for o in batch] == hf_greedy(MINI, prompts, NEW_TOKENS)

    # Acceptance: visible per request, > 1.5 at 5 steps, and per request the same in the mixed
    # batch as alone (requests accept different numbers of drafts in the same rounds).
    stats = _stats(batch)
    print("batch acceptance:", stats.as_dict(STEPS))
    assert stats.mean_accept_length > 1.5
    for o in batch:  # per-position acceptance in meta_info: P(>= k drafts accepted in a round)
        per_position = o["meta_info"]["spec_accept_per_position"]
        hist = o["meta_info"]["spec_correct_drafts_histogram"]
        assert len(per_position) == STEPS
        assert per_position == [sum(hist[k:]) / sum(hist) for k in range(1, STEPS + 1)]
    hists = [o["meta_info"]["spec_correct_drafts_histogram"] for o in batch]
    assert len({tuple(h) for h in hists}) > 1, "the batch should mix acceptance patterns"
    for b, a in zip(batch, alone):
        assert a["output_ids"] == b["output_ids"]
        for key in ("spec_verify_ct", "spec_correct_drafts_histogram", "spec_accept_length"):
            assert a["meta_info"][key] == b["meta_info"][key], key

    # Index share: the MTP indexer ran in every draft-extend and in no draft step.
    assert records and all(r["index_share"] and r["recycle"] == "post_norm" for r in records)
    # Rounds: draft-extend (step 0) then STEPS - 1 draft steps; the last verify's draft-extend
    # has no steps after it (every request finished).
    pattern = "".join("E" if r["kind"] == "extend" else "s" for r in records)
    assert pattern == "E" + ("s" * (STEPS - 1) + "E") * (pattern.count("E") - 1), pattern
    assert all(r["ran_indexer"] for r in records if r["kind"] == "extend")
    assert not any(r["ran_indexer"] for r in records if r["kind"] == "step")

    # The drafts themselves: first round == float64 reference round (post-norm, shared top-k).
    got = _first_round(records, prompts).double()
    model = load_reference_model(MINI, dtype=torch.float64)
    for b, p in enumerate(prompts):
        _, ref = reference_draft_round(model, torch.tensor([p]), STEPS, index_share=True, post_norm_carry=True)
        assert torch.equal(got[b].argmax(-1), ref.tokens[0]), f"prompt {b}: draft tokens differ"
        err = (got[b] - ref.logits[0]).abs().max().item()
        assert err < 5e-4, f"prompt {b}: draft logits differ from the float64 reference by {err}"
    # Controls: the pre-norm carry and the unshared top-k give other logits (so the check above
    # can fail); measured ~3e-5 for the match against > 1e-2 for the controls.
    p0 = torch.tensor([prompts[0]])
    _, pre = reference_draft_round(model, p0, STEPS, index_share=True, post_norm_carry=False)
    _, unshared = reference_draft_round(model, p0, STEPS, index_share=False, post_norm_carry=True)
    assert (got[0, 1:] - pre.logits[0, 1:]).abs().max().item() > 1e-2
    assert (got[0, 1:] - unshared.logits[0, 1:]).abs().max().item() > 1e-2


def test_tree_drafts_with_shared_target_plan(prompts, tmp_path, monkeypatch):
    plan = "FFFFFFSS"  # the target's last two layers shared; the MTP layer keeps its own indexer
    trace_dir = tmp_path / "trace"
    mtp_trace.enable(monkeypatch, trace_dir)
    with engine(MINI, speculative_eagle_topk=3, speculative_num_draft_tokens=8,
                json_model_override_args={"index_topk_pattern": plan}, **SPEC) as llm:
        batch = llm.generate(input_ids=prompts, sampling_params=GREEDY)
    records = mtp_trace.load(trace_dir)

    types = ["full" if c == "F" else "shared" for c in plan]
    assert [o["output_ids"] for o in batch] == hf_greedy(MINI, prompts, NEW_TOKENS, indexer_types=types)
    stats = _stats(batch)
    print("tree acceptance:", stats.as_dict(STEPS))
    assert stats.mean_accept_length > 1.5

    assert records and all(r["draft_has_indexer"] for r in records)
    assert all(r["ran_indexer"] for r in records if r["kind"] == "extend")
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and not any(r["ran_indexer"] for r in steps)
    # Tree draft steps have topk rows per request, each reading its request's shared row.
    assert all(r["logits"].shape[0] == 3 * r["req_pool_indices"].shape[0] for r in steps)


def test_shared_expert_fused_into_routed_experts(prompts, tmp_path, monkeypatch, capfd):
    """--enforce-shared-experts-fusion (what SGLang does by itself for GLM-5.2 on CUDA): each MoE layer's
    shared expert is loaded as routed expert n_routed_experts of the target's and the draft's fused MoE."""
    from safetensors import safe_open

    from sglang_glm.models.weights import FUSED_SHARED_EXPERT_LOG_LINE
    from sglang_glm_tools.reference import load_reference_model, reference_draft_round

    trace_dir = tmp_path / "trace"
    mtp_trace.enable(monkeypatch, trace_dir)
    with engine(MINI, speculative_eagle_topk=1, speculative_num_draft_tokens=STEPS + 1,
                enforce_shared_experts_fusion=True, log_level="info", **SPEC) as llm:
        assert llm.get_weights_by_name(SHARED_EXPERT) is None
        w13 = llm.get_weights_by_name("model.layers.1.mlp.experts.w13_weight", truncate_size=1 << 30)
        batch = llm.generate(input_ids=prompts, sampling_params=GREEDY)
    records = mtp_trace.load(trace_dir)
    log = "".join(capfd.readouterr())
    for model in ("GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN"):
        assert f"{model} {FUSED_SHARED_EXPERT_LOG_LINE} 8 " in log, model

    with safe_open(str(MINI / "model.safetensors"), "pt") as f:
        gate, up = (f.get_tensor(f"model.layers.1.mlp.shared_experts.{n}_proj.weight") for n in ("gate", "up"))
    routed = 8  # the mini model's n_routed_experts; the shared expert is the ninth
    w13 = torch.tensor(w13).view(routed + 1, -1, gate.shape[1])
    assert torch.equal(w13[routed], torch.cat([gate, up]).float())

    assert [o["output_ids"] for o in batch] == hf_greedy(MINI, prompts, NEW_TOKENS)
    assert _stats(batch).mean_accept_length > 1.5
    got = _first_round(records, prompts).double()
    model = load_reference_model(MINI, dtype=torch.float64)
    for b in (0, 1):
        _, ref = reference_draft_round(model, torch.tensor([prompts[b]]), STEPS, index_share=True, post_norm_carry=True)
        assert torch.equal(got[b].argmax(-1), ref.tokens[0]), f"prompt {b}: draft tokens differ"
        err = (got[b] - ref.logits[0]).abs().max().item()
        assert err < 5e-4, f"prompt {b}: draft logits differ from the float64 reference by {err}"
