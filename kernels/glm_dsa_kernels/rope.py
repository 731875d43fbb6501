"""RoPE of a query and its key from strided views into destinations: one launch, no contiguous copy, no
cat, no in-place write.

  q          [T, H, D]       query rows to rotate (a view into a projection's output; last dim contiguous)
  k          [T, HK, D]      key rows at the same positions (HK small: GLM-DSA's keys have one head)
  positions  [T] int         each row's position
  cos_sin    [P, R] float    SGLang's RotaryEmbedding.cos_sin_cache: cos of the R / 2 frequencies, then sin
  q_out      [T, H, D]       destinations (any views with a contiguous last dim, e.g. the query rows' rope
  k_out      [T, HK, D]      columns), written once: columns [0, R) rotated, [R, D) copied from q / k

Pairs are (2i, 2i + 1) when `interleaved` (GLM's `rope_interleave`, SGLang's is_neox_style False), else
(i, i + R / 2). Computed in float32, as SGLang's CUDA rope kernel does.

GLM-DSA rotates the last 64 of each MLA query head's 256 columns with the key's 64 rope columns, and the
first 64 of each 128-wide index head with the index key. Rotating `.contiguous()` copies and concatenating
(the plugin before session 26) took two to four launches per tensor; a launch per tensor with stride-2
gathers (sessions 26-28) ran at a sixth of the copy bandwidth (benchmarks/kernels/results.md, "MLA glue").
Each program loads whole [heads, D] rows, so the loads are 16-byte vectors wherever the rows are aligned,
and splits the pairs in registers; a position's first program rotates its key rows too.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_rows(
    x_ptr, out_ptr, t, heads, H, stride_xt, stride_xh, stride_ot, stride_oh, cos, sin,
    D: tl.constexpr, R: tl.constexpr, PASS: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK: tl.constexpr,
    ALIGN: tl.constexpr,
):
    in_heads = heads[:, None] < H
    x_row = x_ptr + t * tl.multiple_of(stride_xt, ALIGN) + heads[:, None] * tl.multiple_of(stride_xh, ALIGN)
    o_row = out_ptr + t * tl.multiple_of(stride_ot, ALIGN) + heads[:, None] * tl.multiple_of(stride_oh, ALIGN)
    cols = tl.arange(0, R)[None, :]
    x = tl.load(x_row + cols, mask=in_heads, other=0.0).to(tl.float32)  # [BLOCK, R], whole rows
    if INTERLEAVED:
        x1, x2 = tl.split(tl.reshape(x, [BLOCK, R // 2, 2]))
    else:
        x1, x2 = tl.split(tl.permute(tl.reshape(x, [BLOCK, 2, R // 2]), (0, 2, 1)))
    pairs = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)  # [BLOCK, R // 2, 2]
    if INTERLEAVED:
        rotated = tl.reshape(pairs, [BLOCK, R])
    else:
        rotated = tl.reshape(tl.permute(pairs, (0, 2, 1)), [BLOCK, R])
    tl.store(o_row + cols, rotated.to(out_ptr.dtype.element_ty), mask=in_heads)
    if PASS > 0:
        j = R + tl.arange(0, PASS)
        keep = in_heads & (j[None, :] < D)
        tl.store(o_row + j[None, :], tl.load(x_row + j[None, :], mask=keep).to(out_ptr.dtype.element_ty), mask=keep)


# strides, head counts and the positions' alignment leave the variant alone (a view of positions at an odd
# offset would otherwise build one inside a request); the constexprs and the rows' dtypes select it (warmup.py).
# ALIGN says every row starts on a 16-byte boundary.
@triton.jit(do_not_specialize=["H", "HK", "stride_qt", "stride_qh", "stride_qot", "stride_qoh", "stride_kt",
                               "stride_kh", "stride_kot", "stride_koh", "stride_cache"],
            do_not_specialize_on_alignment=["pos_ptr"])
def _rope_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr, q_out_ptr, k_out_ptr, H, HK,
    stride_qt, stride_qh, stride_qot, stride_qoh, stride_kt, stride_kh, stride_kot, stride_koh, stride_cache,
    D: tl.constexpr, R: tl.constexpr, PASS: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr, ALIGN: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, R // 2)
    cos = tl.load(cache_ptr + pos * stride_cache + i).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * stride_cache + R // 2 + i).to(tl.float32)[None, :]
    _rotate_rows(q_ptr, q_out_ptr, t, block * BLOCK_H + tl.arange(0, BLOCK_H), H, stride_qt, stride_qh,
                 stride_qot, stride_qoh, cos, sin, D, R, PASS, INTERLEAVED, BLOCK_H, ALIGN)
    if block == 0:  # a position's key rows, in the program that holds its cos / sin already
        _rotate_rows(k_ptr, k_out_ptr, t, tl.arange(0, BLOCK_K), HK, stride_kt, stride_kh,
                     stride_kot, stride_koh, cos, sin, D, R, PASS, INTERLEAVED, BLOCK_K, ALIGN)


def _check(q, k, positions, cos_sin, q_out, k_out, rope_dim):
    for x, out in ((q, q_out), (k, k_out)):
        assert x.dim() == 3 and out.shape == x.shape, (tuple(x.shape), tuple(out.shape))
        assert x.stride(-1) == 1 and out.stride(-1) == 1, "rows need a contiguous last dim"
    assert k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2], (tuple(q.shape), tuple(k.shape))
    assert positions.shape == (q.shape[0],) and cos_sin.shape[1] == rope_dim <= q.shape[2]
    assert rope_dim % 2 == 0


def _alignment(*rows: torch.Tensor) -> int:
    """Elements per 16 bytes where every row of every tensor starts on a 16-byte boundary, else 1."""
    vec = 16 // rows[0].element_size()
    aligned = all(r.data_ptr() % 16 == 0 and r.stride(0) % vec == 0 and (r.shape[1] == 1 or r.stride(1) % vec == 0)
                  for r in rows)
    return vec if aligned and all(r.element_size() == rows[0].element_size() for r in rows) else 1


def rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, q_out: torch.Tensor,
         k_out: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x_out[..., :R] = x[..., :R] rotated at positions, x_out[..., R:] = x[..., R:] for x in (q, k);
    R = cos_sin.shape[1]. Returns (q_out, k_out)."""
    rope_dim = cos_sin.shape[1]
    _check(q, k, positions, cos_sin, q_out, k_out, rope_dim)
    assert cos_sin.stride(-1) == 1 and rope_dim & (rope_dim - 1) == 0, "power-of-two rope width"
    T, H, D = q.shape
    HK = k.shape[1]
    if T:
        block_h = min(triton.next_power_of_2(H), 64)
        block_k = triton.next_power_of_2(HK)
        assert block_k <= 64, f"{HK} key heads: a position's key rows are one block"
        rest = D - rope_dim
        _rope_kernel[(T, triton.cdiv(H, block_h))](
            q, k, positions, cos_sin, q_out, k_out, H, HK,
            q.stride(0), q.stride(1), q_out.stride(0), q_out.stride(1),
            k.stride(0), k.stride(1), k_out.stride(0), k_out.stride(1), cos_sin.stride(0),
            D=D, R=rope_dim, PASS=triton.next_power_of_2(rest) if rest else 0, INTERLEAVED=interleaved,
            BLOCK_H=block_h, BLOCK_K=block_k, ALIGN=_alignment(q, k, q_out, k_out), num_warps=4,
        )
    return q_out, k_out


def rope_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, q_out: torch.Tensor,
             k_out: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """rope in plain torch, the CPU path: the formula of SGLang's RotaryEmbedding.forward_native, in float32
    (float64 rows stay float64)."""
    rope_dim = cos_sin.shape[1]
    _check(q, k, positions, cos_sin, q_out, k_out, rope_dim)
    rows = cos_sin[positions.long()][:, None]  # gathered once for the query and its key
    for x, out in ((q, q_out), (k, k_out)):
        dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = rows.to(dtype).chunk(2, dim=-1)
        rot = x[..., :rope_dim].to(dtype)
        x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else rot.chunk(2, dim=-1)
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        out[..., :rope_dim] = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
        out[..., rope_dim:] = x[..., rope_dim:]
    return q_out, k_out


__all__ = ["rope", "rope_ref"]
