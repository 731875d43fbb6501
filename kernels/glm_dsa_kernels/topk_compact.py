"""MTP index share: keep each request's top-k row at its last accepted token.

A draft-extend pass writes one top-k row per token (`topk_rows [N, topk]`). Draft steps 1+ reuse
request b's row at its last accepted token, so the rows are gathered into `[B, topk]`:
  linear (chain) verify: request b's rows are cu_rows[b]:cu_rows[b+1], accept_len[b] >= 1,
                         source row = cu_rows[b] + accept_len[b] - 1
  tree verify:           num_draft_tokens rows per request, last_node[b] = the accepted path's
                         last node, source row = b * num_draft_tokens + last_node[b]
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _gather_rows_kernel(
    src_ptr, row_base_ptr, row_off_ptr, out_ptr,
    topk, stride_src, stride_out, rows_per_req, row_off_bias,
    BASE_FROM_CU: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    if BASE_FROM_CU:
        base = tl.load(row_base_ptr + b)
    else:
        base = b * rows_per_req
    row = base + tl.load(row_off_ptr + b) + row_off_bias
    src = src_ptr + row.to(tl.int64) * stride_src
    dst = out_ptr + b.to(tl.int64) * stride_out
    for k0 in range(0, topk, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        tl.store(dst + k, tl.load(src + k, mask=k < topk), mask=k < topk)


def _launch(topk_rows, row_base, row_off, rows_per_req, row_off_bias, out):
    B = row_off.shape[0]
    topk = topk_rows.shape[1]
    assert topk_rows.stride(-1) == 1 and row_off.dtype == torch.int32
    if out is None:
        out = torch.empty(B, topk, dtype=topk_rows.dtype, device=topk_rows.device)
    assert out.shape == (B, topk) and out.stride(-1) == 1
    if B:
        _gather_rows_kernel[(B,)](
            topk_rows, row_base if row_base is not None else row_off, row_off, out,
            topk, topk_rows.stride(0), out.stride(0), rows_per_req, row_off_bias,
            BASE_FROM_CU=row_base is not None, BLOCK=1024, num_warps=4,
        )
    return out


def compact_topk_rows(topk_rows, cu_rows, accept_len, out=None):
    """[N, topk] rows, cu_rows [B+1] int32, accept_len [B] int32 (>= 1) -> [B, topk]."""
    assert cu_rows.dtype == torch.int32
    return _launch(topk_rows, cu_rows, accept_len, 0, -1, out)


def compact_topk_rows_tree(topk_rows, num_draft_tokens, last_node, out=None):
    """[B * num_draft_tokens, topk] rows, last_node [B] int32 -> [B, topk]."""
    return _launch(topk_rows, None, last_node, num_draft_tokens, 0, out)


def compact_topk_rows_ref(topk_rows, cu_rows, accept_len):
    return topk_rows[(cu_rows[:-1] + accept_len - 1).long()]


def compact_topk_rows_tree_ref(topk_rows, num_draft_tokens, last_node):
    rows = torch.arange(last_node.shape[0], device=last_node.device) * num_draft_tokens + last_node
    return topk_rows[rows.long()]


__all__ = ["compact_topk_rows", "compact_topk_rows_tree", "compact_topk_rows_ref", "compact_topk_rows_tree_ref"]
