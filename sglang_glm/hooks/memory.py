"""Memory: the KV pool follows the attention backend and is sized by what it really stores; the
top-k buffer is allocated once, before CUDA-graph capture."""

from __future__ import annotations

from sglang_glm.hooks.base import Hook, is_glm_dsa, plugin_backend_in_use


def _plugin_kv_pool(original, configurator, *, kind, default):
    # SGLang picks the DSA pool by model, not by attention backend; the plugin's backends need the
    # plugin's pool (index keys in the model dtype, none for shared layers), SGLang's `dsa` its own.
    if kind == "dsa" and plugin_backend_in_use() and is_glm_dsa(configurator.model_config.hf_config):
        from sglang_glm.attention.kv_pool import TorchDSAKVPool

        return TorchDSAKVPool
    return original(configurator, kind=kind, default=default)


def _plugin_index_k_cell_size(original, configurator, *, kvc, num_layers, allocate_all_layers=False):
    # SGLang sizes every DSA index key as FP8 (132 bytes for 128 dims); the plugin's pool keeps them in
    # the KV dtype (256 bytes in BF16), full layers only. Sized SGLang's way, a model whose index keys
    # outweigh its latent rows overfills the GPU at start-up (CUDA OOM at --mem-fraction-static 0.88).
    hf_config = kvc.model_config.hf_config
    if not (is_glm_dsa(hf_config) and plugin_backend_in_use()):
        return original(configurator, kvc=kvc, num_layers=num_layers, allocate_all_layers=allocate_all_layers)
    from sglang.srt.configs.model_config import dsa_layer_skips_topk

    from sglang_glm.attention.kv_pool import index_k_bytes

    if allocate_all_layers or kvc.is_draft_worker:  # the MTP layer owns an indexer
        full_layers = num_layers
    else:
        first = kvc.layer_info.start_layer
        full_layers = sum(not dsa_layer_skips_topk(hf_config, first + i) for i in range(num_layers))
    return full_layers * index_k_bytes(hf_config.index_head_dim, kvc.kv_cache_dtype)


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



HOOKS = [
    Hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class",
         _plugin_kv_pool, "AROUND"),
    Hook("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_dsa_indexer_cell_size",
         _plugin_index_k_cell_size, "AROUND"),
    Hook("sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends",
         _allocate_forward_buffers, "AFTER"),
]
