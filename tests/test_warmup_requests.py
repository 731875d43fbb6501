"""The start-up warm-up requests (`sglang_glm.warmup`) inside SGLang's real HTTP server on CPU.

On CUDA the plugin makes them the default for GLM-DSA; here the test asks for them by name, as a
user may. Each prompt length must reach the model as a whole prefill (no prefix-cache hit on an
earlier warm-up prompt), before the server reports ready, and the server must serve afterwards.
"""

import re

import pytest
import requests

from serving import hf_greedy, http_server
from sglang_glm.warmup import NAME, prefill_lengths
from sglang_glm_tools.checkpoint import make_tiny_checkpoint

pytestmark = pytest.mark.slow


def test_prefill_lengths_cover_both_divisibility_classes_up_to_the_limit():
    for limit in (1, 16, 64, 100, 8192, 16384):
        lengths = prefill_lengths(limit)
        assert lengths == sorted(set(lengths)) and lengths[0] == 1 and max(lengths) <= limit
        n = 1
        while n <= limit:  # every power of two, and a length of the other class beside it
            assert n in lengths and (n + 1 in lengths or n + 1 > limit), (limit, n)
            n *= 2
    assert any(x % 16 for x in prefill_lengths(8192)) and any(x % 16 == 0 for x in prefill_lengths(8192))


def test_warm_up_limit_is_one_chunk_or_the_context():
    from sglang_glm.warmup import warm_up_limit

    assert warm_up_limit(16384, 131072) == 16384
    assert warm_up_limit(16384, 4096) == 4080
    for off in (None, 0, -1):  # chunking off: the whole context (was 0 prompts at -1)
        assert warm_up_limit(off, 4096) == 4080


def test_server_serves_every_warm_up_length_before_ready(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "model", config_overrides={"index_topk": 16}, seed=5)
    log = tmp_path / "server.log"
    limit = 64
    with http_server(ckpt, "--warmups", NAME, "--chunked-prefill-size", str(limit), log_path=log) as url:
        ready_log = log.read_text()
        prompt = [(5 * i + 2) % 400 + 2 for i in range(20)]
        out = requests.post(f"{url}/generate", timeout=120, json={
            "input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}}).json()
    lengths = prefill_lengths(limit)
    assert re.search(rf"{NAME}: {len(lengths)} prompts of 1-{limit} tokens served", ready_log), ready_log[-3000:]
    prefills = [(int(n), int(c)) for n, c in re.findall(r"Prefill batch.*?#new-token: (\d+), #cached-token: (\d+)",
                                                        ready_log)]
    for n in lengths:
        assert (n, 0) in prefills, f"warm-up length {n} was not prefilled whole: {prefills}"
    assert out["output_ids"] == hf_greedy(ckpt, [prompt], 6, index_topk=16)[0]
