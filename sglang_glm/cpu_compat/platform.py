"""A CPU platform for GLM-DSA, registered through SGLang's `sglang.srt.platforms` entry point.

It is SGLang's own CPU platform plus what SGLang asks a platform about speculative decoding: the
plugin's DSA backend serves EAGLE's draft and verify passes on CPU.
It activates only when SGLANG_USE_CPU_ENGINE=1, i.e. never on a GPU deployment.
"""

import os
from typing import Optional

from sglang.srt.platforms.cpu import CpuSRTPlatform

QUALNAME = "sglang_glm.cpu_compat.platform.GlmDsaCpuPlatform"


def activate() -> Optional[str]:
    return QUALNAME if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" else None


class GlmDsaCpuPlatform(CpuSRTPlatform):
    def get_default_attention_backend(self) -> str:
        from sglang_glm.attention.torch_dsa_backend import BACKEND_NAME

        return BACKEND_NAME

    # ---- speculative decoding (EAGLE / NEXTN with GLM-DSA's MTP layer) ---------------------

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        # The plugin's DSA backend provides EAGLE's draft / draft-extend / verify passes on CPU.
        return algorithm.upper() in ("EAGLE", "NEXTN")

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        from sglang_glm.attention.torch_dsa_backend import BACKEND_NAME

        return self.supports_speculative_algorithm(algorithm) and backend == BACKEND_NAME

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        from sglang_glm.attention.torch_dsa_backend import BACKEND_NAME

        return BACKEND_NAME
