"""The plugin's attention backends by name, the contract the indexer relies on, and the platform.

Names live here only; `plugin.register` registers them, `sglang_glm.hooks` routes SGLang's choices
by them, the backends report them in errors. Importing this module imports no SGLang.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

TORCH_BACKEND = "glm_dsa_torch"  # plain PyTorch: the CPU backend, the slow reference on CUDA
TRITON_BACKEND = "glm_dsa_triton"  # the plugin's Triton kernels: the CUDA default for GLM-DSA
# name -> (module, backend class, EAGLE multi-step draft backend class), imported on use (the
# Triton backend's kernels are for CUDA machines only). The plugin registers, and its hooks route
# SGLang's choices, from this table alone.
BACKEND_CLASSES = {
    TORCH_BACKEND: ("sglang_glm.attention.torch_dsa_backend", "TorchDSABackend", "TorchDSAMultiStepDraftBackend"),
    TRITON_BACKEND: ("sglang_glm.attention.triton_dsa_backend", "TritonDSABackend", "TritonDSAMultiStepDraftBackend"),
}
PLUGIN_BACKENDS = tuple(BACKEND_CLASSES)


def backend_classes(name: str) -> tuple[type, type]:
    """(attention backend class, multi-step draft backend class) of a plugin backend name."""
    module, backend, draft = BACKEND_CLASSES[name]
    imported = importlib.import_module(module)
    return getattr(imported, backend), getattr(imported, draft)
SGLANG_DSA_BACKEND = "dsa"  # SGLang's own CUDA backend (FlashMLA + DeepGEMM, its own indexer)



def triton_geometry() -> dict:
    """The attention geometry glm_dsa_kernels is built for (`glm_dsa_kernels.layout`: GLM-5's), as
    config.json fields. Other geometries are served by the PyTorch backend."""
    from glm_dsa_kernels import layout

    return {"kv_lora_rank": layout.KV_LORA_RANK, "qk_rope_head_dim": layout.ROPE_DIM,
            "index_n_heads": layout.INDEX_HEADS, "index_head_dim": layout.INDEX_DIM}


def triton_geometry_problem(hf_config) -> str | None:
    """Why the Triton backend cannot serve this model (None when it can)."""
    geometry = triton_geometry()
    wrong = {k: getattr(hf_config, k, None) for k, v in geometry.items() if getattr(hf_config, k, None) != v}
    if not wrong:
        return None
    have = ", ".join(f"{k}={v}" for k, v in wrong.items())
    need = ", ".join(f"{k}={geometry[k]}" for k in wrong)
    return (f"attention backend {TRITON_BACKEND}: its Triton kernels are built for GLM-5's attention geometry "
            f"({need}); this model's config.json has {have}. Serve it with --attention-backend {TORCH_BACKEND} "
            f"(plain PyTorch, exact, slower)")

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

    def store_index_k(self, layer_id: int, index_k: "torch.Tensor", loc: "torch.Tensor") -> None:
        """Write index keys [tokens, index_head_dim] into layer `layer_id`'s cache at KV slots `loc`
        (the forward's `out_cache_loc`, or its real rows under a padded prefill graph)."""

    def index_topk(
        self,
        layer_id: int,
        q: "torch.Tensor",  # [tokens, index_heads, index_head_dim]
        weights: "torch.Tensor",  # [tokens, index_heads], already scaled by index_heads ** -0.5
        sm_scale: float,
        topk: int,
    ) -> "torch.Tensor":
        """Top-k key positions of each query token over its visible keys: [tokens, topk] int32."""
