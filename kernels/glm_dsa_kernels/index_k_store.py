"""FP8 index keys into the index-K pages, one launch per full layer.

Each key [INDEX_DIM] gets an fp32 absmax scale (amax / 448, floored) and is stored as e4m3 codes in its
token's page slot, the scale in the page's scale block (`layout.pack_index_k_pages`), where the indexer
reads them. The plain-torch version (`store_index_k_fp8_ref`, also the CPU path) takes about fifteen
launches (quantize, page/slot arithmetic, two scattered writes), which a decode step paid in every full
layer with `--kv-cache-dtype fp8_e4m3`. Both divide exactly (IEEE: amax by 448, the key by its scale) and round
to e4m3 to nearest-even, so their bytes agree.
"""

import torch
import triton
import triton.language as tl

from .layout import E4M3_MAX, INDEX_PAGE, MIN_SCALE_AMAX, quantize_index_k


@triton.jit
def _e4m3_rtne(x):
    """fp32 values within +-448 -> e4m3fn codes (uint8), rounded to nearest-even on the bits, as torch's
    cast rounds: Triton's interpreter casts another way, so with the bits the CPU tests check the GPU's codes."""
    bits = x.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 255) - 127
    mant = (bits & 0x7FFFFF) | 0x800000
    # keep 3 mantissa bits, fewer below e4m3's smallest normal (2^-6); 25 drops every bit of a zero
    shift = tl.minimum(20 + tl.maximum(-6 - exp, 0), 25)
    one = tl.full(x.shape, 1, tl.int32)
    kept = (mant + (one << (shift - 1)) - 1 + ((mant >> shift) & 1)) >> shift
    # a carry out of the mantissa lands on the next exponent by itself; 126 is 448, the largest finite code
    code = tl.minimum(kept + (tl.maximum(exp, -6) + 6) * 8, 126)
    return (code | ((bits >> 24) & 128)).to(tl.uint8)


@triton.jit
def _store_index_k_fp8_kernel(
    k_ptr, loc_ptr, pages_ptr, stride_k, stride_page, E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr,
    DIM: tl.constexpr, PAGE: tl.constexpr,
):
    t = tl.program_id(0)
    d = tl.arange(0, DIM)
    k = tl.load(k_ptr + t.to(tl.int64) * stride_k + d).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(k), axis=0), MIN_AMAX)
    scale = tl.div_rn(amax + tl.zeros_like(k), E4M3_MAX + tl.zeros_like(k))  # the scale, in every lane
    codes = _e4m3_rtne(tl.div_rn(k, scale))
    loc = tl.load(loc_ptr + t).to(tl.int64)
    page = pages_ptr + (loc // PAGE) * stride_page
    slot = loc % PAGE
    tl.store(page + slot * DIM + d, codes)
    scale_ptr = (page + PAGE * DIM + slot * 4).to(tl.pointer_type(tl.float32))
    tl.store(scale_ptr + d * 0, scale, mask=d == 0)


def store_index_k_fp8(k: torch.Tensor, loc: torch.Tensor, pages: torch.Tensor) -> None:
    """k [T, D] (any float dtype, rows contiguous), loc [T] KV slots, pages uint8 [P, INDEX_PAGE * (D + 4)]:
    each key quantized into slot loc[t] of page loc[t] // INDEX_PAGE."""
    T, dim = k.shape
    assert k.stride(-1) == 1 and pages.dtype == torch.uint8 and pages.stride(-1) == 1
    assert pages.shape[1] == INDEX_PAGE * (dim + 4) and loc.shape == (T,)
    if T:
        _store_index_k_fp8_kernel[(T,)](
            k, loc, pages, k.stride(0), pages.stride(0), E4M3_MAX=E4M3_MAX, MIN_AMAX=MIN_SCALE_AMAX, DIM=dim,
            PAGE=INDEX_PAGE, num_warps=1,
        )


def store_index_k_fp8_ref(k: torch.Tensor, loc: torch.Tensor, pages: torch.Tensor) -> None:
    codes, scale = quantize_index_k(k)
    page, slot = loc // INDEX_PAGE, loc % INDEX_PAGE
    dim = k.shape[1]
    pages[page[:, None], slot[:, None] * dim + torch.arange(dim, device=loc.device)] = codes
    pages[:, INDEX_PAGE * dim :].view(torch.float32)[page, slot] = scale


__all__ = ["store_index_k_fp8", "store_index_k_fp8_ref"]
