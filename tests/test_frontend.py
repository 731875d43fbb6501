"""The SGLang frontend-language program (benchmarks/serving/frontend_program.py) against the plugin's
server, with its outputs checked.

- every greedy `sgl.gen` equals what `/generate` returns for the exact prompt text the program sent
  (recorded inside the program with `s.text()`), with the same sampling parameters;
- the forked branches' answers equal `/generate` on their own prompts, and both came back (join);
- `sgl.select` returns one of the options, the one with the best (finite) normalized prompt logprob;
- regex-constrained generations match their regex in full;
- multi-turn: the final text contains every turn in order;
- a second run gives the same outputs (greedy is deterministic, cached prefixes included).
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import requests

from sglang_glm_tools.checkpoint import make_tiny_checkpoint
from serving import http_server

pytestmark = pytest.mark.slow

# MTP on: the program runs against the server users start. SGLang's `RuntimeEndpoint.select` sends
# {"max_new_tokens": 0} at temperature 1.0; it samples nothing, so the CPU greedy-verify refusal
# lets it through.
MTP_ON = True
MTP_ARGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "assets" / "glm-dsa-mini"
_spec = importlib.util.spec_from_file_location(
    "frontend_program", ROOT / "benchmarks" / "serving" / "frontend_program.py"
)
fp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fp)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = BUNDLED if BUNDLED.exists() else make_tiny_checkpoint(
        tmp_path_factory.mktemp("frontend"), config_overrides={"index_topk": 16}
    )
    with http_server(model, "--max-running-requests", "4", *(MTP_ARGS if MTP_ON else ())) as url:
        yield url


@pytest.fixture(scope="module")
def results(server):
    out = fp.run(server)
    assert len(out) == len(fp.SNIPPETS), (len(out), len(fp.SNIPPETS))  # every snippet ran
    return out


def generate(url, text, params):
    body = {"text": text, "sampling_params": {"skip_special_tokens": True,
                                              "spaces_between_special_tokens": True, **params}}
    r = requests.post(f"{url}/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def test_greedy_gens_equal_generate(server, results):
    for rec in results:
        for var, (prompt_var, params) in fp.GREEDY_GENS.items():
            prompt = rec[prompt_var]
            assert rec["text"].startswith(prompt)
            assert generate(server, prompt, params) == rec[var], var


def test_fork_join(server, results):
    var, prompt_var, params = fp.FORK_GEN
    for rec in results:
        answers, prompts = rec[var], rec[prompt_var]
        assert isinstance(answers, list) and len(answers) == len(fp.ASPECTS)
        for question, prompt, answer in zip(fp.ASPECTS, prompts, answers):
            assert question in prompt
            assert prompt.startswith(rec["prompt_name"] + rec["name"])
            assert generate(server, prompt, params) == answer
        # The forks' text stays out of the main branch: only the joined variables come back.
        for question in fp.ASPECTS:
            assert question not in rec["text"]


def test_select_is_an_option_and_the_best_scored(results):
    for rec in results:
        assert rec["kind"] in fp.KINDS
        meta = rec["kind_meta"]
        scores = meta["normalized_prompt_logprobs"]
        assert len(scores) == len(fp.KINDS)
        assert all(math.isfinite(x) and x <= 0 for x in scores), scores
        assert fp.KINDS[max(range(len(scores)), key=scores.__getitem__)] == rec["kind"]


def test_regex_gens_match(results):
    for rec in results:
        assert re.fullmatch(fp.NAME_REGEX, rec["name"]), rec["name"]
        assert re.fullmatch(fp.NUMBER_REGEX, rec["lines"]), rec["lines"]


def test_multi_turn_text(results):
    for snippet, rec in zip(fp.SNIPPETS, results):
        text = rec["text"]
        turns = ["SYSTEM:", "USER:Continue this code:\n" + snippet, "ASSISTANT:" + rec["completion"],
                 "USER:Is the code above", "ASSISTANT:" + rec["kind"], "USER:Give a short",
                 "ASSISTANT:" + rec["name"], "USER:In how many lines", "ASSISTANT:" + rec["lines"]]
        pos = 0
        for t in turns:
            found = text.find(t, pos)
            assert found >= 0, f"{t!r} missing or out of order in:\n{text}"
            pos = found + len(t)


def test_rerun_is_identical(server, results):
    again = fp.run(server)
    keys = ("completion", "kind", "name", "lines", "aspect", "text")
    assert [{k: r[k] for k in keys} for r in again] == [{k: r[k] for k in keys} for r in results]
