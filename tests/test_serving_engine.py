"""GLM-DSA served by real SGLang (sglang.Engine, CPU, float32) with the plugin == transformers.

The tiny checkpoints' controls show the cases can fail: on them, removing sparsity or changing the
plan changes the tokens (test_plan_override_and_controls; the shared-plan checkpoint's own dense
control in test_shared_plan_checkpoint_matches_transformers, whose model the TP, PP and mixed-batch
cases serve), so agreement with transformers is not an accident of a degenerate model.
"""

import pytest

from sglang_glm_tools.checkpoint import make_tiny_checkpoint
from serving import engine, greedy, hf_greedy

pytestmark = pytest.mark.slow

TOPK = 16
NEW_TOKENS = 12
# Lengths 70, 41, 23, 9: three longer than index_topk, ragged in one batch.
PROMPTS = [
    [(7 * i + 3) % 500 + 2 for i in range(70)],
    [(11 * i + 5) % 500 + 2 for i in range(41)],
    [(13 * i + 1) % 500 + 2 for i in range(23)],
    [(17 * i + 9) % 500 + 2 for i in range(9)],
]
# Longer than the chunked-prefill size (64) used below, so it is prefilled in three chunks.
LONG_PROMPT = [(5 * i + 7) % 500 + 2 for i in range(150)]
SHARED_PLAN = "FFSF"


@pytest.fixture(scope="module")
def ckpt_all_full(tmp_path_factory):
    """GLM-5 style: an indexer in every layer, so any plan can be served from it."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("all_full"),
        config_overrides={"index_topk": TOPK, "indexer_types": ["full"] * 4},
        seed=1,
    )


@pytest.fixture(scope="module")
def ckpt_shared(tmp_path_factory):
    """GLM-5.2 style: the checkpoint's own plan has a shared layer and no indexer tensors for it."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("shared"),
        config_overrides={"index_topk": TOPK, "index_topk_pattern": SHARED_PLAN},
        seed=2,
    )


def test_shared_plan_checkpoint_matches_transformers(ckpt_shared):
    """Batch of ragged prompts longer than top-k, chunked prefill, radix-cache hit."""
    want = hf_greedy(ckpt_shared, PROMPTS + [LONG_PROMPT], NEW_TOKENS)
    assert hf_greedy(ckpt_shared, PROMPTS, NEW_TOKENS, index_topk=4096) != want[:4]  # control: sparsity matters
    with engine(ckpt_shared, chunked_prefill_size=64, page_size=64) as llm:
        assert greedy(llm, PROMPTS, NEW_TOKENS) == want[:4]
        assert greedy(llm, [LONG_PROMPT], NEW_TOKENS) == want[4:]
        # Same prefix again: served from the radix cache, past index_topk tokens deep.
        again = llm.generate(
            input_ids=[LONG_PROMPT], sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS}
        )[0]
        assert again["meta_info"]["cached_tokens"] > TOPK
        assert again["output_ids"] == want[4]


def test_plan_override_and_controls(ckpt_all_full):
    """A launch plan override serves like transformers with that plan; all-full and dense differ."""
    shared_types = ["full" if c == "F" else "shared" for c in SHARED_PLAN]
    want_shared = hf_greedy(ckpt_all_full, PROMPTS, NEW_TOKENS, indexer_types=shared_types)
    want_full = hf_greedy(ckpt_all_full, PROMPTS, NEW_TOKENS)
    want_dense = hf_greedy(ckpt_all_full, PROMPTS, NEW_TOKENS, index_topk=4096)
    # Controls: the plan and the sparsity each change the tokens of this model.
    assert want_shared != want_full
    assert want_dense != want_full

    with engine(ckpt_all_full, json_model_override_args={"index_topk_pattern": SHARED_PLAN}) as llm:
        assert greedy(llm, PROMPTS, NEW_TOKENS) == want_shared
    with engine(ckpt_all_full) as llm:
        assert greedy(llm, PROMPTS, NEW_TOKENS) == want_full
    with engine(ckpt_all_full, json_model_override_args={"index_topk": 4096}) as llm:
        assert greedy(llm, PROMPTS, NEW_TOKENS) == want_dense


def test_tensor_parallel_2_matches_tp1(ckpt_shared, monkeypatch):
    """TP=2 on CPU: heads, MoE and the o_proj all-reduce split over two ranks, same tokens."""
    # SGLang binds each CPU rank to cores; this machine has one NUMA node, so name them.
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
    want = hf_greedy(ckpt_shared, PROMPTS, NEW_TOKENS)
    with engine(ckpt_shared, tp_size=2) as llm:
        assert greedy(llm, PROMPTS, NEW_TOKENS) == want


def test_pipeline_parallel_2_matches_transformers(ckpt_shared, monkeypatch):
    """PP=2 on CPU: layers 0-1 on one rank, 2-3 on the other. The plan FFSF makes stage 2 start
    at a shared layer, so its top-k travel from stage 1 with the hidden states."""
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
    assert SHARED_PLAN[2] == "S"
    want = hf_greedy(ckpt_shared, PROMPTS, NEW_TOKENS)
    with engine(ckpt_shared, pp_size=2) as llm:
        assert greedy(llm, PROMPTS, NEW_TOKENS) == want


def test_bundled_trained_model_matches_transformers():
    """The committed glm-dsa-mini (trained, indexer in every layer) with a shared plan."""
    from pathlib import Path

    from transformers import AutoTokenizer

    model = Path(__file__).resolve().parent.parent / "assets" / "glm-dsa-mini"
    text = (Path(__file__).resolve().parent.parent / "benchmarks" / "train" / "data" / "heldout.txt").read_text()
    tok = AutoTokenizer.from_pretrained(str(model))
    ids = tok(text[:4000])["input_ids"]
    prompts = [ids[:200], ids[300:380], ids[500:530]]  # two longer than index_topk (64)
    plan = "FSFSFSFS"
    shared = ["full" if c == "F" else "shared" for c in plan]
    want = hf_greedy(model, prompts, NEW_TOKENS, indexer_types=shared)
    with engine(model, json_model_override_args={"index_topk_pattern": plan}) as llm:
        assert greedy(llm, prompts, NEW_TOKENS) == want


def test_mixed_prefill_and_decode_batches(ckpt_shared):
    """With --enable-mixed-chunk, a new prompt's prefill chunks run in the same batch as decodes."""
    import asyncio

    want = hf_greedy(ckpt_shared, [PROMPTS[0], LONG_PROMPT], 24)
    params = {"temperature": 0, "max_new_tokens": 24}
    with engine(ckpt_shared, enable_mixed_chunk=True, chunked_prefill_size=64) as llm:

        async def run():
            first = asyncio.ensure_future(llm.async_generate(input_ids=PROMPTS[0], sampling_params=params))
            await asyncio.sleep(0.5)  # the first request is decoding when the second arrives
            second = await llm.async_generate(input_ids=LONG_PROMPT, sampling_params=params)
            return [(await first)["output_ids"], second["output_ids"]]

        assert asyncio.get_event_loop().run_until_complete(run()) == want
