"""KV pool for the plugin's DSA backends: latent MLA KV per layer, index keys per full layer.

It keeps SGLang's MLA KV layout and addressing (it subclasses the pool SGLang builds for DSA
models, so every isinstance check holds) but stores index keys for full layers only: a shared
layer owns no index-K memory at all. Two layouts, by the KV dtype SGLang resolves:
- the model dtype or bfloat16: [576]-wide latent+rope rows, index keys [slots, 128] in that dtype;
- fp8_e4m3 (`--kv-cache-dtype fp8_e4m3`): FlashMLA's 656-byte rows (on CUDA SGLang's own DSA
  writer quantizes them, on CPU `layout.quantize_mla_rows`) and index keys in 64-token pages of
  64 x 128 e4m3 bytes followed by 64 fp32 scales (132 bytes a token), the layouts
  `glm_dsa_kernels` reads (`glm_dsa_kernels.layout`, with the formulas for other latent widths).
"""

from __future__ import annotations

import logging
from typing import List, Optional

import torch
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MLATokenToKVPool

from glm_dsa_kernels import layout
from glm_dsa_kernels.index_k_store import store_index_k_fp8, store_index_k_fp8_ref

logger = logging.getLogger(__name__)


def index_k_bytes(index_head_dim: int, kv_dtype: torch.dtype) -> int:
    """Bytes of one token's index key in one full layer: FP8 codes + fp32 scale, or the KV dtype."""
    if kv_dtype == torch.float8_e4m3fn:
        return layout.index_k_token_bytes(index_head_dim)
    return index_head_dim * kv_dtype.itemsize


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
        # Skip DSATokenToKVPool.__init__: it allocates its index-K cache for every layer.
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
            # SGLang sizes FP8 DSA rows at 656 bytes (FlashMLA); other dtypes keep 576 values.
            override_kv_cache_dim=kv_cache_dim if kv_cache_dim != kv_lora_rank + qk_rope_head_dim else None,
        )
        self.index_head_dim = index_head_dim
        self.fp8 = self.dsa_kv_cache_store_fp8
        self.index_dtype = torch.uint8 if self.fp8 else (index_dtype or dtype)
        self.skip_topk_layers = list(skip_topk_layers or [False] * layer_num)
        if len(self.skip_topk_layers) != layer_num:
            raise ValueError(
                f"skip_topk_layers has {len(self.skip_topk_layers)} entries for {layer_num} layers"
            )
        # Row 0 (and the page after `size`) are SGLang's padding slots, as in the latent KV.
        slots = size + page_size
        if self.fp8 and (slots % layout.INDEX_PAGE or page_size % layout.INDEX_PAGE):
            raise ValueError(
                f"the FP8 index-K cache is laid out in {layout.INDEX_PAGE}-token pages; the KV pool "
                f"has page size {page_size}: start with --page-size {layout.INDEX_PAGE}"
            )
        shape = (slots // layout.INDEX_PAGE, layout.INDEX_PAGE * (index_head_dim + 4)) if self.fp8 else (slots, index_head_dim)
        self.index_k_buffer: List[Optional[torch.Tensor]] = [
            None if skip else torch.zeros(shape, dtype=self.index_dtype, device=device)
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
        full, shared = self.bytes_per_token_per_layer()
        logger.info(
            "KV cache bytes per token per layer (%s): full layers %d (MLA %d + index K %d), "
            "shared layers %d (MLA %d)",
            "fp8_e4m3" if self.fp8 else self.dtype, sum(full), full[0], full[1], shared, shared,
        )

    def bytes_per_token_per_layer(self) -> tuple[tuple[int, int], int]:
        """((MLA row, index key) bytes of a full layer, MLA row bytes of a shared layer)."""
        mla = self.kv_buffer[0][0].numel() * self.kv_buffer[0].element_size()
        return (mla, index_k_bytes(self.index_head_dim, torch.float8_e4m3fn if self.fp8 else self.index_dtype)), mla

    def check_served_by(self, backend: str) -> None:
        """Refuse, at start-up, a KV dtype the plugin's backends do not read (never a silent cast)."""
        if not self.fp8 and self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(
                f"{backend} reads the KV cache in float32, bfloat16, float16 or FlashMLA's FP8 layout; "
                f"the KV cache dtype is {self.dtype}: start with --kv-cache-dtype auto, bfloat16 or fp8_e4m3"
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
        buf = self.index_k(layer_id)
        if not self.fp8:
            buf[loc] = index_k.to(self.index_dtype)
            return
        # Per-token absmax scale; codes and scale land in the token's page (FlashMLA-style layout).
        (store_index_k_fp8 if buf.is_cuda else store_index_k_fp8_ref)(index_k, loc, buf)

    def index_k_rows(self, layer_id: int, loc: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Index keys of the slots `loc` as [len(loc), index_head_dim] in dtype (FP8: dequantized)."""
        buf = self.index_k(layer_id)
        if not self.fp8:
            return buf[loc].to(dtype)
        dim = self.index_head_dim
        page, slot = loc // layout.INDEX_PAGE, loc % layout.INDEX_PAGE
        codes = buf[page[:, None], slot[:, None] * dim + torch.arange(dim, device=loc.device)]
        scale = buf[:, layout.INDEX_PAGE * dim :].view(torch.float32)[page, slot]
        return layout.dequantize_index_k(codes, scale, dtype)

    def latent_rows(self, layer_id: int, loc: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Latent+rope rows of the slots `loc` as [len(loc), kv_lora_rank + rope] in dtype (FP8: dequantized)."""
        buf = self.get_key_buffer(layer_id)  # waits for layers still arriving from a host cache
        rows = buf.view(buf.shape[0], -1)[loc]
        if not self.fp8:
            return rows.to(dtype)
        return layout.dequantize_mla_rows(rows.view(torch.uint8), self.kv_lora_rank, dtype)

    def set_mla_kv_buffer(self, layer, loc, cache_k_nope, cache_k_rope, layer_id_override=None):
        # SGLang's FP8 writer is a Triton kernel; on CPU the rows are quantized here, same bytes.
        if not (self.fp8 and torch.device(self.device).type == "cpu"):
            return super().set_mla_kv_buffer(layer, loc, cache_k_nope, cache_k_rope, layer_id_override)
        layer_id = layer.layer_id if layer_id_override is None else layer_id_override
        rows = layout.quantize_mla_rows(cache_k_nope.reshape(loc.shape[0], -1), cache_k_rope.reshape(loc.shape[0], -1))
        self.mla_rows(layer_id)[loc] = rows

    def index_k_pages(self, layer_id: int, page: int) -> torch.Tensor:
        """The index-K cache as the Triton indexer reads it: [pages, page, dim] or FP8 [pages, 64 * 132]."""
        buf = self.index_k(layer_id)
        return buf if self.fp8 else buf.view(-1, page, self.index_head_dim)

    def mla_rows(self, layer_id: int) -> torch.Tensor:
        """Latent+rope rows as stored: [P, 576] in the KV dtype, or FP8 uint8 [P, 656]."""
        buf = self.kv_buffer[layer_id - self.start_layer]
        return buf.view(buf.shape[0], -1)

    @property
    def dtype_for_writes(self) -> torch.dtype:
        """What set_mla_kv_buffer takes: SGLang's FP8 writer quantizes from bfloat16."""
        return torch.bfloat16 if self.fp8 else self.dtype

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor):
        MLATokenToKVPool.move_kv_cache(self, tgt_loc, src_loc)
        if self.fp8:
            raise NotImplementedError("moving FP8 index keys between slots (KV-cache defragmentation)")
        for buf in self.index_k_buffer:
            if buf is not None:
                buf[tgt_loc] = buf[src_loc]

    def _clear_buffers(self):
        MLATokenToKVPool._clear_buffers(self)
        self.index_k_buffer = []

    def host_pool_decls(self):
        return MLATokenToKVPool.host_pool_decls(self)
