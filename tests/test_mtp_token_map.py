"""MTP with SGLang's `--speculative-token-map` (a hot vocabulary for the draft's LM head) on the trained
GLM-DSA mini model, served by real SGLang (EAGLE 3 steps / 4 draft tokens, CPU, float32).

- Lossless: greedy tokens == transformers' with any map.
- The map's ids are mapped back right: a map holding every id in reverse order drafts exactly what no
  map drafts, so each request's acceptance equals its acceptance without a map.
- A hot map from `benchmarks/mtp/make_token_map.py` (512 of 2048 ids) still gets drafts accepted, with the
  BF16 head and with `mtp_draft_head_fp8` (the FP8 copy is then of the map's rows: the draft's logits are
  512 wide).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mtp_trace
from serving import engine, hf_greedy

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "assets" / "glm-dsa-mini"
if not MINI.exists():
    pytest.skip(f"trained model not found at {MINI}", allow_module_level=True)

NEW_TOKENS = 24
SPEC = dict(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4)


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MINI))
    text = (ROOT / "benchmarks" / "train" / "data" / "heldout.txt").read_text()
    return [tok(text[i * 9000 : i * 9000 + 600])["input_ids"][:n] for i, n in enumerate((52, 41, 33))]


@pytest.fixture(scope="module")
def want(prompts):
    return hf_greedy(MINI, prompts, NEW_TOKENS)


def _serve(prompts, **spec):
    with engine(MINI, **SPEC, **spec) as llm:
        out = llm.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS})
    return [o["output_ids"] for o in out], [o["meta_info"]["spec_accept_length"] for o in out]


@pytest.fixture(scope="module")
def no_map(prompts):
    return _serve(prompts)


def test_full_map_in_reverse_drafts_what_no_map_drafts(prompts, want, no_map, tmp_path):
    vocab = json.loads((MINI / "config.json").read_text())["vocab_size"]
    path = tmp_path / "reversed.pt"
    torch.save(list(range(vocab - 1, -1, -1)), path)
    tokens, accept = _serve(prompts, speculative_token_map=str(path))
    assert no_map[0] == want and tokens == want
    assert accept == no_map[1] and min(accept) > 1.5


@pytest.fixture(scope="module")
def hot_map(tmp_path_factory):
    path = tmp_path_factory.mktemp("map") / "hot_512.pt"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "mtp" / "make_token_map.py"), "--tokenizer", str(MINI),
                    "--text", str(ROOT / "benchmarks" / "train" / "data" / "calib.txt"), "--size", "512",
                    "--out", str(path)], check=True)
    assert len(torch.load(path)) == 512
    return path


def test_hot_map_is_lossless_and_drafts_are_accepted(prompts, want, hot_map):
    tokens, accept = _serve(prompts, speculative_token_map=str(hot_map))
    assert tokens == want
    assert sum(accept) / len(accept) > 1.2


def test_hot_map_with_the_fp8_draft_head(prompts, want, hot_map, tmp_path, monkeypatch):
    mtp_trace.enable(monkeypatch, tmp_path)
    tokens, accept = _serve(prompts, speculative_token_map=str(hot_map),
                            json_model_override_args={"mtp_draft_head_fp8": True})
    assert tokens == want
    assert sum(accept) / len(accept) > 1.2
    # the FP8 copy is made from the head SGLang hands the draft, the map's 512 rows
    widths = {r["logits"].shape[-1] for r in mtp_trace.load(tmp_path) if r["logits"] is not None}
    assert widths == {512}, widths
