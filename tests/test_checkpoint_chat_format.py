"""Tiny checkpoints with GLM-5's chat format: every added token inside the vocabulary, the template
saved with the tokenizer and rendered by transformers from the checkpoint directory."""

import json

from transformers import AutoTokenizer

from sglang_glm_tools.chat_format import MARKUP_TOKENS, SPECIAL_TOKENS, chat_tokenizer
from sglang_glm_tools.checkpoint import DEFAULT_TINY_CONFIG, make_tiny_checkpoint


def test_tiny_checkpoint_with_chat_tokenizer(tmp_path):
    vocab = DEFAULT_TINY_CONFIG["vocab_size"]
    path = make_tiny_checkpoint(tmp_path / "chat", tokenizer=chat_tokenizer(vocab))
    tok = AutoTokenizer.from_pretrained(str(path))
    assert len(tok) == vocab == json.loads((path / "config.json").read_text())["vocab_size"]
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + MARKUP_TOKENS]
    assert sorted(ids) == list(range(vocab - len(ids), vocab))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "[gMASK]<sop><|user|>hi<|assistant|><think>"
    assert tok(text, add_special_tokens=False)["input_ids"][:3] == ids[:2] + [tok.convert_tokens_to_ids("<|user|>")]
