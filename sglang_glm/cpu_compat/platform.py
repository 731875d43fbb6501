"""A CPU platform for GLM-DSA, registered through SGLang's `sglang.srt.platforms` entry point.

It is SGLang's own CPU platform with one difference: DSA models get the plugin's KV pool, which
keeps index keys in the model dtype for full layers only, instead of the CUDA FP8 index-K pool.
It activates only when SGLANG_USE_CPU_ENGINE=1, i.e. never on a GPU deployment.
"""

import os
from typing import Optional

from sglang.srt.platforms.cpu import CpuSRTPlatform

QUALNAME = "sglang_glm.cpu_compat.platform.GlmDsaCpuPlatform"


def activate() -> Optional[str]:
    return QUALNAME if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" else None


class GlmDsaCpuPlatform(CpuSRTPlatform):
    def get_kv_pool_cls(self, *, kind):
        if kind == "dsa":
            from sglang_glm.attention.kv_pool import TorchDSAKVPool

            return TorchDSAKVPool
        return super().get_kv_pool_cls(kind=kind)

    def get_default_attention_backend(self) -> str:
        from sglang_glm.attention.torch_dsa_backend import BACKEND_NAME

        return BACKEND_NAME
