"""Indexer logical positions -> KV pool rows through the request-to-token table.

Query t's top-k positions count from its request's first token; sparse MLA reads pool rows, so each
position p >= 0 becomes req_to_token[query_req[t], p] and -1 stays -1. One launch per layer: the
plain-torch version (`positions_to_pool_rows_ref`, also the CPU path) takes about eight, which a
batch-1 decode step pays in every layer.
"""

import torch
import triton
import triton.language as tl

BLOCK = 1024  # positions per program: two programs a query at top-k 2048


@triton.jit(do_not_specialize=["stride_table"])
def _pool_rows_kernel(
    positions_ptr, table_ptr, query_req_ptr, out_ptr, topk, stride_pos, stride_table, stride_out, BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = k < topk
    pos = tl.load(positions_ptr + t.to(tl.int64) * stride_pos + k, mask=in_row, other=-1)
    table_row = table_ptr + tl.load(query_req_ptr + t).to(tl.int64) * stride_table
    rows = tl.load(table_row + tl.maximum(pos, 0), mask=in_row & (pos >= 0), other=-1)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + k, rows, mask=in_row)


def positions_to_pool_rows(
    positions: torch.Tensor, req_to_token: torch.Tensor, query_req: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """positions [T, topk] int32 (-1 = none), req_to_token [R, max_len] int32, query_req [T] int32
    -> pool rows [T, topk] int32, -1 kept."""
    assert positions.dtype == req_to_token.dtype == query_req.dtype == torch.int32
    assert positions.stride(-1) == 1 and req_to_token.stride(-1) == 1 and query_req.stride(-1) == 1
    num_queries, topk = positions.shape
    if out is None:
        out = torch.empty_like(positions)
    assert out.shape == positions.shape and out.dtype == torch.int32 and out.stride(-1) == 1
    if num_queries:
        _pool_rows_kernel[(num_queries, triton.cdiv(topk, BLOCK))](
            positions, req_to_token, query_req, out, topk, positions.stride(0), req_to_token.stride(0), out.stride(0),
            BLOCK=BLOCK, num_warps=4,
        )
    return out


def positions_to_pool_rows_ref(
    positions: torch.Tensor, req_to_token: torch.Tensor, query_req: torch.Tensor
) -> torch.Tensor:
    valid = positions >= 0
    rows = req_to_token[query_req.long()[:, None], positions.clamp(min=0).long()]
    return torch.where(valid, rows, torch.full_like(rows, -1)).to(torch.int32)


__all__ = ["positions_to_pool_rows", "positions_to_pool_rows_ref"]
