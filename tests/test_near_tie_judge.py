"""The judge the batched-serving tests use (`serving.assert_same_up_to_near_tie`): it accepts a token
flip only where the float64 reference explains it (a top-2 logit near-tie, or a top-k boundary key
swapped at an index-score near-tie before it) and rejects any other difference."""

import pytest
import torch

import serving
from serving import _topk_selection, assert_same_up_to_near_tie, reference_steps
from sglang_glm_tools.checkpoint import make_tiny_checkpoint
from sglang_glm_tools.reference import load_reference_model

NEW = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("judge"), config_overrides={"index_topk": 16}, seed=6)


@torch.no_grad()
def greedy(model_path, prompt, swap=None):
    """The float64 reference's greedy tokens, one forward each (with one top-k boundary key swapped)."""
    ref, out = load_reference_model(model_path, dtype=torch.float64), []
    for _ in range(NEW):
        with _topk_selection(swap=swap):
            out.append(int(ref(torch.tensor([prompt + out])).logits[0, -1].argmax()))
    return out


def test_a_swapped_boundary_key_is_accepted_and_other_flips_are_not(model, monkeypatch):
    # a looser near-tie bound gives enough boundary rows to find a swap that changes a greedy token
    monkeypatch.setattr(serving, "INDEX_NEAR_TIE", 3e-3)
    prompt = [(17 * k) % 510 + 1 for k in range(300)]
    want = greedy(model, prompt)
    ties = serving._boundary_near_ties(model, prompt + want, len(prompt) + NEW)
    for call, row, _ in ties:
        got = greedy(model, prompt, swap=(call, row))
        if got == want:
            continue
        j = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
        if reference_steps(model, prompt, want)[j][1] > serving.NEAR_TIE:
            break
    else:
        pytest.fail(f"no swap among {len(ties)} boundary near-ties changes a token by more than a logit near-tie")

    assert assert_same_up_to_near_tie(model, prompt, got, want, "swapped") is True
    assert assert_same_up_to_near_tie(model, prompt, want, want, "same") is False
    # the same flip with no index-score near-tie allowed, and a token nothing explains, are rejected
    monkeypatch.setattr(serving, "INDEX_NEAR_TIE", 0.0)
    with pytest.raises(AssertionError, match="not a rounding flip"):
        assert_same_up_to_near_tie(model, prompt, got, want, "swapped")
    monkeypatch.setattr(serving, "INDEX_NEAR_TIE", 3e-3)
    wrong = want[:j] + [(want[j] + 1) % 512] + want[j + 1:]
    with pytest.raises(AssertionError, match="not a rounding flip"):
        assert_same_up_to_near_tie(model, prompt, wrong, want, "wrong")
