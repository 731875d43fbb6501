"""The MTP carry matters, and `sglang_glm_tools.carry_check` finds the right one (issue 15).

The carry pair's post-norm-trained checkpoint (a target with a spread final norm, its MTP layer
trained with the post-norm carry) served by SGLang (EAGLE, 5 draft steps, CPU, float32) accepts
clearly more with its own carry than with the pre-norm one, both lossless against transformers'
greedy tokens; the tool recommends the post-norm carry, and warns when a checkpoint declares the
other one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving import hf_greedy
from sglang_glm_tools.carry_check import CLEAR_GAIN, check, prompts_from, recommend, report
from sglang_glm_tools.carry_models import CARRY_MODEL
from sglang_glm.mtp.recycle import POST_NORM, PRE_NORM, resolve_recycle_policy

pytestmark = pytest.mark.slow

TEXT = Path(__file__).resolve().parents[1] / "benchmarks" / "train" / "data" / "heldout.txt"
NEW_TOKENS, STEPS = 40, 5


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    return prompts_from(TEXT.read_text(), AutoTokenizer.from_pretrained(str(CARRY_MODEL)), 4, 48)


@pytest.fixture(scope="module")
def served(prompts):
    return check(CARRY_MODEL, prompts, NEW_TOKENS, steps=STEPS, on_gpu=False)


def test_own_carry_accepts_clearly_more_and_both_are_lossless(served, prompts):
    own, other = served["results"][POST_NORM], served["results"][PRE_NORM]
    print(report(served, STEPS))
    target = hf_greedy(CARRY_MODEL, prompts, NEW_TOKENS)
    assert own.tokens == target and other.tokens == target
    assert own.accept_length >= other.accept_length + CLEAR_GAIN, (own, other)
    assert served["recommended"] == POST_NORM and "WARNING" not in report(served, STEPS)


def test_a_checkpoint_declaring_the_worse_carry_gets_a_warning(served, tmp_path):
    config = json.loads((CARRY_MODEL / "config.json").read_text()) | {"mtp_recycle_hidden": PRE_NORM}
    (tmp_path / "config.json").write_text(json.dumps(config))
    from transformers import AutoConfig

    declared = resolve_recycle_policy(AutoConfig.from_pretrained(str(tmp_path)))
    assert declared == PRE_NORM
    advice = recommend(served["results"], declared)
    text = report(advice, STEPS)
    assert advice["recommended"] == POST_NORM
    assert "WARNING" in text and '{"mtp_recycle_hidden": "post_norm"}' in text
