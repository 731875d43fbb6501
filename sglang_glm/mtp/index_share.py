"""MTP index share (`index_share_for_mtp_iteration`): the MTP layer's indexer runs once per round.

The draft-extend pass (the MTP pass over the tokens the target just verified: "draft step 0")
computes one top-k row per token. Draft steps 1+ run no indexer: every draft query of request b
attends to the key positions of b's row at its LAST ACCEPTED token. The draft-extend rows are laid
out request after request (`cu_rows`), and requests accept different numbers of tokens, so the
rows are first compacted to one row per request (`compact_last_accepted`), then stored per request
pool slot so a later draft batch that mixes requests from different draft-extend passes (different
prefill batches, chunked prefill) still reads each request's own row.

With tree drafts (eagle topk > 1) SGLang compacts the accepted path to the front of each request's
window before draft-extend, so the same "row accept_len - 1" rule holds; the draft batch then has
topk query rows per request, and each reads its request's row (`rows_for_draft`).
"""

from __future__ import annotations

import torch


def compact_last_accepted(
    topk_rows: torch.Tensor, row_start: torch.Tensor, accept_len: torch.Tensor
) -> torch.Tensor:
    """[N, topk] rows, row_start [B] (request b's first row), accept_len [B] (>= 1, the bonus
    token counts) -> [B, topk]: row row_start[b] + accept_len[b] - 1.

    On CUDA the Triton kernel `glm_dsa_kernels.topk_compact.compact_topk_rows`, elsewhere its
    plain-torch twin; neither reads a value on the host, so the draft-extend pass stays free of
    host syncs and can be captured in a CUDA graph.
    """
    if topk_rows.is_cuda:
        from glm_dsa_kernels.topk_compact import compact_topk_rows

        return compact_topk_rows(topk_rows, row_start.to(torch.int32), accept_len.to(torch.int32))
    return topk_rows.index_select(0, row_start.to(torch.int64) + accept_len.to(torch.int64) - 1)


class SharedTopkTable:
    """Each request's compacted top-k row, indexed by its req_to_token pool slot.

    Allocated once for every request slot, so storing and reading are fixed-shape device ops.
    Every request runs the MTP indexer (draft-extend after its prefill) before its first draft
    step, so a slot is always written before it is read.
    """

    def __init__(self, num_slots: int, topk: int, device="cpu"):
        self.rows = torch.full((num_slots, topk), -1, dtype=torch.int32, device=device)

    def store(self, req_pool_indices: torch.Tensor, rows: torch.Tensor) -> None:
        self.rows[req_pool_indices.to(torch.int64)] = rows.to(torch.int32)

    def rows_for_draft(self, req_pool_indices: torch.Tensor, per_request: int = 1) -> torch.Tensor:
        """[B * per_request, topk]: request b's row repeated for its per_request draft rows."""
        rows = self.rows[req_pool_indices.to(torch.int64)]
        return rows.repeat_interleave(per_request, dim=0) if per_request > 1 else rows
