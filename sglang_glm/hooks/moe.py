"""MoE: SGLang's fused MoE kernel runs GLM-5.2's routed experts with launch configs tuned for them."""

from __future__ import annotations

from pathlib import Path

from sglang_glm.hooks.base import Hook, plugin_backend_in_use, tuned_launches

TUNED = Path(__file__).resolve().parents[1] / "moe_configs"  # made by benchmarks/kernels/tune_fused_moe.py


def _glm_moe_configs(original, E, N, dtype, block_n=0, block_k=0, per_channel_quant=False, down_moe=False):
    # SGLang ships H200 files for other models' (E, N) only and otherwise runs one default launch for
    # every batch, although an expert sees a token or two at decode and verify batches
    import torch
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_config_file_name

    if plugin_backend_in_use() and not torch._dynamo.is_compiling():
        name = get_config_file_name(E, N, dtype, [block_n, block_k], per_channel_quant, down_moe)
        found = tuned_launches(TUNED / name, "fused MoE")
        if found is not None:
            return found
    return original(E, N, dtype, block_n, block_k, per_channel_quant=per_channel_quant, down_moe=down_moe)


HOOKS = [
    Hook("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config.get_moe_configs",
         _glm_moe_configs, "AROUND"),
]
