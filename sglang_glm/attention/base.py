"""What the plugin's two attention backends share: the KV pool check, index-key writes, the forward
entry points and the KV write before sparse MLA, and EAGLE's one backend per draft step.

A backend subclasses `DSABackend` with its `name` (from `attention/backends.py`), lays out its
metadata in `init_forward_metadata` and implements `index_topk` and `_attend`; its multi-step draft
backend subclasses `MultiStepDraftBackend` with `step_backend` set. `attention/backends.py` lists
both classes under the name, which is all the plugin and its hooks look up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from sglang_glm.attention.backends import DsaIndexBackend

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


class DSABackend(AttentionBackend, DsaIndexBackend):
    name: str  # the backend's registered name: errors and the KV pool check say it

    def __init__(self, model_runner: "ModelRunner"):
        super().__init__()
        self.device = torch.device(model_runner.device)  # SGLang's ModelRunner holds a string ("cuda")
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.token_to_kv_pool.check_served_by(self.name)
        self.forward_metadata = None

    def store_index_k(self, layer_id: int, index_k: torch.Tensor, loc: torch.Tensor):
        self.token_to_kv_pool.set_index_k(layer_id, loc, index_k)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._forward(q, k, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._forward(q, k, layer, forward_batch, save_kv_cache, **kwargs)

    def _forward(self, q, k, layer: "RadixAttention", forward_batch: "ForwardBatch", save_kv_cache: bool,
                 k_rope=None, topk_indices=None, **unused) -> torch.Tensor:
        if topk_indices is None:
            raise ValueError(
                f"{self.name} is a sparse-attention backend: layer {layer.layer_id} must pass "
                "topk_indices from the top-k buffer"
            )
        pool = self.token_to_kv_pool
        if save_kv_cache and k is not None:
            # FP8 pools quantize the rows from bfloat16, as SGLang's CUDA writer does.
            pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k.to(pool.dtype_for_writes),
                                   k_rope.to(pool.dtype_for_writes))
        return self._attend(q, layer, topk_indices)

    def _attend(self, q: torch.Tensor, layer: "RadixAttention", topk_indices: torch.Tensor) -> torch.Tensor:
        """Sparse MLA of this forward's queries over the key positions in topk_indices: [T, heads * v_dim]."""
        raise NotImplementedError


class MultiStepDraftBackend:
    """EAGLE's draft steps 1 .. num_steps - 1 (step 0 runs on the draft model's own backend): one
    `step_backend` per step, each with the layout of its step."""

    step_backend: type  # the DSABackend subclass of each draft step

    def __init__(self, model_runner: "ModelRunner", topk: int, speculative_num_steps: int):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = [self.step_backend(model_runner) for _ in range(max(speculative_num_steps - 1, 0))]
