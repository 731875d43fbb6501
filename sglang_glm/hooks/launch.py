"""Launch policy: SGLang's model-specific server-arg defaults fitted to GLM-DSA on the plugin's
backends, prefill without CUDA graphs, and speculative flag combinations checked at start-up."""

from __future__ import annotations

import logging

from sglang_glm.attention.backends import PLUGIN_BACKENDS, TRITON_BACKEND, on_cpu_engine, triton_geometry_problem
from sglang_glm.hooks.base import Hook, is_glm_dsa

logger = logging.getLogger(__name__)


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
        from sglang_glm.cpu_compat.hooks import no_cuda_capability

        with no_cuda_capability():
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


def _validate_glm_dsa_spec(original, server_args, *args, **kwargs):
    # Combinations the plugin's MTP path cannot serve fail here, at start-up, by name.
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view

    result = original(server_args, *args, **kwargs)
    if is_glm_dsa(model_config_of(server_args).hf_config):
        from sglang_glm.mtp.validate import check_spec_args

        check_spec_args(resolving_view(server_args), on_cpu=on_cpu_engine())
    return result



HOOKS = [
    Hook("sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments", _glm_dsa_model_adjustments, "AROUND"),
    Hook("sglang.srt.arg_groups.cuda_graph_hook.disable_prefill_cuda_graph_for_deepseek_trtllm_mla",
         _no_prefill_cuda_graph, "AFTER"),
    Hook("sglang.srt.arg_groups.speculative_hook._handle_eagle_family", _validate_glm_dsa_spec, "AROUND"),
]
