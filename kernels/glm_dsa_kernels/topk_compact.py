"""MTP index share: keep each request's top-k row at its last accepted token.

A draft-extend pass writes one top-k row per token (`topk_rows [N, topk]`); request b's rows are
cu_rows[b]:cu_rows[b+1] and accept_len[b] >= 1 of them were accepted. Draft steps 1+ reuse request
b's row at its last accepted token, source row = cu_rows[b] + accept_len[b] - 1, gathered into
`[B, topk]` (tree drafts lay out a fixed window per request, so they pass cu_rows of that stride).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _gather_rows_kernel(
    src_ptr, cu_rows_ptr, accept_ptr, out_ptr, topk, stride_src, stride_out, BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(cu_rows_ptr + b) + tl.load(accept_ptr + b) - 1
    src = src_ptr + row.to(tl.int64) * stride_src
    dst = out_ptr + b.to(tl.int64) * stride_out
    for k0 in range(0, topk, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        tl.store(dst + k, tl.load(src + k, mask=k < topk), mask=k < topk)


def compact_topk_rows(topk_rows, cu_rows, accept_len, out=None):
    """[N, topk] rows, cu_rows [B+1] int32, accept_len [B] int32 (>= 1) -> [B, topk]."""
    assert cu_rows.dtype == torch.int32 and accept_len.dtype == torch.int32
    assert topk_rows.stride(-1) == 1
    B, topk = accept_len.shape[0], topk_rows.shape[1]
    if out is None:
        out = torch.empty(B, topk, dtype=topk_rows.dtype, device=topk_rows.device)
    assert out.shape == (B, topk) and out.stride(-1) == 1
    if B:
        _gather_rows_kernel[(B,)](
            topk_rows, cu_rows, accept_len, out, topk, topk_rows.stride(0), out.stride(0),
            BLOCK=1024, num_warps=4,
        )
    return out


def compact_topk_rows_ref(topk_rows, cu_rows, accept_len):
    return topk_rows[(cu_rows[:-1] + accept_len - 1).long()]


__all__ = ["compact_topk_rows", "compact_topk_rows_ref"]
