"""RoPE from a strided view into a destination: one launch, no contiguous copy, no cat, no in-place write.

  x          [T, H, D]       rows to rotate (a view into a projection's output; last dim contiguous)
  positions  [T] int         each row's position
  cos_sin    [P, R] float    SGLang's RotaryEmbedding.cos_sin_cache: cos of the R / 2 frequencies, then sin
  out        [T, H, D]       destination (any view with a contiguous last dim, e.g. the query rows' rope
                             columns), written once: columns [0, R) rotated, [R, D) copied from x

Pairs are (2i, 2i + 1) when `interleaved` (GLM's `rope_interleave`, SGLang's is_neox_style False), else
(i, i + R / 2). Computed in float32, as SGLang's CUDA rope kernel does.

GLM-DSA rotates the last 64 of each MLA query head's 256 columns, the key's 64 rope columns and the first
64 of each 128-wide index head. Rotating a `.contiguous()` copy and concatenating (the plugin before) took
two to four launches and as many passes over the rows per tensor; SGLang's own CUDA rotary rotates in place,
which aliases where a view is already contiguous (a batch-1 key slice, session 25).
"""

import torch
import triton
import triton.language as tl


# strides, head counts and the positions' alignment leave the variant alone (a view of positions at an odd
# offset would otherwise build one inside a request); the constexprs and the rows' dtypes select it (warmup.py).
# ALIGN says every row starts on a 16-byte boundary, so the rope columns load and store as whole vectors.
@triton.jit(do_not_specialize=["H", "stride_xt", "stride_xh", "stride_ot", "stride_oh", "stride_cache"],
            do_not_specialize_on_alignment=["pos_ptr"])
def _rope_kernel(
    x_ptr, pos_ptr, cache_ptr, out_ptr, H, stride_xt, stride_xh, stride_ot, stride_oh, stride_cache,
    D: tl.constexpr, R: tl.constexpr, PASS: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr,
    ALIGN: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_heads = heads[:, None] < H
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, R // 2)
    cos = tl.load(cache_ptr + pos * stride_cache + i).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + R // 2 + i).to(tl.float32)[None, :]
    x_row = x_ptr + t * tl.multiple_of(stride_xt, ALIGN) + heads[:, None] * tl.multiple_of(stride_xh, ALIGN)
    o_row = out_ptr + t * tl.multiple_of(stride_ot, ALIGN) + heads[:, None] * tl.multiple_of(stride_oh, ALIGN)
    cols = tl.arange(0, R)[None, :]
    x = tl.load(x_row + cols, mask=in_heads, other=0.0).to(tl.float32)  # [BLOCK_H, R], whole rows
    # the pairs split in registers, not by strided loads
    if INTERLEAVED:
        x1, x2 = tl.split(tl.reshape(x, [BLOCK_H, R // 2, 2]))
    else:
        x1, x2 = tl.split(tl.permute(tl.reshape(x, [BLOCK_H, 2, R // 2]), (0, 2, 1)))
    pairs = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)  # [BLOCK_H, R // 2, 2]
    if INTERLEAVED:
        rotated = tl.reshape(pairs, [BLOCK_H, R])
    else:
        rotated = tl.reshape(tl.permute(pairs, (0, 2, 1)), [BLOCK_H, R])
    tl.store(o_row + cols, rotated.to(out_ptr.dtype.element_ty), mask=in_heads)
    if PASS > 0:
        j = R + tl.arange(0, PASS)
        keep = in_heads & (j[None, :] < D)
        tl.store(o_row + j[None, :], tl.load(x_row + j[None, :], mask=keep).to(out_ptr.dtype.element_ty), mask=keep)


def _check(x, positions, cos_sin, out, rope_dim):
    assert x.dim() == 3 and out.shape == x.shape, (tuple(x.shape), tuple(out.shape))
    assert x.stride(-1) == 1 and out.stride(-1) == 1, "rows need a contiguous last dim"
    assert positions.shape == (x.shape[0],) and cos_sin.shape[1] == rope_dim <= x.shape[2]
    assert rope_dim % 2 == 0


def _alignment(*rows: torch.Tensor) -> int:
    """Elements per 16 bytes where every row of every tensor starts on a 16-byte boundary, else 1."""
    vec = 16 // rows[0].element_size()
    aligned = all(r.data_ptr() % 16 == 0 and r.stride(0) % vec == 0 and (r.shape[1] == 1 or r.stride(1) % vec == 0)
                  for r in rows)
    return vec if aligned and all(r.element_size() == rows[0].element_size() for r in rows) else 1


def rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, out: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """out[..., :R] = x[..., :R] rotated at positions, out[..., R:] = x[..., R:]; R = cos_sin.shape[1]. Returns out."""
    rope_dim = cos_sin.shape[1]
    _check(x, positions, cos_sin, out, rope_dim)
    assert cos_sin.stride(-1) == 1 and rope_dim & (rope_dim - 1) == 0, "power-of-two rope width"
    T, H, D = x.shape
    if T:
        block_h = min(triton.next_power_of_2(H), 64)
        rest = D - rope_dim
        _rope_kernel[(T, triton.cdiv(H, block_h))](
            x, positions, cos_sin, out, H, x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos_sin.stride(0),
            D=D, R=rope_dim, PASS=triton.next_power_of_2(rest) if rest else 0, INTERLEAVED=interleaved,
            BLOCK_H=block_h, ALIGN=_alignment(x, out), num_warps=4,
        )
    return out


def rope_ref(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, out: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """rope in plain torch, the CPU path: the formula of SGLang's RotaryEmbedding.forward_native, in float32
    (float64 rows stay float64)."""
    rope_dim = cos_sin.shape[1]
    _check(x, positions, cos_sin, out, rope_dim)
    dtype = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos_sin[positions.long()].to(dtype)[:, None].chunk(2, dim=-1)
    rot = x[..., :rope_dim].to(dtype)
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else rot.chunk(2, dim=-1)
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    out[..., :rope_dim] = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
    out[..., rope_dim:] = x[..., rope_dim:]
    return out


__all__ = ["rope", "rope_ref"]
