"""KV pool for the plain-PyTorch DSA backend: latent MLA KV per layer, index keys per full layer.

SGLang's `DSATokenToKVPool` stores index keys as FP8 with CUDA writers and requires
`index_head_dim == 128`. This pool keeps SGLang's MLA KV layout and addressing (it subclasses the
pool SGLang builds for DSA models, so every isinstance check holds) but stores index keys in the
model dtype, for full layers only: a shared layer owns no index-K memory at all.
"""

from __future__ import annotations

import logging
from typing import List, Optional

import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool

logger = logging.getLogger(__name__)


class TorchDSAKVPool(DSATokenToKVPool):
    def __init__(
        self,
        size: int,
        page_size: int,
        kv_lora_rank: int,
        dtype: torch.dtype,
        qk_rope_head_dim: int,
        layer_num: int,
        device: str,
        index_head_dim: int,
        enable_memory_saver: bool,
        kv_cache_dim: int,
        start_layer: Optional[int] = None,
        end_layer: Optional[int] = None,
        skip_topk_layers: Optional[List[bool]] = None,
        index_dtype: Optional[torch.dtype] = None,
        **unused_dsa_kwargs,  # FP8 index-K paging options of the CUDA pool
    ):
        # Skip DSATokenToKVPool.__init__: it allocates the CUDA FP8 index-K layout.
        MLATokenToKVPool.__init__(
            self,
            size,
            page_size,
            dtype,
            kv_lora_rank,
            qk_rope_head_dim,
            layer_num,
            device,
            enable_memory_saver,
            start_layer,
            end_layer,
            use_dsa=True,
        )
        self.index_head_dim = index_head_dim
        self.index_dtype = index_dtype or dtype
        self.skip_topk_layers = list(skip_topk_layers or [False] * layer_num)
        if len(self.skip_topk_layers) != layer_num:
            raise ValueError(
                f"skip_topk_layers has {len(self.skip_topk_layers)} entries for {layer_num} layers"
            )
        # Row 0 (and the page after `size`) are SGLang's padding slots, as in the latent KV.
        self.index_k_buffer: List[Optional[torch.Tensor]] = [
            None
            if skip
            else torch.zeros(
                (size + page_size, index_head_dim), dtype=self.index_dtype, device=device
            )
            for skip in self.skip_topk_layers
        ]
        self.kpool_use_compress = False
        self._finalize_allocation_log(size)
        logger.info(
            "Index-K cache: %d full layers x %d slots x %d dims (%s); %d shared layers hold none",
            sum(b is not None for b in self.index_k_buffer),
            size + page_size,
            index_head_dim,
            self.index_dtype,
            sum(self.skip_topk_layers),
        )

    def get_kv_size_bytes(self):
        index_bytes = sum(b.numel() * b.element_size() for b in self.index_k_buffer if b is not None)
        return MLATokenToKVPool.get_kv_size_bytes(self) + index_bytes

    def index_k(self, layer_id: int) -> torch.Tensor:
        buf = self.index_k_buffer[layer_id - self.start_layer]
        if buf is None:
            raise RuntimeError(f"layer {layer_id} is a shared layer and owns no index-K cache")
        return buf

    def set_index_k(self, layer_id: int, loc: torch.Tensor, index_k: torch.Tensor) -> None:
        self.index_k(layer_id)[loc] = index_k.to(self.index_dtype)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor):
        MLATokenToKVPool.move_kv_cache(self, tgt_loc, src_loc)
        for buf in self.index_k_buffer:
            if buf is not None:
                buf[tgt_loc] = buf[src_loc]

    def _clear_buffers(self):
        MLATokenToKVPool._clear_buffers(self)
        self.index_k_buffer = []

    def host_pool_decls(self):
        return MLATokenToKVPool.host_pool_decls(self)
