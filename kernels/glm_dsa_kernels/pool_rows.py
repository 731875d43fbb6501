"""Indexer logical positions -> KV pool rows through the request-to-token table (plain torch)."""

import torch


def positions_to_pool_rows(
    positions: torch.Tensor, req_to_token: torch.Tensor, query_req: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """positions [T, topk] int32 (-1 = none), req_to_token [R, max_len] int32, query_req [T] int32
    -> pool rows [T, topk] int32, -1 kept. One gather; works on CPU and GPU alike."""
    valid = positions >= 0
    rows = req_to_token[query_req.long()[:, None], positions.clamp(min=0).long()]
    rows = torch.where(valid, rows, torch.full_like(rows, -1)).to(torch.int32)
    if out is None:
        return rows
    out.copy_(rows)
    return out


__all__ = ["positions_to_pool_rows"]
