"""The MTP draft's LM head in block FP8 (`mtp_draft_head_fp8`, sglang_glm.mtp.draft_head).

Units: the quantizer against float64 (each weight within e4m3's rounding of its block's scale), the
reference's logits against the product of its rounded operands, and how far the FP8 head's logits sit
from the BF16 head's. Served by real SGLang on the trained mini model (EAGLE 3 steps / 4 draft tokens,
CPU, float32): greedy tokens stay transformers' (the verify keeps the BF16 head), the draft's logits are
the FP8 head's (they differ from the BF16 run's on the same first draft-extend, and by FP8's error only),
and drafts are still accepted.
"""

import json
from pathlib import Path

import pytest
import torch
from transformers import GlmMoeDsaConfig

import mtp_trace
from serving import engine, hf_greedy
from sglang_glm.mtp.draft_head import BLOCK, Fp8DraftHead, fp8_head_logits_ref, quantize_head
from sglang_glm.settings import GlmDsaSettings

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "assets" / "glm-dsa-mini"
SPEC = dict(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4)
NEW_TOKENS = 24


def _head(V=300, H=256, seed=0):
    torch.manual_seed(seed)
    w = torch.randn(V, H) * 0.02
    w[7, :BLOCK] *= 300  # one block far louder than the rest: scales are per block, not per tensor
    return w


def test_quantize_head_rounds_each_weight_on_its_blocks_scale():
    w = _head()
    codes, scale = quantize_head(w)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == w.shape
    assert scale.shape == (3, 2)  # 300 rows -> 3 row blocks (the last one short), 256 -> 2 column blocks
    per_weight = scale.repeat_interleave(BLOCK, 0)[:300].repeat_interleave(BLOCK, 1)
    back = codes.double() * per_weight
    # e4m3 keeps 3 mantissa bits: within 2^-4 of each value, or of the block's smallest normal step
    assert ((back - w.double()).abs() <= w.double().abs() / 16 + per_weight * 2**-6).all()
    assert (codes.float().abs().amax() == 448)  # each block's largest weight lands on e4m3's largest code
    chunked = quantize_head(w, rows_at_once=BLOCK)
    assert torch.equal(chunked[0].float(), codes.float()) and torch.equal(chunked[1], scale)


def test_reference_logits_are_the_rounded_operands_product():
    w, x = _head(), torch.randn(5, 256)
    codes, scale = quantize_head(w)
    got = fp8_head_logits_ref(x, codes, scale)
    xs = x.view(5, 2, BLOCK).abs().amax(-1) / 448
    xq = (x.view(5, 2, BLOCK) / xs[..., None]).to(torch.float8_e4m3fn).double() * xs[..., None].double()
    wq = codes.double() * scale.repeat_interleave(BLOCK, 0)[:300].repeat_interleave(BLOCK, 1).double()
    want = xq.view(5, 256) @ wq.T
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    bf16 = x.double() @ w.double().T
    err = ((got.double() - bf16).norm() / bf16.norm()).item()
    assert 1e-3 < err < 6e-2  # FP8's error: present, and small


def test_the_head_is_refused_off_the_block_grid():
    with pytest.raises(ValueError, match="mtp_draft_head_fp8: hidden_size 200 is not a multiple of 128"):
        Fp8DraftHead(torch.randn(10, 200))


@pytest.mark.parametrize("override, want", [({}, False), ({"mtp_draft_head_fp8": True}, True),
                                            ({"mtp_draft_head_fp8": False}, False)])
def test_setting(override, want):
    cfg = GlmMoeDsaConfig(num_hidden_layers=4, index_topk=16)
    assert GlmDsaSettings.from_config(cfg, override).draft_head_fp8 is want


@pytest.mark.parametrize("override, message", [
    ({"mtp_draft_head_fp8": "true"}, "mtp_draft_head_fp8 = 'true'; use true"),
    ({"mtp_draft_head_fp": True}, "did you mean 'mtp_draft_head_fp8'?"),
])
def test_bad_setting_is_named(override, message):
    with pytest.raises(ValueError, match=message):
        GlmDsaSettings.from_config(GlmMoeDsaConfig(num_hidden_layers=4, index_topk=16), override)


@pytest.mark.slow
@pytest.mark.skipif(not MINI.exists(), reason=f"trained model not found at {MINI}")
def test_served_fp8_draft_head_is_lossless_and_drafts_with_fp8_logits(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MINI))
    text = (ROOT / "benchmarks" / "train" / "data" / "heldout.txt").read_text()
    prompts = [tok(text[i * 9000 : i * 9000 + 600])["input_ids"][:n] for i, n in enumerate((52, 41, 33))]
    want = hf_greedy(MINI, prompts, NEW_TOKENS)
    runs = {}
    for name, fp8 in (("bf16", False), ("fp8", True)):
        trace = tmp_path / name
        mtp_trace.enable(monkeypatch, trace)
        with engine(MINI, **SPEC, json_model_override_args={"mtp_draft_head_fp8": fp8}) as llm:
            out = llm.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS})
        runs[name] = ([o["output_ids"] for o in out], [o["meta_info"]["spec_accept_length"] for o in out],
                      mtp_trace.load(trace))
    for name, (tokens, accept, _) in runs.items():
        assert tokens == want, name
    # the first draft-extend (after the prompts' prefill) has the same input in both runs
    first = {name: next(r for r in trace if r["kind"] == "extend")["logits"] for name, (_, _, trace) in runs.items()}
    diff = ((first["fp8"] - first["bf16"]).norm() / first["bf16"].norm()).item()
    assert 1e-4 < diff < 6e-2, diff
    bf16_accept, fp8_accept = (sum(runs[n][1]) / len(prompts) for n in ("bf16", "fp8"))
    assert fp8_accept > 0.85 * bf16_accept and fp8_accept > 1.5, (fp8_accept, bf16_accept)
    print(json.dumps({"accept_bf16_head": bf16_accept, "accept_fp8_head": fp8_accept, "first_logits_rel_diff": diff}))


@pytest.mark.skipif(not MINI.exists(), reason=f"trained model not found at {MINI}")
def test_fp8_head_without_a_draft_fails_at_start_up():
    import sglang as sgl

    from serving import ENGINE_DEFAULTS

    with pytest.raises(Exception, match="mtp_draft_head_fp8 = true without --speculative-algorithm: the FP8 head "
                                        "serves the MTP draft's logits only"):
        sgl.Engine(model_path=str(MINI), **ENGINE_DEFAULTS, json_model_override_args='{"mtp_draft_head_fp8": true}')
