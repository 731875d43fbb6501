"""Requests: GLM-DSA requests that would crash SGLang 0.5.23's scheduler, get a 500 or a cut
stream, or silently mean something else get a 400 naming the field (`sglang_glm.request_guard`)."""

from __future__ import annotations

import contextlib

from sglang_glm.attention.backends import on_cpu_engine
from sglang_glm.hooks.base import Hook, is_glm_dsa, spec_server_args


def _grammar_backend() -> str | None:
    # SGLang resolves a None --grammar-backend to its default in the runtime context, not in server_args
    from sglang.srt.runtime_context import get_exec

    return get_exec().kernel.grammar_backend


def _guard_glm_dsa_request(original, manager, obj, input_text, input_ids, *args, **kwargs):
    # SGLang 0.5.23 lets these through to the scheduler, which dies on them and takes the server
    # down, or answers 500; a clear 400 here keeps serving (ValueError becomes the HTTP error).
    if not is_glm_dsa(manager.model_config.hf_config):
        return original(manager, obj, input_text, input_ids, *args, **kwargs)
    from sglang_glm import request_guard

    vocab = manager.model_config.vocab_size
    params = obj.sampling_params if isinstance(obj.sampling_params, dict) else {}
    request_guard.check_before_parsing(
        params, input_ids, vocab, xgrammar=_grammar_backend() == "xgrammar"
    )
    tokenized = original(manager, obj, input_text, input_ids, *args, **kwargs)
    if hasattr(tokenized, "sampling_params"):  # generation, not embedding
        request_guard.check_tokenized(
            tokenized, vocab, greedy_verify_only=on_cpu_engine() and spec_server_args() is not None
        )
    return tokenized


def _guard_glm_dsa_batch(original, manager, obj, *args, **kwargs):
    # SGLang answers 500 for some request shapes (its batch normalization raises TypeError or
    # IndexError); a 400 naming the field instead. generate_request is an async generator.
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not isinstance(obj, GenerateReqInput) or not is_glm_dsa(manager.model_config.hf_config):
        return original(manager, obj, *args, **kwargs)
    return _shape_checked(original(manager, obj, *args, **kwargs), obj)


async def _shape_checked(outputs, obj):
    from sglang_glm import request_guard

    request_guard.check_shape(obj)  # on first iteration, where SGLang raises its own ValueErrors
    async with contextlib.aclosing(outputs):
        async for out in outputs:
            yield out


def _abort_task_skips_rejected(original, manager, obj, *args, **kwargs):
    # SGLang's abort task, run after a streamed response, reads `obj.is_single`, which only its
    # batch normalization sets: for a stream rejected before that (bad input, nothing to abort)
    # the task raises and cuts the response short of its error and [DONE].
    from starlette.background import BackgroundTasks

    tasks = original(manager, obj, *args, **kwargs)
    if not is_glm_dsa(manager.model_config.hf_config):
        return tasks

    async def abort_if_admitted():
        if hasattr(obj, "is_single"):
            await tasks()

    guarded = BackgroundTasks()
    guarded.add_task(abort_if_admitted)
    return guarded



HOOKS = [
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request", _guard_glm_dsa_batch, "AROUND"),
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object",
         _guard_glm_dsa_request, "AROUND"),
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager.create_abort_task",
         _abort_task_skips_rejected, "AROUND"),
]
