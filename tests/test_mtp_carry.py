"""The MTP carry matters, and `sglang_glm_tools.carry_check` finds the right one (issue 15).

The carry pair (one target with a spread final norm, two MTP layers trained over it with the
post-norm and the pre-norm carry) served by SGLang (EAGLE, 5 draft steps, CPU, float32): each
checkpoint accepts clearly more with its own carry than with the other, every configuration is
lossless against transformers' greedy tokens, and the tool recommends the checkpoint's own carry,
warning when the checkpoint's declared (or model-type default) carry is the other one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving import hf_greedy
from sglang_glm_tools.carry_check import CLEAR_GAIN, check, prompts_from, recommend, report
from sglang_glm_tools.carry_models import CARRY_MODEL, checkpoint_with_mtp
from sglang_glm.mtp.recycle import POST_NORM, PRE_NORM, resolve_recycle_policy

pytestmark = pytest.mark.slow

TEXT = Path(__file__).resolve().parents[1] / "benchmarks" / "train" / "data" / "heldout.txt"
NEW_TOKENS, STEPS = 40, 5
OTHER = {POST_NORM: PRE_NORM, PRE_NORM: POST_NORM}


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    return prompts_from(TEXT.read_text(), AutoTokenizer.from_pretrained(str(CARRY_MODEL)), 4, 48)


@pytest.fixture(scope="module")
def target(prompts):
    return hf_greedy(CARRY_MODEL, prompts, NEW_TOKENS)


@pytest.fixture(scope="module", params=[POST_NORM, PRE_NORM], ids=["post_norm_trained", "pre_norm_trained"])
def served(request, prompts, tmp_path_factory):
    """(the carry the MTP layer was trained with, its checkpoint, carry_check's result)."""
    model = checkpoint_with_mtp(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, model, check(model, prompts, NEW_TOKENS, steps=STEPS, on_gpu=False)


def test_own_carry_accepts_clearly_more_and_both_are_lossless(served, target):
    trained, _, result = served
    own, other = result["results"][trained], result["results"][OTHER[trained]]
    text = report(result, STEPS)
    print(text)
    assert own.tokens == target and other.tokens == target
    assert own.accept_length >= other.accept_length + CLEAR_GAIN, (own, other)
    assert result["recommended"] == trained
    # the checkpoints keep the model type's default (post-norm): only the pre-norm-trained one is warned about
    assert result["default"] == POST_NORM
    assert ("WARNING" in text) == (trained == PRE_NORM)
    assert ('{"mtp_recycle_hidden": "pre_norm"}' in text) == (trained == PRE_NORM)


def test_a_checkpoint_declaring_the_worse_carry_gets_a_warning(served, tmp_path):
    trained, model, result = served
    config = json.loads((Path(model) / "config.json").read_text()) | {"mtp_recycle_hidden": OTHER[trained]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    from transformers import AutoConfig

    declared = resolve_recycle_policy(AutoConfig.from_pretrained(str(tmp_path)))
    assert declared == OTHER[trained]
    advice = recommend(result["results"], declared)
    text = report(advice, STEPS)
    assert advice["recommended"] == trained
    assert "WARNING" in text and json.dumps({"mtp_recycle_hidden": trained}) in text
