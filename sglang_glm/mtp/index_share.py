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
    topk_rows: torch.Tensor, cu_rows: torch.Tensor, accept_len: torch.Tensor
) -> torch.Tensor:
    """[N, topk] rows, cu_rows [B+1], accept_len [B] (>= 1) -> [B, topk]: row cu_rows[b] + accept_len[b] - 1.

    Plain-torch twin of `glm_dsa_kernels.topk_compact.compact_topk_rows` (Triton).
    """
    accept_len = accept_len.to(torch.int64)
    if bool((accept_len < 1).any()):
        raise ValueError(f"accept_len must be >= 1 (the bonus token counts), got {accept_len.tolist()}")
    starts = cu_rows[:-1].to(torch.int64)
    if bool((accept_len > cu_rows[1:].to(torch.int64) - starts).any()):
        raise ValueError("a request accepted more tokens than it has draft-extend rows")
    return topk_rows.index_select(0, starts + accept_len - 1)


class SharedTopkTable:
    """Each request's compacted top-k row, indexed by its req_to_token pool slot."""

    def __init__(self, num_slots: int, topk: int, device="cpu"):
        self.rows = torch.full((num_slots, topk), -1, dtype=torch.int32, device=device)
        self.valid = torch.zeros(num_slots, dtype=torch.bool, device=device)

    def _grow(self, num_slots: int) -> None:
        if num_slots <= self.rows.shape[0]:
            return
        grown = max(num_slots, 2 * self.rows.shape[0])
        rows = torch.full((grown, self.rows.shape[1]), -1, dtype=torch.int32, device=self.rows.device)
        valid = torch.zeros(grown, dtype=torch.bool, device=self.rows.device)
        rows[: self.rows.shape[0]] = self.rows
        valid[: self.valid.shape[0]] = self.valid
        self.rows, self.valid = rows, valid

    def store(self, req_pool_indices: torch.Tensor, rows: torch.Tensor) -> None:
        idx = req_pool_indices.to(torch.int64)
        if idx.numel():
            self._grow(int(idx.max()) + 1)
        self.rows[idx] = rows.to(torch.int32)
        self.valid[idx] = True

    def rows_for_draft(self, req_pool_indices: torch.Tensor, per_request: int = 1) -> torch.Tensor:
        """[B * per_request, topk]: request b's row repeated for its per_request draft rows."""
        idx = req_pool_indices.to(torch.int64)
        if idx.numel():
            self._grow(int(idx.max()) + 1)
        if not bool(self.valid[idx].all()):
            missing = idx[~self.valid[idx]].tolist()
            raise RuntimeError(
                f"index share: no draft-extend top-k stored for request slots {missing}; a draft "
                "step ran before the MTP indexer ran for these requests"
            )
        rows = self.rows[idx]
        return rows.repeat_interleave(per_request, dim=0) if per_request > 1 else rows
