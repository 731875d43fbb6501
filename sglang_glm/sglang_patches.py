"""Every change the plugin makes to SGLang internals that SGLang offers no registry for.

Each patch goes through SGLang's own `HookRegistry` and says why in one line. Every hook changes
behaviour only for GLM-DSA models or the plugin's own attention backends, and passes everything
else to SGLang untouched. On every platform: the DSA KV pool follows the attention backend;
GLM-DSA requests that would crash SGLang's scheduler, get a 500 or a cut stream, or silently mean
something else get a 400; GLM-DSA's server-arg defaults (CUDA: the plugin's Triton backend and
its prefill warm-up);
prefill without CUDA graphs and the top-k buffer sized once for the plugin's backends; EAGLE's
draft backends, the draft-extend CUDA graph, flag checks and per-position acceptance. Five
apply only on the CPU path. `hooks()` lists them;
`plugin.register()` checks every target exists before `apply()` registers any.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, NamedTuple
from unittest import mock

from sglang_glm.attention.backends import (
    PLUGIN_BACKENDS, TORCH_BACKEND, TRITON_BACKEND, on_cpu_engine, triton_geometry_problem,
)

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _no_cuda_capability():
    # SGLang's DSA server-arg defaults read the GPU generation unconditionally; on CPU there is
    # none, and the choices they make (FP8 KV, DSA kernel names) do not apply to the CPU backend.
    with mock.patch("torch.cuda.get_device_capability", return_value=(0, 0)):
        yield


def _glm_dsa_model_adjustments(original, server_args, *args, **kwargs):
    """SGLang's model-specific server-arg defaults, made to fit GLM-DSA with the plugin's backends."""
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    hf_config = model_config_of(server_args).hf_config
    if not is_glm_dsa(hf_config):
        return original(server_args, *args, **kwargs)
    user = resolving_view(server_args)
    user_kv_dtype, user_page = user.kv_cache_dtype, user.page_size
    user_backend = (user.attention_backend, user.prefill_attention_backend, user.decode_attention_backend)
    if on_cpu_engine():
        with _no_cuda_capability():
            result = original(server_args, *args, **kwargs)
    else:
        result = original(server_args, *args, **kwargs)
    # SGLang's `dsa` default needs FlashMLA and DeepGEMM; on CUDA the plugin's Triton backend is
    # the path this project runs (README, "On a GPU deployment").
    default_triton = not on_cpu_engine() and user_backend == (None, None, None)
    problem = triton_geometry_problem(hf_config)
    if problem and (default_triton or TRITON_BACKEND in user_backend):
        raise ValueError(problem)  # at launch: the kernels would stop the scheduler at its first forward
    if default_triton:
        declare_resolution(server_args, "sglang_glm", attention_backend=TRITON_BACKEND)
    # Every prefill size class served once before the server reports ready (sglang_glm.warmup).
    if not on_cpu_engine() and user.warmups is None:
        from sglang_glm.warmup import NAME as PREFILL_WARMUP

        declare_resolution(server_args, "sglang_glm", warmups=PREFILL_WARMUP)
    # The CPU cache keeps the model dtype (SGLang's DSA default picks a GPU cache dtype).
    if on_cpu_engine() and user_kv_dtype == "auto":
        declare_resolution(server_args, "sglang_glm", kv_cache_dtype="auto")
    # SGLang forces 64-token pages on DSA models and serves eagle topk > 1 with pages > 1 only on
    # flashinfer/fa3/triton; the plugin's backends serve tree drafts with page size 1.
    topk = resolving_view(server_args).speculative_eagle_topk
    if topk is not None and topk > 1 and user_page in (None, 1):
        declare_resolution(server_args, "sglang_glm", page_size=1)
    return result


def _no_prefill_cuda_graph(result, server_args, *args, **kwargs):
    # The plugin's backends lay every prefill batch out anew (ragged extend lengths); only the
    # decode-shaped passes (decode, target verify, EAGLE draft steps) are graph-captured.
    from sglang.srt.arg_groups.model_override_base import (
        attention_backends_of, model_config_of, resolved_view, resolving_view,
    )
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    graphs = resolving_view(server_args).cuda_graph_config
    if graphs.prefill.backend == Backend.DISABLED or not is_glm_dsa(model_config_of(server_args).hf_config):
        return result
    if attention_backends_of(resolved_view(server_args))[0] in PLUGIN_BACKENDS:
        logger.info("GLM-DSA with the plugin's attention backend: prefill runs without CUDA graphs")
        declare_resolution(
            server_args, "sglang_glm", cuda_graph_config=with_phase(graphs, Phase.PREFILL, backend=Backend.DISABLED)
        )
    return result


def _cpu_backends_with_dsa_default(original, server_args, *args, **kwargs):
    # SGLang's CPU default (intel_amx -> torch_native) ignores top-k; GLM-DSA needs sparse attention.
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    user_choice = resolving_view(server_args).attention_backend
    result = original(server_args, *args, **kwargs)
    if user_choice is None and is_glm_dsa(model_config_of(server_args).hf_config):
        declare_resolution(server_args, "sglang_glm", attention_backend=TORCH_BACKEND)
    return result


def _plugin_draft_backend(factory) -> str | None:
    """The plugin backend EAGLE's draft passes of this draft runner run on, if any."""
    from sglang.srt.runtime_context import attention_backends

    prefill, decode = attention_backends()
    name = factory.draft_attn_backend or decode or prefill
    return name if name in PLUGIN_BACKENDS else None


def _draft_decode_backend(original, factory, *args, **kwargs):
    # SGLang maps backend names to EAGLE multi-step draft backends in a hard-coded dict.
    name = _plugin_draft_backend(factory)
    if name is None:
        return original(factory, *args, **kwargs)
    if factory.speculative_num_steps <= 1:
        return None
    from sglang_glm.attention.torch_dsa_backend import TorchDSAMultiStepDraftBackend

    if name == TORCH_BACKEND:
        backend_class = TorchDSAMultiStepDraftBackend
    else:
        from sglang_glm.attention.triton_dsa_backend import TritonDSAMultiStepDraftBackend as backend_class
    return backend_class(factory.draft_model_runner, factory.topk, factory.speculative_num_steps)


def _draft_extend_backend(original, factory, *args, **kwargs):
    # Same hard-coded dict for the draft-extend backend.
    name = _plugin_draft_backend(factory)
    if name is None:
        return original(factory, *args, **kwargs)
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    return ATTENTION_BACKENDS[name](factory.draft_model_runner)


def _capture_draft_extend_graph(result, worker, *args, **kwargs):
    # SGLang captures the draft-extend graph only for backends on a hard-coded isinstance list; the
    # plugin's Triton backend refills static buffers before each replay like those, so its
    # draft-extend pass (the MTP layer over the verified window, once per round) replays too.
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

    from sglang_glm.attention.triton_dsa_backend import TritonDSABackend

    if (worker.cuda_graph_runner_for_draft_extend is not None
            or not isinstance(worker.draft_extend_attn_backend, TritonDSABackend)
            or check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
            or envs.SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH.get()):
        return result
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

    tic = time.perf_counter()
    worker.cuda_graph_runner_for_draft_extend = EAGLEDraftExtendCudaGraphRunner(worker)
    elapsed = time.perf_counter() - tic
    usage = worker._specialized_graph_time_usage
    usage["draft_extend"] = usage.get("draft_extend", 0.0) + elapsed
    logger.info("GLM-DSA MTP: draft-extend CUDA graph captured for %s in %.2f s", TRITON_BACKEND, elapsed)
    return result


def _plugin_draft_shares_its_own_topk(result, worker, *args, **kwargs):
    # SGLang's in-tree MTP index share carries a seed that only its own DSA indexer reads; the
    # plugin's draft shares top-k through its own table (mtp/index_share.py, chains and trees).
    # Left on, SGLang gathers and copies the unread seed every round and may drop a round's
    # draft graph when the seed is missing.
    from sglang_glm.models.glm_dsa_nextn import GlmMoeDsaForCausalLMNextN

    if isinstance(worker.draft_runner.model, GlmMoeDsaForCausalLMNextN):
        worker.index_share_for_mtp_iteration = False
        worker.seed_dsa_topk_from_draft_extend = False
        worker.dsa_seed_topk_width = None
    return result


def _allocate_forward_buffers(result, model_runner, *args, **kwargs):
    # The top-k buffer is sized by the runner's request slots, known once its pools exist; sizing
    # it here, before CUDA-graph capture, gives every forward the same addresses.
    from sglang_glm.models.glm_dsa import GlmMoeDsaForCausalLM
    from sglang_glm.models.glm_dsa_nextn import GlmMoeDsaForCausalLMNextN
    from sglang_glm.topk_buffer import max_forward_tokens

    model = model_runner.model
    if isinstance(model, (GlmMoeDsaForCausalLM, GlmMoeDsaForCausalLMNextN)):
        req_slots = model_runner.req_to_token_pool.req_to_token.shape[0]  # slot 0 is SGLang's padding row
        model.allocate_forward_buffers(max_forward_tokens(model_runner), req_slots, model_runner.device)
    return result


def _spec_server_args():
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
    except ValueError:  # SGLang's "Global server args is not set yet!": none in this process
        return None
    return args if getattr(args, "speculative_algorithm", None) else None


def _plugin_backend_in_use() -> bool:
    """Whether this process runs one of the plugin's attention backends (GLM-DSA's on CPU)."""
    try:
        from sglang.srt.runtime_context import attention_backends

        return bool(set(attention_backends()) & set(PLUGIN_BACKENDS))
    except ValueError:  # SGLang's "config namespace 'exec' not published": no runtime context yet
        return False


def _validate_glm_dsa_spec(original, server_args, *args, **kwargs):
    # Combinations the plugin's MTP path cannot serve fail here, at start-up, by name.
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view

    result = original(server_args, *args, **kwargs)
    if is_glm_dsa(model_config_of(server_args).hf_config):
        from sglang_glm.mtp.validate import check_spec_args

        check_spec_args(resolving_view(server_args), on_cpu=on_cpu_engine())
    return result


def _no_pynccl_on_cpu(*args, **kwargs):
    # SGLang's in-tree CPU platform still builds a NCCL communicator for TP > 1 and fails on the
    # CPU device; CPU ranks all-reduce through the gloo group SGLang creates anyway.
    if not _plugin_backend_in_use():
        return None
    kwargs["use_pynccl"] = False
    return args, kwargs


def _last_loc_in_torch(original, req_to_token, req_pool_indices, prefix_lens):
    # SGLang picks its Triton kernel for every backend but torch_native/ascend; Triton cannot run on CPU.
    if not _plugin_backend_in_use():
        return original(req_to_token, req_pool_indices, prefix_lens)
    from sglang.srt.mem_cache.allocation import get_last_loc_torch

    return get_last_loc_torch(req_to_token, req_pool_indices, prefix_lens)


def _plugin_kv_pool(original, configurator, *, kind, default):
    # SGLang picks the DSA pool by model, not by attention backend; the plugin's backends need the
    # plugin's pool (index keys in the model dtype, none for shared layers), SGLang's `dsa` its own.
    if kind == "dsa" and _plugin_backend_in_use():
        from sglang_glm.attention.kv_pool import TorchDSAKVPool

        return TorchDSAKVPool
    return original(configurator, kind=kind, default=default)


def _plugin_index_k_cell_size(original, configurator, *, kvc, num_layers, allocate_all_layers=False):
    # SGLang sizes every DSA index key as FP8 (132 bytes for 128 dims); the plugin's pool keeps them in
    # the KV dtype (256 bytes in BF16), full layers only. Sized SGLang's way, a model whose index keys
    # outweigh its latent rows overfills the GPU at start-up (CUDA OOM at --mem-fraction-static 0.88).
    hf_config = kvc.model_config.hf_config
    if not (is_glm_dsa(hf_config) and _plugin_backend_in_use()):
        return original(configurator, kvc=kvc, num_layers=num_layers, allocate_all_layers=allocate_all_layers)
    from sglang.srt.configs.model_config import dsa_layer_skips_topk

    from sglang_glm.attention.kv_pool import index_k_bytes

    if allocate_all_layers or kvc.is_draft_worker:  # the MTP layer owns an indexer
        full_layers = num_layers
    else:
        first = kvc.layer_info.start_layer
        full_layers = sum(not dsa_layer_skips_topk(hf_config, first + i) for i in range(num_layers))
    return full_layers * index_k_bytes(hf_config.index_head_dim, kvc.kv_cache_dtype)


def _glm_dsa_fp8_kv_on_plugin_backend(model_config, kv_cache_dtype) -> bool:
    import torch

    return (kv_cache_dtype == torch.float8_e4m3fn and is_glm_dsa(model_config.hf_config)
            and _plugin_backend_in_use())


def _fp8_mla_row_bytes(original, *, model_config, kv_cache_dtype):
    # SGLang sizes FP8 DSA rows for latents that are multiples of 128 only (it asserts); the
    # plugin's CPU writer also lays out narrower latents (fp8_kv: one scale for the last group).
    if not _glm_dsa_fp8_kv_on_plugin_backend(model_config, kv_cache_dtype):
        return original(model_config=model_config, kv_cache_dtype=kv_cache_dtype)
    from sglang_glm.attention.fp8_kv import mla_row_bytes

    return mla_row_bytes(model_config.kv_lora_rank, model_config.qk_rope_head_dim)


class _PlatformBesidesCpuFp8Check:
    """SGLang's platform, except that is_cpu() is False: its CPU FP8 check knows only AMX MHA."""

    def __init__(self, platform):
        self._platform = platform

    def is_cpu(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._platform, name)


def _cpu_fp8_kv_for_glm_dsa(original, configurator, *args, **kwargs):
    # SGLang refuses FP8 KV on CPU for every MLA model ("only supported for MHA"); the plugin's
    # pool and CPU backend store and read GLM-DSA's FP8 layouts themselves. The platform read
    # there is this module's only is_cpu() call on the MLA path.
    if not _glm_dsa_fp8_kv_on_plugin_backend(configurator.model_config, configurator.kv_cache_dtype):
        return original(configurator, *args, **kwargs)
    from sglang.srt.mem_cache import kv_cache_configurator as module

    with mock.patch.object(module, "current_platform", _PlatformBesidesCpuFp8Check(module.current_platform)):
        return original(configurator, *args, **kwargs)


def _per_position_acceptance(result, manager, meta_info, recv_obj, i, *args, **kwargs):
    # SGLang reports only the accepted-drafts histogram per request; per-position rates follow from it.
    if not is_glm_dsa(manager.model_config.hf_config):
        return result
    from sglang_glm.mtp.acceptance import report_finished_request

    hist = meta_info.get("spec_correct_drafts_histogram") or []
    steps = getattr(_spec_server_args(), "speculative_num_steps", None) or max(len(hist) - 1, 0)
    report_finished_request(
        meta_info, steps, enable_metrics=getattr(manager, "enable_metrics", False), log=logger
    )
    return result


def _guard_glm_dsa_request(original, manager, obj, input_text, input_ids, *args, **kwargs):
    # SGLang 0.5.23 lets these through to the scheduler, which dies on them and takes the server
    # down, or answers 500; a clear 400 here keeps serving (ValueError becomes the HTTP error).
    if not is_glm_dsa(manager.model_config.hf_config):
        return original(manager, obj, input_text, input_ids, *args, **kwargs)
    from sglang_glm import request_guard

    vocab = manager.model_config.vocab_size
    params = obj.sampling_params if isinstance(obj.sampling_params, dict) else {}
    request_guard.check_before_parsing(params, input_ids, vocab)
    tokenized = original(manager, obj, input_text, input_ids, *args, **kwargs)
    if hasattr(tokenized, "sampling_params"):  # generation, not embedding
        request_guard.check_tokenized(
            tokenized, vocab, greedy_verify_only=on_cpu_engine() and _spec_server_args() is not None
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


def is_glm_dsa(hf_config) -> bool:
    return any(a.startswith("GlmMoeDsaForCausalLM") for a in hf_config.architectures or [])


class Hook(NamedTuple):
    target: str  # dotted path, as SGLang's HookRegistry resolves it
    fn: Callable
    kind: str  # HookType member name: BEFORE, AFTER, AROUND, REPLACE


def hooks() -> list[Hook]:
    """Every hook this process needs: most on every platform, five on the CPU path only."""
    everywhere = [
        Hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class",
             _plugin_kv_pool, "AROUND"),
        Hook("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
             _plugin_index_k_cell_size, "AROUND"),
        Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request",
             _guard_glm_dsa_batch, "AROUND"),
        Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object",
             _guard_glm_dsa_request, "AROUND"),
        Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager.create_abort_task",
             _abort_task_skips_rejected, "AROUND"),
        Hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request",
             _chat_zero_tokens_refused, "AFTER"),
        Hook("sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages",
             _forced_tool_call_grammar, "AFTER"),
        Hook("sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments",
             _glm_dsa_model_adjustments, "AROUND"),
        Hook("sglang.srt.arg_groups.cuda_graph_hook.disable_prefill_cuda_graph_for_deepseek_trtllm_mla",
             _no_prefill_cuda_graph, "AFTER"),
        Hook("sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends",
             _allocate_forward_buffers, "AFTER"),
        Hook("sglang.srt.speculative.draft_utils.DraftBackendFactory.create_decode_backend",
             _draft_decode_backend, "AROUND"),
        Hook("sglang.srt.speculative.draft_utils.DraftBackendFactory.create_draft_extend_backend",
             _draft_extend_backend, "AROUND"),
        Hook("sglang.srt.arg_groups.speculative_hook._handle_eagle_family",
             _validate_glm_dsa_spec, "AROUND"),
        Hook("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs",
             _capture_draft_extend_graph, "AFTER"),
        Hook("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._init_dsa_index_share_state",
             _plugin_draft_shares_its_own_topk, "AFTER"),
        Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics",
             _per_position_acceptance, "AFTER"),
    ]
    if not on_cpu_engine():
        return everywhere
    return everywhere + [
        Hook("sglang.srt.distributed.parallel_state.init_model_parallel_group",
             _no_pynccl_on_cpu, "BEFORE"),
        Hook("sglang.srt.arg_groups.platform_hook.handle_cpu_backends",
             _cpu_backends_with_dsa_default, "AROUND"),
        Hook("sglang.srt.mem_cache.allocation.get_last_loc", _last_loc_in_torch, "AROUND"),
        Hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure",
             _cpu_fp8_kv_for_glm_dsa, "AROUND"),
        Hook("sglang.srt.mem_cache.kv_cache_configurator.calculate_mla_kv_cache_dim",
             _fp8_mla_row_bytes, "AROUND"),
    ]


def apply(hook_list: list[Hook]) -> None:
    """Register the hooks; SGLang's `load_plugins` applies them after all plugins ran."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for hook in hook_list:
        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
