"""The hooks only the CPU path needs (applied when SGLANG_USE_CPU_ENGINE=1, never on a GPU machine)."""

from __future__ import annotations

import contextlib

from sglang_glm.attention.backends import TORCH_BACKEND
from sglang_glm.hooks.base import Hook, is_glm_dsa, plugin_backend_in_use


@contextlib.contextmanager
def _replaced(owner, name, value):
    # SGLang reads these attributes at call time; the original is back when the block ends.
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def no_cuda_capability():
    """SGLang's DSA server-arg defaults read the GPU generation unconditionally; on CPU there is
    none, and the choices they make (FP8 KV, DSA kernel names) do not apply to the CPU backend."""
    import torch

    return _replaced(torch.cuda, "get_device_capability", lambda *args, **kwargs: (0, 0))


def _cpu_backends_with_dsa_default(original, server_args, *args, **kwargs):
    # SGLang's CPU default (intel_amx -> torch_native) ignores top-k; GLM-DSA needs sparse attention.
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    user_choice = resolving_view(server_args).attention_backend
    result = original(server_args, *args, **kwargs)
    if user_choice is None and is_glm_dsa(model_config_of(server_args).hf_config):
        declare_resolution(server_args, "sglang_glm", attention_backend=TORCH_BACKEND)
    return result


def _no_pynccl_on_cpu(*args, **kwargs):
    # SGLang's in-tree CPU platform still builds a NCCL communicator for TP > 1 and fails on the
    # CPU device; CPU ranks all-reduce through the gloo group SGLang creates anyway.
    if not plugin_backend_in_use():
        return None
    kwargs["use_pynccl"] = False
    return args, kwargs


def _last_loc_in_torch(original, req_to_token, req_pool_indices, prefix_lens):
    # SGLang picks its Triton kernel for every backend but torch_native/ascend; Triton cannot run on CPU.
    if not plugin_backend_in_use():
        return original(req_to_token, req_pool_indices, prefix_lens)
    from sglang.srt.mem_cache.allocation import get_last_loc_torch

    return get_last_loc_torch(req_to_token, req_pool_indices, prefix_lens)


def _glm_dsa_fp8_kv_on_plugin_backend(model_config, kv_cache_dtype) -> bool:
    import torch

    return (kv_cache_dtype == torch.float8_e4m3fn and is_glm_dsa(model_config.hf_config)
            and plugin_backend_in_use())


def _fp8_mla_row_bytes(original, *, model_config, kv_cache_dtype):
    # SGLang sizes FP8 DSA rows for latents that are multiples of 128 only (it asserts); the
    # plugin's CPU writer also lays out narrower latents (layout: one scale for the last group).
    if not _glm_dsa_fp8_kv_on_plugin_backend(model_config, kv_cache_dtype):
        return original(model_config=model_config, kv_cache_dtype=kv_cache_dtype)
    from glm_dsa_kernels.layout import mla_row_bytes

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

    with _replaced(module, "current_platform", _PlatformBesidesCpuFp8Check(module.current_platform)):
        return original(configurator, *args, **kwargs)



HOOKS = [
    Hook("sglang.srt.distributed.parallel_state.init_model_parallel_group", _no_pynccl_on_cpu, "BEFORE"),
    Hook("sglang.srt.arg_groups.platform_hook.handle_cpu_backends", _cpu_backends_with_dsa_default, "AROUND"),
    Hook("sglang.srt.mem_cache.allocation.get_last_loc", _last_loc_in_torch, "AROUND"),
    Hook("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure", _cpu_fp8_kv_for_glm_dsa, "AROUND"),
    Hook("sglang.srt.mem_cache.kv_cache_configurator.calculate_mla_kv_cache_dim", _fp8_mla_row_bytes, "AROUND"),
]
