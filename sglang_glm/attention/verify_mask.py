"""EAGLE's target-verify tree mask, as the plugin's backends read it: which draft slots each
verify token sees (its ancestors and itself).

SGLang writes it in one of two layouts: QLEN_ONLY on CPU (per request an n x n block) and
FULL_MASK on GPUs (per request an n x (seq_len + n) block, prefix columns first); the blocks of
the batch lie back to back. Both become one [bs * n, n] bool table, with device ops only.
"""

from __future__ import annotations

import torch


def tree_mask_rows(custom_mask: torch.Tensor, seq_lens: torch.Tensor, n: int) -> torch.Tensor:
    """[bs * n, n] bool: row b * n + j = the draft slots verify token j of request b sees."""
    bs = seq_lens.shape[0]
    if custom_mask.numel() == bs * n * n:  # QLEN_ONLY
        return custom_mask.view(bs * n, n).to(torch.bool)
    seq = seq_lens.long()
    block = n * (seq + n)
    start = torch.cumsum(block, 0) - block
    j = torch.arange(n, device=seq.device)
    idx = (start + seq)[:, None, None] + j[None, :, None] * (seq + n)[:, None, None] + j[None, None, :]
    # CUDA-graph padding rows lie past the batch's mask: clamped, they read a cell no output uses.
    return custom_mask[idx.view(bs * n, n).clamp(max=custom_mask.numel() - 1)].to(torch.bool)
