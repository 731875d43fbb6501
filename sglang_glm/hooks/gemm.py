"""GEMM: SGLang's block-FP8 GEMM runs GLM-5.2's linear shapes with launch configs tuned for them."""

from __future__ import annotations

import functools
from pathlib import Path

from sglang_glm.hooks.base import Hook, announce_tuned, plugin_backend_in_use, tuned_launches

TUNED = Path(__file__).resolve().parents[1] / "gemm_configs"  # made by benchmarks/kernels/tune_fp8_gemm.py


def config_file_name(N: int, K: int, device_name: str, block_n: int, block_k: int) -> str:
    """SGLang's name for a block-FP8 GEMM config file (`get_w8a8_block_fp8_configs`)."""
    return f"N={N},K={K},device_name={device_name.replace(' ', '_')},dtype=fp8_w8a8,block_shape=[{block_n}, {block_k}].json"


@functools.lru_cache(maxsize=None)
def plugin_configs(N, K, block_n, block_k) -> tuple[str, dict[int, dict] | None]:
    """(file name, the plugin's launch table for this GEMM shape on this GPU, or None)."""
    from sglang.kernels.ops.gemm import fp8_kernel

    name = config_file_name(N, K, fp8_kernel.get_device_name(), block_n, block_k)
    return name, tuned_launches(TUNED / name)


def _glm_block_fp8_configs(original, N, K, block_n, block_k):
    # SGLang ships tuned configs only for other models' shapes and otherwise runs one default launch
    # (on the H200 at batch 1 about a fifth of the bandwidth on GLM-5.2's projections)
    import torch

    name, found = plugin_configs(N, K, block_n, block_k)  # cached: other models' shapes pay only this
    if found is not None and plugin_backend_in_use() and not torch._dynamo.is_compiling():
        announce_tuned("block-FP8 GEMM", name)
        return found
    return original(N, K, block_n, block_k)


HOOKS = [
    Hook("sglang.kernels.ops.gemm.fp8_kernel.get_w8a8_block_fp8_configs", _glm_block_fp8_configs, "AROUND"),
]
