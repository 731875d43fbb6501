"""carry_check's pieces that need no server: the token agreement it reports on a GPU and its report."""

from __future__ import annotations

from sglang_glm.mtp.recycle import POST_NORM, PRE_NORM
from sglang_glm_tools.carry_check import CarryResult, recommend, report, token_agreement


def test_token_agreement_counts_positions_over_the_longer_generation():
    assert token_agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) == 1.0
    # one position differs and one generation is a token short: 4 of 6 positions equal
    assert token_agreement([[1, 2, 3], [4, 5, 6]], [[1, 9, 3], [4, 5]]) == 4 / 6


def test_report_on_a_gpu_states_the_share_of_identical_tokens():
    results = {POST_NORM: CarryResult(4.9, 0.78, [0.9] * 5, 100, [[1, 2]]),
               PRE_NORM: CarryResult(3.8, 0.56, [0.7] * 5, 130, [[1, 3]])}
    advice = {**recommend(results, POST_NORM), "identical_tokens": 0.5}
    text = report(advice, 5)
    assert "agree at 50.0% of positions" in text and "WARNING" not in text
    assert "agree at" not in report({**advice, "identical_tokens": 1.0}, 5)
