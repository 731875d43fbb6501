"""GLM-5's chat format for the plugin's checkpoints: special tokens and the chat template.

Written from GLM's published format (GLM-4.5/4.7/5 model cards and chat templates): a
conversation opens with `[gMASK]<sop>`; turns are `<|system|>`, `<|user|>`, `<|assistant|>` and
`<|observation|>` (tool results, each in `<tool_response>`); the assistant reasons inside
`<think>...</think>` and calls tools as
`<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>`, the markup
SGLang's `glm47` tool-call detector and `glm45` reasoning parser read. Tool definitions (JSON) go
into the system turn. An assistant turn ends where the next turn's token begins, so `<|user|>` and
`<|observation|>` are end-of-generation tokens next to `<|endoftext|>`.
"""

from __future__ import annotations

EOS_TOKEN = "<|endoftext|>"
# Order fixes the ids: appended after the byte-level BPE vocabulary, turn tokens first.
# Turn tokens are special (dropped from decoded text); the markup tokens are added but not
# special, so they survive detokenization with skip_special_tokens, where the reasoning and
# tool-call parsers look for them (as in GLM's own tokenizers).
SPECIAL_TOKENS = ["[gMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
MARKUP_TOKENS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>",
]
# Tokens that end an assistant turn (the model hands over to the user or to a tool).
STOP_TOKENS = [EOS_TOKEN, "<|user|>", "<|observation|>"]

TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key>"
    "<arg_value>{arg-value-1}</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}"
    "</arg_value>...</tool_call>"
)



def _literal(text: str) -> str:
    """A Jinja expression printing `text` verbatim (newlines kept, no template syntax inside)."""
    return "{{ '" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "' }}"


# Jinja, as transformers and SGLang render it. `enable_thinking` (default true) opens the
# assistant turn with `<think>`; false closes reasoning at once (`</think>`), as GLM-4.7 does.
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- set sys = namespace(text='') -%}"
    "{%- for m in messages if m.role == 'system' -%}"
    "{%- set sys.text = sys.text + (m.content if m.content is string else '') -%}"
    "{%- endfor -%}"
    "{%- if tools -%}"
    "<|system|>" + _literal(TOOLS_PREAMBLE) +
    "{%- for tool in tools -%}"
    "{{ (tool.function if tool.function is defined else tool) | tojson }}{{ '\\n' }}"
    "{%- endfor -%}"
    + _literal(TOOLS_POSTAMBLE) +
    "{%- if sys.text %}{{ '\\n\\n' + sys.text }}{% endif -%}"
    "{%- elif sys.text -%}<|system|>{{ sys.text }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>{{ m.content if m.content is string else '' }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>"
    "{%- if m.reasoning_content -%}<think>{{ m.reasoning_content }}</think>"
    "{%- else -%}</think>{%- endif -%}"
    "{{ m.content if m.content is string else '' }}"
    "{%- for tc in m.tool_calls or [] -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "<tool_call>{{ f.name }}"
    "{%- for k, v in (f.arguments or {}).items() -%}"
    "<arg_key>{{ k }}</arg_key><arg_value>{{ v if v is string else v | tojson }}</arg_value>"
    "{%- endfor -%}</tool_call>"
    "{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}<|observation|>{%- endif -%}"
    "<tool_response>{{ m.content if m.content is string else m.content | tojson }}</tool_response>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{{ '</think>' if enable_thinking is defined and not enable_thinking else '<think>' }}"
    "{%- endif -%}"
)


def add_chat_format(tokenizer):
    """Give a tokenizer GLM's turn and markup tokens (new ids after its vocabulary) and the chat template."""
    from tokenizers import AddedToken

    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def stop_token_ids(tokenizer) -> list[int]:
    """The ids that end an assistant turn, for config.json / generation_config.json eos_token_id."""
    return [tokenizer.convert_tokens_to_ids(t) for t in STOP_TOKENS]


def chat_tokenizer(vocab_size: int):
    """A tiny checkpoint's tokenizer with the chat format, `vocab_size` tokens in all.

    For `checkpoint.make_tiny_checkpoint(..., tokenizer=chat_tokenizer(vocab))`: the byte-level BPE
    is trained smaller by the number of added tokens, so every id stays inside the vocabulary.
    """
    from sglang_glm_tools.checkpoint import default_tokenizer

    return add_chat_format(default_tokenizer(vocab_size - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS)))
