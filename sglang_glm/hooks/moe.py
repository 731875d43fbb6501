"""MoE: SGLang's fused MoE kernel runs GLM-5.2's routed experts with launch configs tuned for them."""

from __future__ import annotations

import functools
from pathlib import Path

from sglang_glm.hooks.base import Hook, announce_tuned, plugin_backend_in_use, tuned_launches

TUNED = Path(__file__).resolve().parents[1] / "moe_configs"  # made by benchmarks/kernels/tune_fused_moe.py


@functools.lru_cache(maxsize=None)
def plugin_configs(E, N, dtype, block_n, block_k, per_channel_quant, down_moe) -> tuple[str, dict[int, dict] | None]:
    """(file name, the plugin's launch table for this lookup, or None). The down projection takes the up
    table where the plugin ships no `_down` file: that is the pair the tuner timed (SGLang would otherwise
    look for its own `_down` file first, e.g. a TMA launch tuned beside its own up config)."""
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_config_file_name

    name = get_config_file_name(E, N, dtype, [block_n, block_k], per_channel_quant, down_moe)
    found = tuned_launches(TUNED / name)
    if found is None and down_moe:
        return plugin_configs(E, N, dtype, block_n, block_k, per_channel_quant, False)
    return name, found


def deterministic() -> bool:
    """--enable-deterministic-inference: SGLang then runs one batch-invariant launch, which stays."""
    from sglang.srt.runtime_context import get_exec

    return get_exec().deterministic.enable_deterministic_inference


def _glm_moe_configs(original, E, N, dtype, block_n=0, block_k=0, per_channel_quant=False, down_moe=False):
    # SGLang ships H200 files for other models' (E, N) only and otherwise runs one default launch for
    # every batch, although an expert sees a token or two at decode and verify batches
    import torch

    name, found = plugin_configs(E, N, dtype, block_n, block_k, per_channel_quant, down_moe)  # cached
    if found is not None and plugin_backend_in_use() and not torch._dynamo.is_compiling() and not deterministic():
        announce_tuned("fused MoE", name)
        return found
    return original(E, N, dtype, block_n, block_k, per_channel_quant=per_channel_quant, down_moe=down_moe)


HOOKS = [
    Hook("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config.get_moe_configs",
         _glm_moe_configs, "AROUND"),
]
