"""GLM-DSA's KV-cache layout, in one place (plain PyTorch): geometry, index-K pages, FP8 formats.

The kernels (`indexer`, `sparse_mla`), the plugin's KV pool and its CPU writer, the backends and
the launch checks all read it from here.

MLA latent rows follow FlashMLA's FP8 layout, which `sparse_mla` reads: the kv_lora_rank latent
values as e4m3 codes with one fp32 absmax scale per 128 values, then the rope part in bfloat16.
GLM-5.2 (512 + 64): 512 + 4 x 4 + 64 x 2 = 656 bytes. A model whose latent is not a multiple of
128 (the bundled glm-dsa-mini: 48) gets one scale for its last, shorter group; for multiples of
128 the bytes are exactly FlashMLA's.
Index keys are e4m3 codes with one fp32 absmax scale per token (128 + 4 = 132 bytes for GLM-5.2),
in pages of INDEX_PAGE tokens: a page's codes, then its scales (`pack_index_k_pages`), as
`indexer` reads them.
"""

from __future__ import annotations

import torch

# The attention geometry the Triton kernels are built for (GLM-5's; other models: the PyTorch backend).
KV_LORA_RANK = 512
ROPE_DIM = 64
D_QK = KV_LORA_RANK + ROPE_DIM  # a latent+rope row: what q . k spans
D_V = KV_LORA_RANK  # absorbed MLA attends over the latent
INDEX_HEADS = 32
INDEX_DIM = 128
INDEX_PAGE = 64  # tokens per index-K page: SGLang's DSA page size

GROUP = 128  # latent values per fp32 scale (FlashMLA)
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
MIN_SCALE_AMAX = 1e-4  # absmax floor: an all-zero group still gets a finite, nonzero scale


def num_groups(kv_lora_rank: int) -> int:
    return -(-kv_lora_rank // GROUP)


def mla_row_bytes(kv_lora_rank: int, rope_dim: int) -> int:
    """Bytes of one FP8 latent+rope row: codes, fp32 scales, bfloat16 rope."""
    return kv_lora_rank + 4 * num_groups(kv_lora_rank) + 2 * rope_dim


def index_k_token_bytes(index_head_dim: int) -> int:
    """Bytes of one FP8 index key: codes and its fp32 scale."""
    return index_head_dim + 4


def quantize_mla_rows(latent: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """latent [N, R], rope [N, P] -> uint8 [N, mla_row_bytes(R, P)]."""
    n, r = latent.shape
    groups = num_groups(r)
    pad = groups * GROUP - r
    x = torch.nn.functional.pad(latent.float(), (0, pad)).view(n, groups, GROUP)
    scale = x.abs().amax(-1).clamp(min=MIN_SCALE_AMAX) / E4M3_MAX
    codes = (x / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).view(n, groups * GROUP)[:, :r]
    rope_bytes = rope.to(torch.bfloat16).contiguous().view(torch.uint8).view(n, -1)
    return torch.cat([codes, scale.contiguous().view(torch.uint8).view(n, 4 * groups), rope_bytes], dim=1)


def dequantize_mla_rows(rows: torch.Tensor, kv_lora_rank: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [N, row bytes] -> [N, kv_lora_rank + rope_dim] in dtype."""
    r, groups = kv_lora_rank, num_groups(kv_lora_rank)
    codes = rows[:, :r].contiguous().view(torch.float8_e4m3fn).to(dtype)
    scale = rows[:, r : r + 4 * groups].contiguous().view(torch.float32).to(dtype)  # [N, groups]
    per_value = scale.repeat_interleave(GROUP, dim=1)[:, :r]
    rope = rows[:, r + 4 * groups :].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat([codes * per_value, rope], dim=1)


def quantize_index_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index keys [N, D] -> (e4m3 codes as uint8 [N, D], fp32 scales [N])."""
    kf = k.float()
    amax = kf.abs().amax(-1).clamp(min=MIN_SCALE_AMAX)
    # over a tensor, not a number: torch on CUDA divides by a number as a product with its reciprocal (one ulp
    # off for some keys), and the one-launch store (index_k_store.py) divides exactly
    scale = amax / torch.full_like(amax, E4M3_MAX)
    return (kf / scale[:, None]).to(torch.float8_e4m3fn).view(torch.uint8), scale


def dequantize_index_k(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(uint8 codes [N, D], fp32 scales [N]) -> [N, D] in dtype."""
    return codes.contiguous().view(torch.float8_e4m3fn).to(dtype) * scale.to(dtype)[:, None]


def pack_index_k_pages(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(uint8 codes [pages, INDEX_PAGE, D], fp32 scales [pages, INDEX_PAGE]) -> FP8 pages
    uint8 [pages, INDEX_PAGE * (D + 4)]: each page's codes, then its scales."""
    pages = codes.shape[0]
    return torch.cat([codes.reshape(pages, -1), scale.contiguous().view(torch.uint8).reshape(pages, -1)], dim=1)


def unpack_index_k_pages(k_pages: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 pages -> (uint8 codes [pages, INDEX_PAGE, dim], fp32 scales [pages, INDEX_PAGE])."""
    pages = k_pages.shape[0]
    codes = k_pages[:, : INDEX_PAGE * dim].reshape(pages, INDEX_PAGE, dim)
    return codes, k_pages[:, INDEX_PAGE * dim :].contiguous().view(torch.float32)


FP8_ROW_BYTES = mla_row_bytes(KV_LORA_RANK, ROPE_DIM)  # 656
FP8_INDEX_TOKEN_BYTES = index_k_token_bytes(INDEX_DIM)  # 132
