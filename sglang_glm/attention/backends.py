"""The plugin's attention backends by name, the contract the indexer relies on, and the platform.

Names live here only; `plugin.register` registers them, `sglang_patches` routes SGLang's choices
by them, the backends report them in errors. Importing this module imports no SGLang.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

TORCH_BACKEND = "glm_dsa_torch"  # plain PyTorch: the CPU backend, the slow reference on CUDA
TRITON_BACKEND = "glm_dsa_triton"  # the plugin's Triton kernels: the CUDA default for GLM-DSA
PLUGIN_BACKENDS = (TORCH_BACKEND, TRITON_BACKEND)
SGLANG_DSA_BACKEND = "dsa"  # SGLang's own CUDA backend (FlashMLA + DeepGEMM, its own indexer)

# SGLang's switch to its CPU engine (set by sglang_glm.cpu_compat.activate).
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"


def on_cpu_engine() -> bool:
    """Whether this process runs SGLang's CPU engine: the one place that question is answered."""
    return os.environ.get(CPU_ENGINE_ENV) == "1"


@runtime_checkable
class DsaIndexBackend(Protocol):
    """What `GlmDsaIndexer` asks of the attention backend of the forward (both plugin backends).

    Positions are per request (0 = its first token); -1 pads a row past the visible keys.
    Tie rule: higher score first, equal scores: lower position first.
    """

    def store_index_k(self, layer_id: int, index_k: "torch.Tensor", forward_batch: "ForwardBatch") -> None:
        """Write this forward's index keys [tokens, index_head_dim] into layer `layer_id`'s cache."""

    def index_topk(
        self,
        layer_id: int,
        q: "torch.Tensor",  # [tokens, index_heads, index_head_dim]
        weights: "torch.Tensor",  # [tokens, index_heads], already scaled by index_heads ** -0.5
        sm_scale: float,
        topk: int,
    ) -> "torch.Tensor":
        """Top-k key positions of each query token over its visible keys: [tokens, topk] int32."""
