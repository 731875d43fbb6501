"""Speculative decoding: the plugin's backends in EAGLE's draft-backend maps, the draft-extend CUDA
graph, SGLang's in-tree MTP top-k seed off for the plugin's draft, per-position acceptance."""

from __future__ import annotations

import logging
import time

from sglang_glm.attention.backends import PLUGIN_BACKENDS, TRITON_BACKEND, backend_classes
from sglang_glm.hooks.base import Hook, is_glm_dsa, spec_server_args

logger = logging.getLogger(__name__)


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
    _, draft_backend = backend_classes(name)
    return draft_backend(factory.draft_model_runner, factory.topk, factory.speculative_num_steps)


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


def _per_position_acceptance(result, manager, meta_info, recv_obj, i, *args, **kwargs):
    # SGLang reports only the accepted-drafts histogram per request; per-position rates follow from it.
    if not is_glm_dsa(manager.model_config.hf_config):
        return result
    from sglang_glm.mtp.acceptance import report_finished_request

    hist = meta_info.get("spec_correct_drafts_histogram") or []
    steps = getattr(spec_server_args(), "speculative_num_steps", None) or max(len(hist) - 1, 0)
    report_finished_request(
        meta_info, steps, enable_metrics=getattr(manager, "enable_metrics", False), log=logger
    )
    return result



HOOKS = [
    Hook("sglang.srt.speculative.draft_utils.DraftBackendFactory.create_decode_backend", _draft_decode_backend, "AROUND"),
    Hook("sglang.srt.speculative.draft_utils.DraftBackendFactory.create_draft_extend_backend",
         _draft_extend_backend, "AROUND"),
    Hook("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs",
         _capture_draft_extend_graph, "AFTER"),
    Hook("sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._init_dsa_index_share_state",
         _plugin_draft_shares_its_own_topk, "AFTER"),
    Hook("sglang.srt.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics",
         _per_position_acceptance, "AFTER"),
]
