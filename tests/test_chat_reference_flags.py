"""GLM-5.2's reference launch flags on CPU, end to end over HTTP with the OpenAI client.

One `sglang_glm.cpu_compat.launch_server` serves the bundled chat model (glm-dsa-mini-chat: GLM-5
chat template, special tokens) with `--tool-call-parser glm47 --reasoning-parser glm45`, EAGLE
at 3 steps, `--kv-cache-dtype fp8_e4m3` and `--max-running-requests 32`. Checked: chat completions
streamed and not, reasoning separated from content exactly where the generated tokens put
`</think>`, tool calls (auto: the model's own; named and "required": forced; one forced by an
EBNF grammar in the request) as structured `tool_calls` with JSON arguments and a follow-up turn with the result,
`tool_choice` none, 4xx for malformed requests, the KV pool's bytes-per-token log line, and greedy
tokens of the FP8 cache against transformers' float32 ones.
On CPU MTP verifies greedily, so every request sets temperature 0 (others are refused).
"""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests
import torch
from transformers import AutoTokenizer

from serving import http_server
from glm_dsa_kernels import layout
from sglang_glm_tools.chat_data import ADD_TOOL as ADD  # the tools the chat model was fine-tuned with
from sglang_glm_tools.chat_data import WEATHER_TOOL as WEATHER

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "assets" / "glm-dsa-mini-chat"
REFERENCE_FLAGS = (
    "--tool-call-parser", "glm47", "--reasoning-parser", "glm45",
    "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    "--kv-cache-dtype", "fp8_e4m3", "--max-running-requests", "32",
)

GREEDY = {"temperature": 0, "max_tokens": 64}
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "<|user|>", "<|observation|>")
# FP8 acceptance threshold, in nats of float32 top-1 minus top-2 logprob. benchmarks/fp8_kv
# measured, teacher-forced over 8,176 held-out positions per model, FP8 flipping the top-1 token
# at float32 margins up to 0.87 on this model (results-glm-dsa-mini-chat.md) and 1.41 on
# glm-dsa-mini (FP8 index keys can change a layer's top-k selection, which moves logits by more
# than the cache's rounding alone); no margin above 1.5 was flipped on either.
MARGIN = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("chat") / "server.log"
    with http_server(MODEL, *REFERENCE_FLAGS, "--log-level", "info", log_path=log) as url:
        yield url, log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(MODEL))


def raw_completion(url, tok, messages, max_tokens, **template_kwargs) -> str:
    """The same turn through /generate: the template's prompt, greedy, special tokens kept."""
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    r = requests.post(f"{url}/generate", timeout=300, json={
        "text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_tokens,
                                            "skip_special_tokens": False}})
    assert r.status_code == 200, r.text
    return r.json()["text"]


def split_reasoning(raw: str) -> tuple[str, str]:
    """What glm45 must return for a turn that starts inside <think> (the template opens it)."""
    reasoning, sep, content = raw.partition("</think>")
    for stop in ("<|user|>", "<|observation|>", "<|endoftext|>"):
        content = content.split(stop)[0]
    return reasoning.strip(), content.strip() if sep else ""


def test_template_renders_glm_format(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": '{"temperature": 3}'},
    ]
    text = tok.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True, tokenize=False)
    assert text.startswith("[gMASK]<sop><|system|># Tools")
    assert json.dumps(WEATHER["function"]) in text and text.count("<|system|>") == 1
    assert text.endswith(
        "\n\nBe brief.<|user|>Weather in Oslo?<|assistant|><think>Call the tool.</think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"
        '<|observation|><tool_response>{"temperature": 3}</tool_response><|assistant|><think>'
    )
    no_think = tok.apply_chat_template(messages[1:2], add_generation_prompt=True, tokenize=False,
                                       enable_thinking=False)
    assert no_think == "[gMASK]<sop><|user|>Weather in Oslo?<|assistant|></think>"
    # Every turn and markup string is one token.
    for t in MARKUP + ("[gMASK]", "<sop>", "<|assistant|>", "<|system|>"):
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t


def test_chat_separates_reasoning_exactly_where_the_tokens_do(server, client, tok):
    messages = [{"role": "user", "content": "What is the capital of Japan?"}]
    resp = client.chat.completions.create(model="m", messages=messages, **GREEDY)
    msg = resp.choices[0].message
    want_reasoning, want_content = split_reasoning(raw_completion(server[0], tok, messages, GREEDY["max_tokens"]))
    assert want_reasoning, "the template opens <think>: the turn starts with reasoning"
    assert (msg.reasoning_content or "").strip() == want_reasoning
    assert (msg.content or "").strip() == want_content
    assert not any(m in (msg.content or "") + (msg.reasoning_content or "") for m in MARKUP)

    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True, **GREEDY))
    streamed_reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    streamed_content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed_reasoning.strip() == want_reasoning and streamed_content.strip() == want_content
    assert chunks[-1].choices[0].finish_reason == resp.choices[0].finish_reason


def test_thinking_off_gives_content_only(server, client, tok):
    messages = [{"role": "user", "content": "Hello!"}]
    resp = client.chat.completions.create(model="m", messages=messages, extra_body={
        "chat_template_kwargs": {"enable_thinking": False}}, **GREEDY)
    raw = raw_completion(server[0], tok, messages, GREEDY["max_tokens"], enable_thinking=False)
    want = raw.split("<|user|>")[0].split("<|endoftext|>")[0].strip()
    assert resp.choices[0].message.reasoning_content is None
    assert (resp.choices[0].message.content or "").strip() == want and want


def _args(call, tool) -> dict:
    args = json.loads(call.function.arguments)  # valid JSON or this raises
    schema = tool["function"]["parameters"]
    assert set(schema["required"]) <= set(args) <= set(schema["properties"]), args
    for key, value in args.items():
        assert isinstance(value, {"string": str, "integer": int}[schema["properties"][key]["type"]]), (key, value)
    return args


def test_named_tool_choice_call_then_a_follow_up_turn(client):
    messages = [{"role": "user", "content": "What is the weather in Rome?"}]
    resp = client.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, **GREEDY)
    choice = resp.choices[0]
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1, choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = _args(call, WEATHER)
    assert not any(m in (choice.message.content or "") for m in MARKUP)

    follow = messages + [
        {"role": "assistant", "content": choice.message.content or "",
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id,
         "content": json.dumps({"city": args["city"], "condition": "sunny", "temperature": 24})},
    ]
    answer = client.chat.completions.create(model="m", messages=follow, tools=[WEATHER, ADD], **GREEDY)
    final = answer.choices[0]
    assert final.finish_reason in ("stop", "length", "tool_calls")
    assert (final.message.content or final.message.reasoning_content or final.message.tool_calls)
    assert not any(m in (final.message.content or "") for m in MARKUP)


# A call of `add` in GLM-4.7 markup after the reasoning block: SGLang's EBNF constraint (xgrammar).
FORCED_ADD = ('root ::= [a-zA-Z .]+ "</think><tool_call>add<arg_key>a</arg_key><arg_value>" [0-9]+ '
              '"</arg_value><arg_key>b</arg_key><arg_value>" [0-9]+ "</arg_value></tool_call>"')


def test_constrained_decoding_forces_a_call_the_model_would_not_make(client):
    # A question the model answers without tools; an EBNF grammar makes it generate an add call,
    # which the glm47 parser turns into a structured call from the generated tokens.
    messages = [{"role": "user", "content": "What is the capital of Japan?"}]
    free = client.chat.completions.create(model="m", messages=messages, tools=[ADD], **GREEDY).choices[0]
    assert not free.message.tool_calls and free.finish_reason == "stop", free
    forced = client.chat.completions.create(model="m", messages=messages, tools=[ADD], **GREEDY,
                                            extra_body={"ebnf": FORCED_ADD}).choices[0]
    assert forced.finish_reason == "tool_calls" and forced.message.tool_calls, forced
    assert forced.message.tool_calls[0].function.name == "add"
    _args(forced.message.tool_calls[0], ADD)
    assert forced.message.reasoning_content == free.message.reasoning_content


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "add"}}, "required"])
def test_forced_tool_choice_calls_the_tool(client, tool_choice):
    """A question the model answers in text, with the call forced by name or by "required": SGLang
    0.5.23's GLM grammar let text come first and the model never reached the call within
    max_tokens; the plugin's hook makes the forced turn the reasoning block, then the call."""
    messages = [{"role": "user", "content": "What is the capital of Japan?"}]
    free = client.chat.completions.create(model="m", messages=messages, tools=[ADD], **GREEDY).choices[0]
    assert not free.message.tool_calls  # unforced, this model answers in text
    forced = client.chat.completions.create(
        model="m", messages=messages, tools=[ADD, WEATHER] if tool_choice == "required" else [ADD],
        tool_choice=tool_choice, **GREEDY).choices[0]
    assert forced.message.tool_calls, forced
    assert [c.function.name for c in forced.message.tool_calls][0] in ("add", "get_weather")
    if tool_choice != "required":
        assert forced.message.tool_calls[0].function.name == "add"
    call = forced.message.tool_calls[0]
    _args(call, ADD if call.function.name == "add" else WEATHER)
    assert not (forced.message.content or "").strip()


def test_auto_tool_choice_the_model_calls_the_tool(client):
    # The fine-tune taught the model to call add for sums; SGLang's default tool_choice is auto.
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is 12 plus 30?"}], tools=[ADD, WEATHER], **GREEDY)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    assert choice.message.tool_calls[0].function.name == "add"
    _args(choice.message.tool_calls[0], ADD)

    streamed = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What is 12 plus 30?"}], tools=[ADD, WEATHER],
        stream=True, **GREEDY))
    deltas = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "add"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == json.loads(
        choice.message.tool_calls[0].function.arguments)


def test_tool_choice_none_returns_no_call(server, client, tok):
    # With none SGLang leaves the tools out of the prompt and runs no tool parser: the turn is
    # the model's text as generated. (This model writes call markup for sums even without
    # tools; it comes back as content, unparsed.)
    messages = [{"role": "user", "content": "What is 12 plus 30?"}]
    resp = client.chat.completions.create(model="m", messages=messages, tools=[ADD], tool_choice="none", **GREEDY)
    msg = resp.choices[0].message
    assert not msg.tool_calls and resp.choices[0].finish_reason != "tool_calls"
    want_reasoning, want_content = split_reasoning(raw_completion(server[0], tok, messages, GREEDY["max_tokens"]))
    assert (msg.reasoning_content or "").strip() == want_reasoning
    assert (msg.content or "").strip() == want_content


def test_concurrent_turns_get_what_they_get_alone(client):
    # Up to 32 running requests: turns batched together (tools, reasoning, plain) answer as alone.
    turns = [
        dict(messages=[{"role": "user", "content": "What is 7 plus 5?"}], tools=[ADD, WEATHER]),
        dict(messages=[{"role": "user", "content": "What is the weather in Lima?"}], tools=[WEATHER],
             tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        dict(messages=[{"role": "user", "content": "What is the capital of Peru?"}]),
        dict(messages=[{"role": "user", "content": "Good morning!"}]),
    ]

    def ask(turn):
        m = client.chat.completions.create(model="m", **turn, **GREEDY).choices[0].message
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or []]
        return m.content, m.reasoning_content, calls

    alone = [ask(t) for t in turns]
    with ThreadPoolExecutor(len(turns) * 2) as pool:
        together = list(pool.map(ask, turns * 2))
    assert together == alone * 2


MALFORMED = [
    ("tool without a name", {"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]}),
    ("tool_choice names an undeclared tool",
     {"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    ("unknown tool_choice string", {"tools": [ADD], "tool_choice": "sometimes"}),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("no messages", {"messages": []}),
    ("assistant tool-call arguments not JSON", {"messages": [
        {"role": "user", "content": "add"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "add", "arguments": "{a: 1"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "3"}]}),
]


@pytest.mark.parametrize("name, body", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_tools_and_messages_get_4xx(server, client, name, body):
    request = {"model": "m", "messages": [{"role": "user", "content": "What is 1 plus 2?"}], **GREEDY, **body}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**request)
    assert 400 <= err.value.status_code < 500, (name, err.value.status_code, err.value)
    assert requests.get(f"{server[0]}/health", timeout=10).status_code == 200


def test_log_states_fp8_bytes_per_token_per_layer(server):
    cfg = json.loads((MODEL / "config.json").read_text())
    mla = layout.mla_row_bytes(cfg["kv_lora_rank"], cfg["qk_rope_head_dim"])
    index = layout.index_k_token_bytes(cfg["index_head_dim"])
    lines = re.findall(r"KV cache bytes per token per layer \(fp8_e4m3\): .*", server[1].read_text())
    assert len(lines) == 2, lines  # the target's pool and the MTP draft's
    for line in lines:
        assert line == (f"KV cache bytes per token per layer (fp8_e4m3): full layers {mla + index} "
                        f"(MLA {mla} + index K {index}), shared layers {mla} (MLA {mla})")


def test_fp8_greedy_tokens_match_float32_above_the_margin(server):
    from transformers import GlmMoeDsaForCausalLM

    text = (ROOT / "benchmarks/train/data/heldout.txt").read_text(encoding="utf-8")
    ids = AutoTokenizer.from_pretrained(str(MODEL))(text, add_special_tokens=False)["input_ids"]
    prompts, new = [ids[i * 300:i * 300 + 160] for i in range(4)], 64
    model = GlmMoeDsaForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    checked = 0
    for prompt in prompts:
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        want = ref.sequences[0, len(prompt):].tolist()
        r = requests.post(f"{server[0]}/generate", timeout=300, json={
            "input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}})
        assert r.status_code == 200, r.text
        got = r.json()["output_ids"]
        assert r.json()["meta_info"]["spec_verify_ct"] > 0  # EAGLE drafted and verified
        for pos, score in enumerate(ref.scores):
            top2 = torch.log_softmax(score[0].float(), -1).topk(2).values
            margin = (top2[0] - top2[1]).item()
            if got[pos] != want[pos]:
                # After a divergence the two continue from different text: compare no further.
                assert margin <= MARGIN, f"FP8 changed token {pos} where float32 leads by {margin:.3f} nats"
                break
            checked += margin > MARGIN
    assert checked >= 40, "too few confident positions to say anything"
