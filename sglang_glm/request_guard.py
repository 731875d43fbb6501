"""Checks on a GLM-DSA request before it reaches SGLang 0.5.23's scheduler.

SGLang's tokenizer manager lets some values through that its scheduler (one process for all
requests) dies on, taking the server down; others surface as a 500. Each check here raises
`ValueError` (SGLang answers 400 with its message) naming the field, the value and the fix.
`check_shape` and `check_before_parsing` see the request as sent (and its prompt's token ids);
`check_tokenized` sees what the scheduler would get (SGLang's parsed, normalized `SamplingParams`).
"""

from __future__ import annotations

import functools
import math
import re


def _token_ids_in_vocab(field: str, ids, vocab: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(
            f"{field} contains {sorted(bad)[:5]} outside the vocabulary [0, {vocab}); "
            "send token ids of this model's tokenizer"
        )


def _stop_regexes_compile(stop_regex) -> None:
    # SGLang parses them with re's parser and answers 500 on a pattern it cannot parse.
    for pattern in [stop_regex] if isinstance(stop_regex, str) else stop_regex or []:
        if not isinstance(pattern, str):
            continue  # SGLang's own type checks answer these
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            raise ValueError(
                f"stop_regex {pattern!r} is not a valid regular expression ({exc}); "
                "send a pattern Python's re module compiles"
            ) from None


# Per-prompt fields of a batch /generate request. SGLang spreads a single value of a SPREAD field
# over the prompts but indexes a list by prompt without checking its length (an IndexError, a
# 500); token_ids_logprob is a list for one prompt already, so only a list of lists is per prompt.
# An INDEXED field it indexes by prompt whatever it is (a string or an object too).
SPREAD_FIELDS = (
    "sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num",
    "return_sampling_mask", "sampling_logprobs_mode", "lora_path", "custom_logit_processor",
    "image_data", "video_data", "audio_data", "return_hidden_states", "extra_key", "cache_salt",
    "kv_hints", "watermark", "bootstrap_host", "bootstrap_port", "bootstrap_room",
    "bootstrap_pair_key", "decode_tp_size", "token_ids_logprob",
)
# The same fields hold one value each for a single prompt (SGLang passes a list on unchecked, to
# a dict key or to the scheduler); media fields and token_ids_logprob are lists for one prompt.
SINGLE_VALUE_FIELDS = tuple(
    f for f in SPREAD_FIELDS if f not in ("image_data", "video_data", "audio_data", "token_ids_logprob")
) + ("lora_id",)
INDEXED_FIELDS = (
    "lora_id", "modalities", "mm_hashes", "mm_content_hashes", "multi_item_delimiter_indices",
    "token_indices_to_pool",
)


def _per_prompt(name: str, value) -> bool:
    """Whether a batch request's `value` of field `name` is meant as one entry per prompt."""
    if name in INDEXED_FIELDS:
        return value is not None and (name != "modalities" or bool(value))
    if name == "token_ids_logprob":
        return isinstance(value, list) and bool(value) and isinstance(value[0], list)
    return isinstance(value, list)


# Sequences one request may ask for (prompts x n): SGLang 0.5.23 builds the state of every one up
# front, and n = 10**6 grows the server past its machine's memory.
MAX_SEQUENCES = 1024


def _batch_size(obj) -> int | None:
    """Number of prompts of a batch request (a list of texts or of token lists), else None."""
    if isinstance(obj.text, list):
        return len(obj.text)
    ids = obj.input_ids
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


def _parallel_samples(params: dict, where: str) -> int:
    # SGLang compares `n` with 1 before any check: None or a string is a TypeError (a 500).
    n = params.get("n", 1)
    if type(n) is not int or not 1 <= n <= MAX_SEQUENCES:
        raise ValueError(
            f"{where}n = {n!r}: send a whole number of samples from 1 to {MAX_SEQUENCES} (or omit n)"
        )
    return n


def _session_params_valid(session_params) -> None:
    # SGLang builds SessionParams(**session_params) unchecked: an unknown key is a TypeError (a
    # 500), a value of the wrong type reaches the scheduler.
    if session_params is None:
        return
    import msgspec
    from sglang.srt.managers.io_struct import SessionParams

    fields = {f.name: f.type for f in msgspec.structs.fields(SessionParams)}
    if not isinstance(session_params, dict):
        raise ValueError(f"session_params = {session_params!r}: send an object with {sorted(fields)}")
    for key, value in session_params.items():
        if key not in fields:
            raise ValueError(f"session_params.{key} is not a session field; send only {sorted(fields)}")
        try:
            msgspec.convert(value, fields[key], strict=True)
        except msgspec.ValidationError as exc:
            raise ValueError(f"session_params.{key} = {str(value)[:100]}: {exc}") from None


def _hidden_states_mode(value) -> bool:
    return value is None or type(value) is bool or value == "last"


def _hidden_states_modes_valid(value, batch: bool) -> None:
    # The scheduler checks the mode itself, by raising: the scheduler dies.
    per_prompt = value if batch and isinstance(value, list) else [value]
    bad = [v for v in per_prompt if not _hidden_states_mode(v)]
    if bad:
        raise ValueError(
            f"return_hidden_states = {str(bad[0])[:100]}: send true, false or \"last\""
            + (" (or a list of them, one per prompt)" if batch else "")
        )


def check_shape(obj) -> None:
    """A /generate request (GenerateReqInput) as sent, before SGLang normalizes its batch."""
    given = [f for f in ("text", "input_ids", "input_embeds") if getattr(obj, f) is not None]
    if len(given) > 1:
        # SGLang refuses all three together only; two index each other per prompt (a 500).
        raise ValueError(f"{' and '.join(given)} are both set; send the prompt in one of them")
    embeds = obj.input_embeds
    if embeds is not None and not (isinstance(embeds, list) and embeds and isinstance(embeds[0], list) and embeds[0]):
        # SGLang tells a batch from one prompt by input_embeds[0][0]: an IndexError (a 500) on an empty one.
        raise ValueError(
            f"input_embeds = {str(embeds)[:100]}: send one embedding vector per prompt token (a list of "
            "lists of floats), or one such list per prompt"
        )
    _session_params_valid(obj.session_params)
    _hidden_states_modes_valid(obj.return_hidden_states, _batch_size(obj) is not None)
    if obj.positional_embed_overrides is not None:
        # Unchecked on the way to the scheduler, which dies on a malformed one.
        raise ValueError(
            "positional_embed_overrides: GLM-DSA models (sglang-glm) take token prompts only; omit it"
        )
    params = obj.sampling_params
    n = 1
    if isinstance(params, list):
        if not params or not all(isinstance(p, dict) for p in params):
            raise ValueError(
                f"sampling_params = {str(params)[:100]}: send an object, or one object per prompt"
            )
        n = max(_parallel_samples(p, f"sampling_params[{i}].") for i, p in enumerate(params))
    elif isinstance(params, dict):
        n = _parallel_samples(params, "sampling_params.")
    size = _batch_size(obj)
    if size is None:
        listed = [f for f in SINGLE_VALUE_FIELDS if isinstance(getattr(obj, f, None), list)]
        if listed:
            raise ValueError(f"{listed[0]} is a list for a single prompt; send one value")
        if obj.rid is not None and not isinstance(obj.rid, str):
            # SGLang keys its request table by rid: a dict is unhashable (a 500).
            raise ValueError(f"rid = {str(obj.rid)[:100]}: a single prompt takes one string rid")
        return
    if size * n > MAX_SEQUENCES:
        raise ValueError(
            f"{size} prompts x n = {n} is {size * n} sequences; send at most {MAX_SEQUENCES} per request"
        )
    for name in SPREAD_FIELDS + INDEXED_FIELDS:
        value = getattr(obj, name, None)
        if _per_prompt(name, value) and (not isinstance(value, list) or len(value) != size):
            count = f"{len(value)} entries" if isinstance(value, list) else f"a {type(value).__name__}"
            raise ValueError(
                f"{name} has {count} for a batch of {size} prompts; send a list with one entry "
                "per prompt" + ("" if name in INDEXED_FIELDS else ", or a single value for all")
            )


@functools.lru_cache(maxsize=1)
def _byte_grammar_compiler():
    # A vocabulary of the 256 bytes and an end token: whether a grammar can start or end at all does
    # not depend on the model's tokens, and this compiles in milliseconds.
    import xgrammar

    info = xgrammar.TokenizerInfo([bytes([b]) for b in range(256)] + [b"<end>"], stop_token_ids=[256])
    return xgrammar.GrammarCompiler(info, max_threads=1)


@functools.lru_cache(maxsize=256)
def _ebnf_can_start(ebnf: str) -> bool:
    """Whether the grammar allows a first byte or the empty string (False: it matches no string)."""
    import xgrammar

    try:
        compiled = _byte_grammar_compiler().compile_grammar(ebnf)
    except RuntimeError:
        return True  # a syntax error: SGLang's own compile answers it with a 400
    mask = xgrammar.allocate_token_bitmask(1, 257)
    xgrammar.GrammarMatcher(compiled).fill_next_token_bitmask(mask)
    return bool(mask.any())


def _ebnf_matches_something(ebnf) -> None:
    # xgrammar compiles a grammar with no derivation (`root ::= root`); SGLang then samples a token the
    # grammar refuses and answers 500 (with ignore_eos), or returns text outside the grammar.
    if isinstance(ebnf, str) and not _ebnf_can_start(ebnf):
        raise ValueError(
            f"ebnf {ebnf[:200]!r} matches no string (no first character and no empty match: a rule "
            "only refers to rules that never end); give root an alternative that ends in literals"
        )


def check_before_parsing(sampling_params: dict, input_ids, vocab: int, *, xgrammar: bool) -> None:
    """One request's raw `sampling_params` dict and prompt token ids (None for embeddings);
    `xgrammar`: the server compiles grammars with xgrammar (its default grammar backend)."""
    _stop_regexes_compile(sampling_params.get("stop_regex"))
    if xgrammar:
        _ebnf_matches_something(sampling_params.get("ebnf"))
    if input_ids is not None:
        if len(input_ids) == 0:
            raise ValueError(
                "The prompt is empty (no tokens); send at least one token (text or input_ids)."
            )
        # Before SGLang packs them into 64-bit integers (a 500 above 2**63).
        _token_ids_in_vocab("input_ids", input_ids, vocab)


def _sampled_verify_refused(params) -> None:
    # SGLang's CPU EAGLE verify is greedy whatever the temperature: refuse instead of lying.
    greedy = params.temperature == 0 or params.top_k == 1
    samples_nothing = params.max_new_tokens == 0  # prompt scoring, e.g. the frontend's select
    if not greedy and not samples_nothing:
        raise ValueError(
            "Speculative decoding (EAGLE/NEXTN MTP) on CPU verifies drafts greedily only: a request "
            f"with temperature={params.temperature} would silently get greedy tokens. Send "
            "temperature 0 (or top_k 1), or serve without --speculative-algorithm on CPU."
        )


def _logit_bias_finite(logit_bias) -> None:
    for token, bias in (logit_bias or {}).items():
        if not math.isfinite(bias):
            raise ValueError(
                f"logit_bias[{token!r}] = {bias} is not a finite number; send a finite bias"
            )


def check_tokenized(req, vocab: int, *, greedy_verify_only: bool) -> None:
    """The tokenized request SGLang is about to send to the scheduler."""
    params = req.sampling_params
    _token_ids_in_vocab("stop_token_ids", params.stop_token_ids or (), vocab)
    _logit_bias_finite(params.logit_bias)
    top = req.top_logprobs_num
    if req.return_logprob and isinstance(top, int) and top > vocab:
        raise ValueError(f"top_logprobs_num = {top} exceeds the vocabulary size {vocab}")
    if greedy_verify_only:
        _sampled_verify_refused(params)
