"""Every change the plugin makes to SGLang internals that SGLang offers no registry for.

Each patch goes through SGLang's own `HookRegistry`, says why in one line, and applies only where
it is needed (the CPU path), so GPU deployments run SGLang's code unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
from unittest import mock

logger = logging.getLogger(__name__)


def _on_cpu() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


@contextlib.contextmanager
def _no_cuda_capability():
    # SGLang's DSA server-arg defaults read the GPU generation unconditionally; on CPU there is
    # none, and the choices they make (FP8 KV, DSA kernel names) do not apply to the CPU backend.
    with mock.patch("torch.cuda.get_device_capability", return_value=(0, 0)):
        yield


def _model_adjustments_without_gpu(original, server_args, *args, **kwargs):
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    user_kv_dtype = resolving_view(server_args).kv_cache_dtype
    with _no_cuda_capability():
        result = original(server_args, *args, **kwargs)
    # The DSA default turns "auto" into a GPU cache dtype; on CPU the cache keeps the model dtype.
    if user_kv_dtype == "auto":
        declare_resolution(server_args, "sglang_glm", kv_cache_dtype="auto")
    return result


def _cpu_backends_with_dsa_default(original, server_args, *args, **kwargs):
    # SGLang's CPU default (intel_amx -> torch_native) ignores top-k; GLM-DSA needs sparse attention.
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    from sglang_glm.attention.torch_dsa_backend import BACKEND_NAME

    user_choice = resolving_view(server_args).attention_backend
    result = original(server_args, *args, **kwargs)
    if user_choice is None and is_glm_dsa(model_config_of(server_args).hf_config):
        declare_resolution(server_args, "sglang_glm", attention_backend=BACKEND_NAME)
    return result


def is_glm_dsa(hf_config) -> bool:
    return any(a.startswith("GlmMoeDsaForCausalLM") for a in hf_config.architectures or [])


def apply() -> None:
    """Register the plugin's hooks; SGLang's `load_plugins` applies them after all plugins ran."""
    if not _on_cpu():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments",
        _model_adjustments_without_gpu,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.arg_groups.platform_hook.handle_cpu_backends",
        _cpu_backends_with_dsa_default,
        HookType.AROUND,
    )
