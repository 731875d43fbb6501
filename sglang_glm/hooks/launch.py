"""Launch hooks: adapters from SGLang's server-arg resolution to `sglang_glm.launch_policy`, which
decides (model-specific defaults, prefill without CUDA graphs, the MTP draft's prefill graphs, its FP8
head and speculative flags checked at start-up)."""

from __future__ import annotations

import logging

from sglang_glm.attention.backends import on_cpu_engine
from sglang_glm.hooks.base import Hook, is_glm_dsa
from sglang_glm.launch_policy import (
    UserArgs, check_attention_backends, check_draft_head_fp8, check_draft_prefill_graphs, check_spec_algorithm,
    check_spec_args, launch_decisions, prefill_cuda_graphs,
)
from sglang_glm.settings import parse_override, resolve_draft_head_fp8, resolve_draft_prefill_graphs

logger = logging.getLogger(__name__)


def _glm_dsa_model_adjustments(original, server_args, *args, **kwargs):
    """SGLang's model-specific server-arg defaults, then the plugin's decisions declared over them."""
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    hf_config = model_config_of(server_args).hf_config
    user = resolving_view(server_args)  # read before SGLang's defaults fill it
    backends = (user.attention_backend, user.prefill_attention_backend, user.decode_attention_backend)
    if not is_glm_dsa(hf_config):
        check_attention_backends(False, backends)
        return original(server_args, *args, **kwargs)
    given = dict(attention_backends=backends,
                 kv_cache_dtype=user.kv_cache_dtype, page_size=user.page_size, warmups=user.warmups)
    if on_cpu_engine():
        from sglang_glm.cpu_compat.hooks import no_cuda_capability

        with no_cuda_capability():
            result = original(server_args, *args, **kwargs)
    else:
        result = original(server_args, *args, **kwargs)
    # the draft shape may come from SGLang's speculative defaults, set just now
    topk = resolving_view(server_args).speculative_eagle_topk
    decisions = launch_decisions(hf_config, UserArgs(**given, speculative_eagle_topk=topk), on_cpu_engine())
    if decisions:
        declare_resolution(server_args, "sglang_glm", **decisions)
    return result


def _no_prefill_cuda_graph(result, server_args, *args, **kwargs):
    from sglang.srt.arg_groups.model_override_base import (
        attention_backends_of, model_config_of, resolved_view, resolving_view,
    )
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    user = resolving_view(server_args)
    graphs = user.cuda_graph_config
    hf_config = model_config_of(server_args).hf_config
    if not is_glm_dsa(hf_config):
        return result
    backend = attention_backends_of(resolved_view(server_args))[0]
    served = graphs.prefill.backend
    if served != Backend.DISABLED and not prefill_cuda_graphs(backend, user.cuda_graph_backend_prefill):
        logger.info("GLM-DSA with the plugin's attention backend: prefill runs without CUDA graphs "
                    "(--cuda-graph-backend-prefill breakable asks for them on glm_dsa_triton)")
        declare_resolution(
            server_args, "sglang_glm", cuda_graph_config=with_phase(graphs, Phase.PREFILL, backend=Backend.DISABLED)
        )
        served = Backend.DISABLED
    asked = resolve_draft_prefill_graphs(hf_config, parse_override(user.json_model_override_args))
    check_draft_prefill_graphs(asked, backend, served)
    return result


def _validate_glm_dsa_spec(original, server_args, *args, **kwargs):
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view

    glm_dsa = is_glm_dsa(model_config_of(server_args).hf_config)
    if glm_dsa:
        check_spec_algorithm(resolving_view(server_args).speculative_algorithm)
    result = original(server_args, *args, **kwargs)
    if glm_dsa:
        user = resolving_view(server_args)
        check_spec_args(user, on_cpu=on_cpu_engine())
        asked = resolve_draft_head_fp8(model_config_of(server_args).hf_config,
                                       parse_override(user.json_model_override_args))
        check_draft_head_fp8(asked, user.speculative_algorithm)
    return result


HOOKS = [
    Hook("sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments", _glm_dsa_model_adjustments, "AROUND"),
    Hook("sglang.srt.arg_groups.cuda_graph_hook.disable_prefill_cuda_graph_for_deepseek_trtllm_mla",
         _no_prefill_cuda_graph, "AFTER"),
    # the whole speculative resolution, so every algorithm (NGRAM, DFLASH, ...) meets the check, after
    # SGLang's EAGLE defaults are filled
    Hook("sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding", _validate_glm_dsa_spec, "AROUND"),
]
