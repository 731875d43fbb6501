"""Exact top-k positions of each row of fp32 logits, by radix select.

Rule (the reference implements it exactly): among positions [0, key_limit[t]) of row t, keep the
topk highest scores; equal scores -> the lower position wins. The kept positions come back in
ASCENDING POSITION order, padded with -1 when key_limit[t] < topk. (Sparse attention does not
care about order; position order makes the result unique and cheap to write.)

One program per row: four 8-bit histogram passes find the exact k-th key, one pass compacts.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _ordered_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-0.0 counted as +0.0)."""
    u = tl.where(x == 0.0, 0.0, x).to(tl.uint32, bitcast=True)
    return tl.where((u & 0x80000000) != 0, u ^ 0xFFFFFFFF, u | 0x80000000)


@triton.jit
def _topk_select_kernel(
    logits_ptr, key_limit_ptr, out_ptr,
    stride_lt, stride_ot, topk,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    n = tl.load(key_limit_ptr + t)
    row = logits_ptr + t.to(tl.int64) * stride_lt
    offs = tl.arange(0, BLOCK)
    bins = tl.arange(0, 512)

    thr = tl.zeros([], tl.uint32)  # every real key is > 0: with n <= topk all valid keys are kept
    remaining = tl.zeros([], tl.int32) + topk
    if n > topk:
        prefix_mask = tl.zeros([], tl.uint32)
        for pass_id in tl.static_range(4):
            shift = 24 - 8 * pass_id
            hist = tl.zeros([512], tl.int32)
            for j0 in range(0, n, BLOCK):
                pos = j0 + offs
                key = _ordered_key(tl.load(row + pos, mask=pos < n, other=0.0))
                match = (pos < n) & ((key & prefix_mask) == thr)
                # non-matching keys land in bin 256, outside the 256 digit bins
                digit = tl.where(match, (key >> shift) & 255, 256).to(tl.int32)
                hist += tl.histogram(digit, 512)
            hist = tl.where(bins < 256, hist, 0)
            at_or_above = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
            # the k-th key's digit: the highest bin whose count at-or-above reaches `remaining`
            d_star = tl.max(tl.where(at_or_above >= remaining, bins, -1), 0)
            above = tl.sum(tl.where(bins > d_star, hist, 0), 0)
            remaining -= above
            thr = thr | (d_star.to(tl.uint32) << shift)
            prefix_mask = prefix_mask | (tl.full([], 255, tl.uint32) << shift)

    # positions in ascending order: all keys > thr, then the first `remaining` keys == thr
    out_row = out_ptr + t.to(tl.int64) * stride_ot
    written = tl.zeros([], tl.int32)
    ties_seen = tl.zeros([], tl.int32)
    for j0 in range(0, n, BLOCK):
        pos = j0 + offs
        valid = pos < n
        key = _ordered_key(tl.load(row + pos, mask=valid, other=0.0))
        tie = valid & (key == thr)
        tie_rank = ties_seen + tl.cumsum(tie.to(tl.int32), 0) - 1
        take = (valid & (key > thr)) | (tie & (tie_rank < remaining))
        slot = written + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(out_row + slot, pos, mask=take)
        written += tl.sum(take.to(tl.int32), 0)
        ties_seen += tl.sum(tie.to(tl.int32), 0)
    for j0 in range(written, topk, BLOCK):
        pos = j0 + offs
        tl.store(out_row + pos, tl.full([BLOCK], -1, tl.int32), mask=pos < topk)


def topk_positions(
    logits: torch.Tensor, key_limit: torch.Tensor, topk: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """logits [T, >= max key_limit] fp32, key_limit [T] int32 -> positions [T, topk] int32."""
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    assert key_limit.dtype == torch.int32 and key_limit.shape == (logits.shape[0],)
    T = logits.shape[0]
    if out is None:
        out = torch.empty(T, topk, dtype=torch.int32, device=logits.device)
    assert out.shape == (T, topk) and out.stride(-1) == 1
    if T:
        _topk_select_kernel[(T,)](
            logits, key_limit, out, logits.stride(0), out.stride(0), topk, BLOCK=2048, num_warps=8
        )
    return out


def topk_positions_ref(logits: torch.Tensor, key_limit: torch.Tensor, topk: int) -> torch.Tensor:
    """Plain-PyTorch twin of topk_positions (same rule, same output order)."""
    T, width = logits.shape
    pos = torch.arange(width, device=logits.device)
    out = torch.full((T, topk), -1, dtype=torch.int32, device=logits.device)
    for t in range(T):
        n = int(key_limit[t])
        # stable sort on descending score keeps the lower position first among equal scores
        order = torch.sort(logits[t, :n], descending=True, stable=True).indices[:topk]
        kept = torch.sort(pos[:n][order]).values
        out[t, : kept.numel()] = kept.to(torch.int32)
    return out


__all__ = ["topk_positions", "topk_positions_ref"]
