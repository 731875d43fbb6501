"""Hypothesis strategies for request bodies of /generate, /v1/completions and /v1/chat/completions.

Built from SGLang 0.5.23's own schemas: the type hints of `GenerateReqInput` and `SamplingParams`
and the pydantic fields of `CompletionRequest` / `ChatCompletionRequest`. Each field gets a value
of its declared type pushed to extremes (negative, huge, empty, NaN-like, unicode, deeply nested,
long lists); a few fields get domain strategies (token ids, grammars, backtracking stop regexes).
Token-count fields stay tiny unless they are out of range, so a body that is served is cheap.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing

from hypothesis import strategies as st

NAN_LIKE_FLOATS = (float("nan"), float("inf"), float("-inf"))  # json.dumps writes NaN/Infinity
NAN_LIKE_STRINGS = ("nan", "NaN", "inf", "-Infinity", "1e999")  # pydantic/msgspec parse some
WEIRD_TEXT = ("", " ", "\x00", "\ud7ff\ue000", "🦜" * 50, "a" * 3000, "\n" * 300, "<|endoftext|>",
              "\\u0000", "{}", "[]", "null", "%s%n", "‮", "ß" * 10)
BIG_INTS = (2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 10**30, -(2**31),
            -(2**63), -(2**63) - 1, -(10**30))
FLOAT_EXTREMES = (0.0, -0.0, 1e-300, 5e-324, -1.0, 1e308, -1e308, 1e-7, 0.5, 2.0, 3.0, 100.0)

# Regexes that backtrack catastrophically on a near-miss, and plain bad ones.
BACKTRACKING = ("(a+)+$", "(a|aa)+b", "(.*)*x", "(\\w+\\s?)+$", "(a|a?)+$", "((a+)+)+c",
                "(.*a){20}", "(x+x+)+y", "([a-z ]+)*!", "(\\d+)*\\.(\\d+)*z")
BAD_REGEX = ("(ab", "[z-a]", "*", "a{2,1}", "(?<=a+)b", "\\", "(?P<n>a)(?P<n>b)", "[" * 200)
JSON_SCHEMAS = (
    '{"type": "object"}', '{"type": "string", "pattern": "(a+)+$"}', "{", "[]", '""',
    '{"type": "array", "items": {"type": "integer"}, "minItems": 100000}',
    '{"type": "integer", "minimum": 10, "maximum": 1}', '{"$ref": "#/definitions/missing"}',
    '{"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}',
    json.dumps(dict(type="object", properties={"x": {"enum": [chr(0x1F600), None, 1e308]}})),
)
EBNF = ('root ::= "a"+', 'root ::= root', "root ::=", 'root ::= "a" | ', "::=", 'x ::= "a"')


class Bodies:
    """Strategies for one served model: `vocab` token ids, prompts that fit `context`."""

    def __init__(self, vocab: int, context: int):
        self.vocab, self.context = vocab, context

    # ---------------------------------------------------------------- typed values pushed to extremes

    def ints(self):
        return st.one_of(st.integers(-3, 8), st.sampled_from(BIG_INTS))

    def floats(self):
        return st.one_of(
            st.sampled_from(FLOAT_EXTREMES), st.sampled_from(NAN_LIKE_FLOATS),
            st.floats(allow_nan=False, allow_infinity=False, width=64),
        )

    def text(self):
        return st.one_of(st.text(max_size=12), st.sampled_from(WEIRD_TEXT))

    def json_value(self, max_leaves=8):
        scalars = st.one_of(st.none(), st.booleans(), self.ints(), self.text(),
                            st.sampled_from(FLOAT_EXTREMES))
        shallow = st.recursive(
            scalars, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                            st.dictionaries(st.text(max_size=5), kids, max_size=3)),
            max_leaves=max_leaves,
        )
        return st.one_of(shallow, st.integers(50, 400).map(_deeply_nested))

    def token_id(self):
        v = self.vocab
        return st.one_of(st.integers(0, v - 1), st.sampled_from((-1, -v, v, v + 1, 2**31, 2**63)))

    def token_ids(self, max_size=6):
        return st.one_of(st.lists(self.token_id(), max_size=max_size),
                         st.integers(0, 3).map(lambda k: [k] * 20000))

    def count(self):
        """Token counts, `n`, logprob numbers: tiny when valid, else far out of range."""
        return st.one_of(st.integers(0, 3), st.sampled_from((-1, -(2**63), 10**6, 2**31, 2**64)))

    def regex(self):
        return st.one_of(st.sampled_from(BACKTRACKING), st.sampled_from(BAD_REGEX),
                         st.sampled_from(("[0-9]+", "a|b", "(def|class) \\w+")))

    FIELD_STRATEGIES = {
        # token ids
        "input_ids": "prompt_ids", "stop_token_ids": "token_ids", "token_ids_logprob": "token_ids",
        "logit_bias": "logit_bias",
        # token counts and other sizes that decide how much work a served body is
        "max_new_tokens": "count", "max_tokens": "count", "max_completion_tokens": "count",
        "min_new_tokens": "count", "min_tokens": "count", "n": "count", "best_of": "count",
        "top_logprobs_num": "count", "logprobs": "count_or_bool", "top_logprobs": "count",
        "logprob_start_len": "count", "stream_interval": "count", "beam_width": "count",
        "routed_experts_start_len": "count",
        # grammars and stops
        "regex": "regex", "stop_regex": "stop_regex", "json_schema": "json_schema",
        "ebnf": "ebnf", "stop": "stop",
    }

    def prompt_ids(self):
        return self.token_ids(max_size=12)

    def logit_bias(self):
        keys = st.one_of(self.token_id().map(str), st.sampled_from(("abc", "", "1.5", "-0", " 3")))
        return st.dictionaries(keys, self.floats(), max_size=4)

    def count_or_bool(self):
        return st.one_of(self.count(), st.booleans())

    def stop_regex(self):
        return st.one_of(self.regex(), st.lists(self.regex(), max_size=40))

    def json_schema(self):
        return st.sampled_from(JSON_SCHEMAS)

    def ebnf(self):
        return st.sampled_from(EBNF)

    def stop(self):
        return st.one_of(self.text(), st.lists(self.text(), max_size=40))

    def for_annotation(self, tp, depth=0):
        """A value of type `tp` (typing hints, pydantic models, dataclasses) pushed to extremes."""
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            return self.for_annotation(args[0], depth)
        if origin in (typing.Union, types.UnionType):
            return st.one_of(*[self.for_annotation(a, depth) for a in args])
        if origin is typing.Literal:
            return st.one_of(st.sampled_from(args), self.text())
        if tp is type(None):
            return st.none()
        if tp is bool:
            return st.booleans()
        if tp is int:
            return self.ints()
        if tp is float:
            return st.one_of(self.floats(), st.sampled_from(NAN_LIKE_STRINGS))
        if tp is str:
            return self.text()
        if depth > 3 or tp in (typing.Any, object) or origin is None and not isinstance(tp, type):
            return self.json_value()
        if origin in (list, tuple, set, typing.Sequence) or tp in (list, tuple, set):
            item = self.for_annotation(args[0], depth + 1) if args else self.json_value()
            return st.one_of(st.lists(item, max_size=4), st.lists(item, min_size=300, max_size=300))
        if origin is dict or tp is dict:
            value = self.for_annotation(args[1], depth + 1) if len(args) == 2 else self.json_value()
            return st.dictionaries(self.text(), value, max_size=4)
        fields = _fields(tp)
        if fields is None:
            return self.json_value()
        return self.object_of(fields, depth + 1, max_fields=4)

    def field_value(self, name, tp, depth=0):
        special = self.FIELD_STRATEGIES.get(name)
        return getattr(self, special)() if special else self.for_annotation(tp, depth)

    def object_of(self, fields: dict, depth=0, max_fields=6, always=()):
        """A dict with a random subset of `fields` (name -> type), plus the names in `always`."""
        names = sorted(fields)
        chosen = st.lists(st.sampled_from(names), max_size=max_fields, unique=True)
        return chosen.flatmap(lambda keys: st.fixed_dictionaries(
            {k: self.field_value(k, fields[k], depth) for k in [*always, *keys]}))

    # ---------------------------------------------------------------- the three endpoints

    def prompt_text(self):
        return st.one_of(st.text(min_size=1, max_size=40), st.sampled_from(WEIRD_TEXT[1:]))

    def generate(self):
        from sglang.srt.managers.io_struct import GenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        top = _fields(GenerateReqInput)
        one_prompt = st.one_of(st.fixed_dictionaries({"text": self.prompt_text()}),
                               st.fixed_dictionaries({"input_ids": self.prompt_ids()}))
        batch = st.one_of(
            st.fixed_dictionaries({"text": st.lists(self.prompt_text(), max_size=3)}),
            st.fixed_dictionaries({"input_ids": st.lists(self.prompt_ids(), max_size=3)}))
        prompt = st.one_of(one_prompt, one_prompt, batch, st.just({}))
        params = self.object_of(_fields(SamplingParams), max_fields=5)
        params = st.one_of(params, params, st.lists(params, max_size=3))
        return st.builds(_generate_body, prompt, self.object_of(top, max_fields=3), params)

    def completions(self):
        from sglang.srt.entrypoints.openai.protocol import CompletionRequest

        fields = _fields(CompletionRequest)
        prompt = st.one_of(self.prompt_text(), self.prompt_ids(),
                           st.lists(self.prompt_text(), min_size=1, max_size=3))
        return st.builds(_openai_body, st.fixed_dictionaries({"prompt": prompt}),
                         self.object_of(fields, max_fields=5), st.just("max_tokens"))

    def chat(self):
        from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

        fields = _fields(ChatCompletionRequest)
        role = st.sampled_from(("user", "system", "assistant", "tool", "bogus"))
        message = st.fixed_dictionaries({"role": role, "content": st.one_of(
            self.prompt_text(), st.none(),
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": self.text()}),
                     max_size=2))})
        messages = st.lists(message, max_size=3)
        return st.builds(_openai_body, st.fixed_dictionaries({"messages": messages}),
                         self.object_of(fields, max_fields=5), st.just("max_completion_tokens"))

    def request(self):
        """(path, body) for one of the three endpoints."""
        return st.one_of(
            st.tuples(st.just("/generate"), self.generate()),
            st.tuples(st.just("/v1/completions"), self.completions()),
            st.tuples(st.just("/v1/chat/completions"), self.chat()),
        )


GREEDY_CHEAP = {"temperature": 0, "max_new_tokens": 3}


def _generate_body(prompt: dict, top: dict, params) -> dict:
    # Greedy and 3 tokens unless the body says otherwise: MTP on CPU serves greedy requests only.
    cheap = [{**GREEDY_CHEAP, **p} for p in params] if isinstance(params, list) else {
        **GREEDY_CHEAP, **params}
    return {**prompt, **top, "sampling_params": cheap}


def _openai_body(base: dict, fields: dict, length_field: str) -> dict:
    # Greedy and 3 tokens unless the body sets its own length field.
    cap = {} if length_field in fields else {length_field: 3}
    return {"model": "default", "temperature": 0, **cap, **base, **fields}


def _deeply_nested(depth: int):
    value = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def _fields(tp) -> dict | None:
    """Field name -> type of a dataclass, msgspec struct or pydantic model; None otherwise."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return {f.name: hints.get(f.name, typing.Any) for f in dataclasses.fields(tp)}
    if hasattr(tp, "model_fields"):
        return {k: f.annotation for k, f in tp.model_fields.items()}
    if hasattr(tp, "__struct_fields__"):
        hints = typing.get_type_hints(tp)
        return {k: hints.get(k, typing.Any) for k in tp.__struct_fields__}
    return None
