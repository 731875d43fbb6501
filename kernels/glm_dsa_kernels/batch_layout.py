"""The batch layout of a decode-shaped forward, in one launch: decode, MTP target verify, chain draft
steps, draft-extend windows.

Request b of the batch holds n query tokens; query t = b * n + j (j < n) reads its request's keys
through req_to_token[req[b]] and sees key positions [0, key_limit[t]):

    key_limit[t] = positions[t] + 1                                   (from_positions: decode)
    key_limit[t] = max(seq_lens[b] + offset + (j if ramp else 0), 1)  (otherwise)

Target verify: offset 1, ramp (token j sees the prefix and draft slots 0..j), draft_start[t] =
seq_lens[b]; draft step i of a chain: offset i + 1; draft-extend over a window of n tokens that
seq_lens already counts: offset 1 - n, ramp. The index-K page of each page of key positions is
page_table[b, p] = req_to_token[req[b], p * page] // page for p < pages.

One program per request writes its n query rows and its page-table row, so building a forward's
layout costs one launch instead of a dozen small tensor ops and copies into the CUDA-graph buffers.
"""

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl


class BatchLayout(NamedTuple):
    query_req: torch.Tensor  # [T] int32: req_to_token row of query t's keys
    query_batch: torch.Tensor  # [T] int32: request (page-table row) of query t
    key_limit: torch.Tensor  # [T] int32
    page_table: torch.Tensor  # [B, pages] int32
    draft_start: Optional[torch.Tensor]  # [T] int32, target verify only


# Batch shapes vary every step: only the mode (the constexprs) selects a variant.
@triton.jit(do_not_specialize=["stride_slots", "stride_pages", "n", "offset", "pages"])
def _batch_layout_kernel(
    req_ptr, seq_lens_ptr, positions_ptr, req_to_token_ptr, stride_slots,
    query_req_ptr, query_batch_ptr, key_limit_ptr, draft_start_ptr, page_table_ptr, stride_pages,
    n, offset, pages, page,
    FROM_POSITIONS: tl.constexpr, RAMP: tl.constexpr, DRAFT_START: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
):
    b = tl.program_id(0)
    req = tl.load(req_ptr + b).to(tl.int32)
    seq = tl.load(seq_lens_ptr + b).to(tl.int32)
    j = tl.arange(0, BLOCK_N)
    on = j < n
    t = b * n + j
    zero = tl.zeros([BLOCK_N], dtype=tl.int32)
    if FROM_POSITIONS:
        limit = tl.load(positions_ptr + t, mask=on, other=0).to(tl.int32) + 1
    else:
        limit = zero + seq + offset
        if RAMP:
            limit += j
        limit = tl.maximum(limit, 1)
    tl.store(key_limit_ptr + t, limit, mask=on)
    tl.store(query_req_ptr + t, zero + req, mask=on)
    tl.store(query_batch_ptr + t, zero + b, mask=on)
    if DRAFT_START:
        tl.store(draft_start_ptr + t, zero + seq, mask=on)
    slots = req_to_token_ptr + req.to(tl.int64) * stride_slots
    row = page_table_ptr + b.to(tl.int64) * stride_pages
    for p0 in range(0, pages, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        first_slot = tl.load(slots + p.to(tl.int64) * page, mask=p < pages, other=0)
        tl.store(row + p, first_slot // page, mask=p < pages)


def batch_layout(
    req_pool_indices: torch.Tensor,  # [B]
    seq_lens: torch.Tensor,  # [B]
    req_to_token: torch.Tensor,  # [R, W] int32, token slots (page-aligned pages)
    per_request: int,
    pages: int,
    page: int,
    *,
    offset: int = 0,
    ramp: bool = False,
    positions: Optional[torch.Tensor] = None,  # [B * per_request]: key_limit from positions instead
    draft_start: bool = False,
    out: Optional[BatchLayout] = None,  # buffers to fill (CUDA graphs read fixed addresses)
) -> BatchLayout:
    """The layout in one launch; views of `out`'s buffers when given."""
    B, T = req_pool_indices.shape[0], req_pool_indices.shape[0] * per_request
    assert pages * page <= req_to_token.shape[1] + page - 1 and req_to_token.dtype == torch.int32
    dev = req_to_token.device
    if out is None:
        out = BatchLayout(*(torch.empty(T, dtype=torch.int32, device=dev) for _ in range(3)),
                          torch.empty(B, pages, dtype=torch.int32, device=dev),
                          torch.empty(T, dtype=torch.int32, device=dev) if draft_start else None)
    layout = BatchLayout(out.query_req[:T], out.query_batch[:T], out.key_limit[:T], out.page_table[:B, :pages],
                         out.draft_start[:T] if draft_start else None)
    assert all(x.shape[0] == T for x in layout[:3]) and layout.page_table.shape == (B, pages), "out buffers too small"
    assert layout.page_table.stride(1) == 1 and req_to_token.stride(1) == 1
    if B:
        _batch_layout_kernel[(B,)](
            req_pool_indices, seq_lens, positions if positions is not None else seq_lens, req_to_token,
            req_to_token.stride(0), layout.query_req, layout.query_batch, layout.key_limit,
            layout.draft_start if draft_start else layout.key_limit, layout.page_table, layout.page_table.stride(0),
            per_request, offset, pages, page,
            FROM_POSITIONS=positions is not None, RAMP=ramp, DRAFT_START=draft_start,
            BLOCK_N=triton.next_power_of_2(max(per_request, 1)), BLOCK_P=256, num_warps=2,
        )
    return layout


def batch_layout_ref(req_pool_indices, seq_lens, req_to_token, per_request, pages, page, *, offset=0, ramp=False,
                     positions=None, draft_start=False) -> BatchLayout:
    """Plain-torch twin of `batch_layout` (runs anywhere)."""
    dev = req_to_token.device
    B = req_pool_indices.shape[0]
    b = torch.arange(B * per_request, device=dev) // max(per_request, 1)
    j = torch.arange(B * per_request, device=dev) % max(per_request, 1)
    seq = seq_lens.long()[b]
    if positions is not None:
        key_limit = positions.long() + 1
    else:
        key_limit = (seq + offset + (j if ramp else 0)).clamp(min=1)
    page_table = req_to_token[:, ::page][req_pool_indices.long(), :pages] // page
    return BatchLayout(req_pool_indices[b].to(torch.int32), b.to(torch.int32), key_limit.to(torch.int32),
                       page_table.to(torch.int32), seq.to(torch.int32) if draft_start else None)


__all__ = ["BatchLayout", "batch_layout", "batch_layout_ref"]
