"""Start-up warm-up requests: one prefill of every token-count class before the server reports ready.

The plugin's own kernels build their variants when its backend starts (`glm_dsa_kernels.warmup`).
SGLang's Triton kernels on the prefill path (fused MoE, KV-slot allocation, copies) pick launch
configs by the batch's token count and specialize integers on divisibility by 16, so a user's first
prompt of a new size class would build them inside the request. SGLang runs the `--warmups` it is
given during server start-up, before the server reports ready; GLM-DSA servers on CUDA get this
one by default (`sglang_glm.hooks.launch`), and `--warmups` replaces it like any default.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

NAME = "glm_dsa_prefill_shapes"


def prefill_lengths(limit: int) -> list[int]:
    """Prompt lengths up to `limit`: powers of two and the steps halfway between (fused MoE's tuned
    token counts), each with its odd neighbour (the other divisibility class)."""
    lengths, n = set(), 1
    while n <= limit:
        lengths.update(x for x in (n, n + 1, n + n // 2, n + n // 2 + 1) if x <= limit)
        n *= 2
    return sorted(lengths)


def warm_up_limit(chunked_prefill_size: int | None, context_len: int) -> int:
    """The longest warm-up prompt: one prefill chunk (the whole context where chunking is off: None,
    0 or -1), leaving room for the decoded tokens and an MTP round's drafts."""
    chunk = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else context_len
    return min(chunk, context_len - 16)


async def warm_up_prefill_shapes(disaggregation_mode: str, tokenizer_manager) -> None:
    """SGLang's warm-up signature (`sglang.srt.entrypoints.warmup`): requests through the tokenizer
    manager, each a prefill of one length class and two decoded tokens (an MTP round with EAGLE)."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    from sglang.srt.managers.io_struct import GenerateReqInput

    args = tokenizer_manager.server_args
    limit = warm_up_limit(args.chunked_prefill_size, tokenizer_manager.context_len)
    vocab = tokenizer_manager.model_config.vocab_size
    lengths = prefill_lengths(limit)
    t0 = time.perf_counter()
    for k, n in enumerate(lengths):
        # a first token of its own per prompt: no prompt is a prefix-cache hit on an earlier one
        ids = [k % (vocab - 1) + 1] + [(7 * i + 3) % (vocab - 1) + 1 for i in range(n - 1)]
        req = GenerateReqInput(input_ids=ids, sampling_params={"max_new_tokens": 2, "temperature": 0.0})
        if disaggregation_mode != "null":
            req.bootstrap_room, req.bootstrap_host = 0, FAKE_BOOTSTRAP_HOST
        async for _ in tokenizer_manager.generate_request(req, None):
            pass
    logger.info("%s: %d prompts of 1-%d tokens served in %.1f s", NAME, len(lengths), limit, time.perf_counter() - t0)


def register() -> None:
    from sglang.srt.entrypoints.warmup import warmup

    warmup(NAME)(warm_up_prefill_shapes)
