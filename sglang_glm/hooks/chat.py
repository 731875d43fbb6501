"""OpenAI chat: a zero-token completion refused, and a forced tool call that calls."""

from __future__ import annotations

from sglang_glm.hooks.base import Hook, is_glm_dsa


def _chat_zero_tokens_refused(error, serving, request, *args, **kwargs):
    # SGLang's chat endpoint reads max_completion_tokens (or max_tokens) 0 as "unset": the request
    # then generates up to the context length instead of nothing.
    if error or not is_glm_dsa(serving.tokenizer_manager.model_config.hf_config):
        return error
    for name in ("max_completion_tokens", "max_tokens"):
        if getattr(request, name, None) == 0:
            return f"{name} = 0: send at least 1 (0 would mean no limit to SGLang's chat endpoint)"
    return error


def _forced_tool_call_grammar(result, serving, request, *args, **kwargs):
    # A named (or "required") tool_choice must produce the call. SGLang 0.5.23's GLM-4.7 grammar
    # lets free text come first (text_block) and requires the call only after it, so a model that
    # answers in text runs to max_tokens without calling. For GLM-DSA the forced turn is the
    # reasoning block, then the call(s): OpenAI's semantics for a forced function call.
    constraint = getattr(result, "tool_call_constraint", None)
    forced = request.tool_choice == "required" or not isinstance(request.tool_choice, str)
    if (not forced or constraint is None or constraint[0] != "full_assistant_ebnf"
            or not is_glm_dsa(serving.tokenizer_manager.model_config.hf_config)):
        return result
    rules = constraint[1].split("\n")
    text_rules = [i for i, rule in enumerate(rules) if rule.startswith("text_block ::=")]
    if len(text_rules) != 1:
        raise ValueError(f"tool_choice={request.tool_choice!r}: SGLang's GLM tool-call grammar has "
                         f"{len(text_rules)} text_block rules, expected 1; this sglang-glm does not know it")
    rules[text_rules[0]] = 'text_block ::= ""'
    result.tool_call_constraint = (constraint[0], "\n".join(rules))
    return result



HOOKS = [
    Hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request",
         _chat_zero_tokens_refused, "AFTER"),
    Hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages",
         _forced_tool_call_grammar, "AFTER"),
]
