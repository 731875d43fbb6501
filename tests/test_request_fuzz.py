"""Property-based fuzzing of /generate, /v1/completions and /v1/chat/completions (tests/request_fuzz.py).

One SGLang HTTP server (the plugin's CPU launcher, the bundled glm-dsa-mini, MTP drafting on)
gets FUZZ_BODIES generated request bodies, one at a time. For every body:
- the answer is a 2xx or a 4xx, complete within BOUND_S seconds (a 5xx, a dropped connection or a
  hang fails);
- afterwards /health answers 200 and a fixed greedy request returns the tokens it returned before
  the first body (the scheduler is alive and unchanged).
/health's own one-token generation is off on this server (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0:
it waits at least a second per call); the fixed request after it is the stronger check.

The run is seeded: the seed is printed and in every failure message; SGLANG_GLM_FUZZ_SEED=<seed>
replays it, SGLANG_GLM_FUZZ_BODIES=<n> changes the count. Failures are not shrunk (a shrink would
replay bodies against a server the failure may have killed); the failing body is in the message.
Each crash this fuzzer found is a named regression test in tests/test_bad_requests.py.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, seed, settings

from request_fuzz import Bodies
from serving import http_server

pytestmark = pytest.mark.slow

MODEL = Path(__file__).resolve().parent.parent / "assets" / "glm-dsa-mini"
VOCAB, CONTEXT = 2048, 4096  # the bundled model's config
MTP_ARGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
SEED = int(os.environ.get("SGLANG_GLM_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
FUZZ_BODIES = int(os.environ.get("SGLANG_GLM_FUZZ_BODIES", "500"))
BOUND_S = 30.0  # per body, answer complete; a served body asks for at most 3 tokens
PROBE = {"input_ids": [5, 6, 7, 8, 9], "sampling_params": {"temperature": 0, "max_new_tokens": 3}}


@pytest.fixture(scope="module")
def server():
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "0")
        # chatml: the bundled tokenizer has no chat template, and chat bodies should reach the model.
        with http_server(MODEL, "--chat-template", "chatml", "--max-running-requests", "4",
                         *MTP_ARGS) as url:
            yield url


def probe(url) -> list[int]:
    r = requests.post(f"{url}/generate", json=PROBE, timeout=BOUND_S)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def send(url, path, body) -> tuple[int, float]:
    """POST the body (NaN/Infinity written as JSON's non-standard tokens); (status, seconds)."""
    t0 = time.monotonic()
    with requests.post(f"{url}{path}", data=json.dumps(body), stream=True, timeout=BOUND_S,
                       headers={"Content-Type": "application/json"}) as r:
        for _ in r.iter_content(chunk_size=None):
            if time.monotonic() - t0 > BOUND_S:
                break
        return r.status_code, time.monotonic() - t0


def test_fuzzed_bodies_keep_the_server_serving(server):
    print(f"request fuzzer: seed {SEED}, {FUZZ_BODIES} bodies; replay with SGLANG_GLM_FUZZ_SEED={SEED}")
    expected = probe(server)
    sent = []

    @settings(max_examples=FUZZ_BODIES, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(SEED)
    @given(Bodies(VOCAB, CONTEXT).request())
    def one_body(request):
        path, body = request
        sent.append(path)
        where = f"body {len(sent)} (seed {SEED}) {path} {json.dumps(body)[:1500]}"
        try:
            status, seconds = send(server, path, body)
        except requests.RequestException as e:
            pytest.fail(f"no HTTP answer ({type(e).__name__}: {e}) to {where}")
        assert 200 <= status < 300 or 400 <= status < 500, f"status {status} for {where}"
        assert seconds <= BOUND_S, f"{seconds:.1f}s (bound {BOUND_S}s) for {where}"
        try:
            health = requests.get(f"{server}/health", timeout=BOUND_S).status_code
            after = probe(server)
        except requests.RequestException as e:
            pytest.fail(f"server gone ({type(e).__name__}: {e}) after {where}")
        assert health == 200, f"/health {health} after {where}"
        assert after == expected, f"fixed request gave {after}, before {expected}, after {where}"

    one_body()
    print(f"request fuzzer: {len(sent)} bodies, " + ", ".join(
        f"{p} {sent.count(p)}" for p in sorted(set(sent))))
    assert len(sent) >= FUZZ_BODIES
