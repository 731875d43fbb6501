"""MTP speculative decoding is lossless on a tiny random GLM-DSA checkpoint (make_tiny_checkpoint,
mtp=True, a shared layer in the target plan), served by real SGLang (EAGLE, CPU, float32).

Greedy tokens with MTP on == transformers' greedy tokens (== MTP off: test_serving_engine), for a
ragged batch of prompts longer than index_topk, with 5 draft steps and the index share OFF: a
chain (eagle topk 1) and a draft tree (topk 3). The share-ON cases run on the trained model in
test_mtp_trained.py, where drafts are also accepted. With sharing off the MTP indexer runs in
every draft step (counted from the draft model's trace).
"""

import pytest

import mtp_trace
from serving import engine, greedy, hf_greedy
from sglang_glm_tools.checkpoint import make_tiny_checkpoint

pytestmark = pytest.mark.slow

TOPK = 16
NEW_TOKENS = 10
PROMPTS = [
    [(7 * i + 3) % 500 + 2 for i in range(45)],
    [(11 * i + 5) % 500 + 2 for i in range(23)],
    [(13 * i + 1) % 500 + 2 for i in range(9)],
]
STEPS = 5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("mtp_tiny"),
        config_overrides={"index_topk": TOPK, "index_topk_pattern": "FFSF"},
        mtp=True,
        seed=3,
    )


@pytest.fixture(scope="module")
def want(ckpt):
    return hf_greedy(ckpt, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("topk, draft_tokens", [(1, STEPS + 1), (3, 8)], ids=["chain", "tree"])
def test_lossless_with_index_share_off(ckpt, want, topk, draft_tokens, tmp_path, monkeypatch):
    mtp_trace.enable(monkeypatch, tmp_path / "trace")
    with engine(
        ckpt,
        speculative_algorithm="EAGLE",
        speculative_num_steps=STEPS,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=draft_tokens,
        json_model_override_args={"index_share_for_mtp_iteration": False},
    ) as llm:
        assert greedy(llm, PROMPTS, NEW_TOKENS) == want
    records = mtp_trace.load(tmp_path / "trace")
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and all(r["ran_indexer"] and not r["index_share"] for r in records)


def test_unsupported_combination_fails_at_start_up(ckpt):
    """Refused while SGLang resolves its arguments, before any process or model starts."""
    import sglang as sgl

    from serving import ENGINE_DEFAULTS

    with pytest.raises(Exception, match="(?s)cannot serve this configuration.*rejection-sampling"):
        sgl.Engine(
            model_path=str(ckpt), **ENGINE_DEFAULTS, speculative_algorithm="EAGLE",
            speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
            speculative_use_rejection_sampling=True,
        )


def test_another_speculative_algorithm_is_refused_at_start_up(ckpt):
    """NGRAM never reaches SGLang's EAGLE resolution, where the other checks run; refused by name."""
    import sglang as sgl

    from serving import ENGINE_DEFAULTS

    with pytest.raises(Exception, match="(?s)cannot serve this configuration.*--speculative-algorithm NGRAM.*EAGLE or NEXTN"):
        sgl.Engine(model_path=str(ckpt), **ENGINE_DEFAULTS, speculative_algorithm="NGRAM")


def test_draft_prefill_graphs_without_breakable_prefill_graphs_fail_at_start_up(ckpt):
    """The draft's prefill graphs asked for where prefill runs eagerly (CPU: no breakable graphs)."""
    import sglang as sgl

    from serving import ENGINE_DEFAULTS

    with pytest.raises(Exception, match="(?s)mtp_draft_prefill_graphs = true .*prefill CUDA graphs disabled.*"
                                        "--cuda-graph-backend-prefill breakable"):
        sgl.Engine(
            model_path=str(ckpt), **ENGINE_DEFAULTS, speculative_algorithm="EAGLE",
            speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
            json_model_override_args='{"mtp_draft_prefill_graphs": true}',
        )
