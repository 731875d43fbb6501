"""GLM-DSA through SGLang's own HTTP server (`python -m sglang.launch_server`, via the plugin's CPU
launcher) == transformers' float32 greedy tokens.

The server is started and stopped by the test as a process group (scheduler and detokenizer are
children of the launcher; ending the group ends them all). One server serves every test here.
"""

import pytest
import requests

from sglang_glm_tools.checkpoint import make_tiny_checkpoint
from serving import hf_greedy, http_server

pytestmark = pytest.mark.slow

TOPK = 16
NEW_TOKENS = 10
# Ragged, two longer than index_topk so the sparse path selects a strict subset.
PROMPTS = [
    [(7 * i + 3) % 500 + 2 for i in range(45)],
    [(13 * i + 1) % 500 + 2 for i in range(23)],
    [(17 * i + 9) % 500 + 2 for i in range(9)],
]
TEXT_PROMPT = "def load(fp, *, cls=None, object_hook=None):\n    return loads(fp.read(),"
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("http"),
        config_overrides={"index_topk": TOPK, "index_topk_pattern": "FFSF"},
        seed=3,
    )


@pytest.fixture(scope="module")
def text_ids(ckpt):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(ckpt))(TEXT_PROMPT)["input_ids"]
    assert len(ids) > TOPK
    return ids


@pytest.fixture(scope="module")
def want(ckpt, text_ids):
    return hf_greedy(ckpt, PROMPTS + [text_ids], NEW_TOKENS)


@pytest.fixture(scope="module")
def server(ckpt):
    with http_server(ckpt) as url:
        yield url


def post(url, path, body):
    r = requests.post(f"{url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_input_ids_batch(server, want):
    out = post(server, "/generate", {"input_ids": PROMPTS, "sampling_params": GREEDY})
    assert [o["output_ids"] for o in out] == want[:3]
    assert all(o["meta_info"]["completion_tokens"] == NEW_TOKENS for o in out)


def test_generate_single_text_and_ids(server, want, text_ids):
    out = post(server, "/generate", {"text": TEXT_PROMPT, "sampling_params": GREEDY})
    assert out["meta_info"]["prompt_tokens"] == len(text_ids)
    assert out["output_ids"] == want[3]
    out = post(server, "/generate", {"input_ids": PROMPTS[0], "sampling_params": GREEDY})
    assert out["output_ids"] == want[0]


def test_generate_stream(server, want):
    import json

    body = {"input_ids": PROMPTS[1], "sampling_params": GREEDY, "stream": True}
    last = None
    with requests.post(f"{server}/generate", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line and line != b"data: [DONE]":
                last = json.loads(line.removeprefix(b"data: "))
    assert last["output_ids"] == want[1]


def test_v1_completions_token_ids(server, want, text_ids):
    body = {"model": "default", "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    out = post(server, "/v1/completions", {**body, "prompt": PROMPTS})
    got = [c["token_ids"] for c in sorted(out["choices"], key=lambda c: c["index"])]
    assert got == want[:3]
    assert out["usage"]["completion_tokens"] == 3 * NEW_TOKENS
    out = post(server, "/v1/completions", {**body, "prompt": TEXT_PROMPT})
    assert out["choices"][0]["token_ids"] == want[3]
    assert out["choices"][0]["finish_reason"] == "length"


def test_v1_completions_text_matches_detokenized(server, ckpt, want, text_ids):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    out = post(server, "/v1/completions", {"model": "default", "prompt": TEXT_PROMPT,
                                            "max_tokens": NEW_TOKENS, "temperature": 0,
                                            "ignore_eos": True})
    assert out["choices"][0]["text"] == tok.decode(want[3], skip_special_tokens=True)
