"""Exact top-k positions of each row of fp32 logits, by radix select.

Rule (the reference implements it exactly): among positions [0, key_limit[t]) of row t, keep the
topk highest scores; equal scores -> the lower position wins. The kept positions come back in
ASCENDING POSITION order, padded with -1 when key_limit[t] < topk. (Sparse attention does not
care about order; position order makes the result unique and cheap to write.)

Each row is cut into chunks, one program per (chunk, row), so a decode batch of 32-64 rows still
fills the GPU. Four launches histogram one 8-bit digit each into hist[T, 4, 256] and pin down the
exact k-th key `thr` (the first over every key with a block histogram, the next three over the few
keys sharing the known prefix, one atomic each); one launch counts keys > thr and == thr per
chunk; the last writes positions, each chunk at its exclusive prefix of kept keys.
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
def _threshold(hist_row, n, topk, num_passes):
    """Key prefix fixed by the first num_passes digits, its mask, and how many keys equal to the
    final threshold are still to take. With n <= topk every valid key is kept: thr 0, all taken."""
    bins = tl.arange(0, 256)
    thr = tl.zeros([], tl.uint32)
    prefix_mask = tl.zeros([], tl.uint32)
    remaining = tl.zeros([], tl.int32) + topk
    if n > topk:
        for p in range(num_passes):
            hist = tl.load(hist_row + p * 256 + bins)
            at_or_above = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
            # the k-th key's digit: the highest bin whose count at-or-above reaches `remaining`
            d_star = tl.max(tl.where(at_or_above >= remaining, bins, -1), 0)
            remaining -= tl.sum(tl.where(bins > d_star, hist, 0), 0)
            shift = (tl.zeros([], tl.int32) + 24 - 8 * p).to(tl.uint32)
            thr = thr | (d_star.to(tl.uint32) << shift)
            prefix_mask = prefix_mask | (tl.full([], 255, tl.uint32) << shift)
    return thr, prefix_mask, remaining


@triton.jit
def _digit_histogram_kernel(
    logits_ptr, key_limit_ptr, hist_ptr, stride_lt, topk, num_pass,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, MATCHES_FEW: tl.constexpr,
):
    """hist[t, num_pass] += histogram of digit num_pass over keys matching the known prefix.

    After the first pass only the keys sharing the k-th key's leading digits match (a few
    percent): MATCHES_FEW counts them with one global atomic each instead of a block histogram."""
    c = tl.program_id(0)
    t = tl.program_id(1)
    n = tl.load(key_limit_ptr + t)
    lo = c * CHUNK
    if (n > topk) & (lo < n):
        hist_row = hist_ptr + t.to(tl.int64) * 1024
        thr, prefix_mask, remaining = _threshold(hist_row, n, topk, num_pass)
        shift = (tl.zeros([], tl.int32) + 24 - 8 * num_pass).to(tl.uint32)  # num_pass may be specialised
        row = logits_ptr + t.to(tl.int64) * stride_lt
        bins = tl.arange(0, 512)
        local = tl.zeros([512], tl.int32)
        for j0 in range(lo, tl.minimum(lo + CHUNK, n), BLOCK):
            pos = j0 + tl.arange(0, BLOCK)
            valid = pos < n
            key = _ordered_key(tl.load(row + pos, mask=valid, other=0.0))
            match = valid & ((key & prefix_mask) == thr)
            if MATCHES_FEW:
                digit = ((key >> shift) & 255).to(tl.int32)
                tl.atomic_add(hist_row + num_pass * 256 + digit, tl.full([BLOCK], 1, tl.int32), mask=match,
                              sem="relaxed")
            else:
                # non-matching keys land in bin 256, outside the 256 digit bins
                digit = tl.where(match, (key >> shift) & 255, 256).to(tl.int32)
                local += tl.histogram(digit, 512)
        if not MATCHES_FEW:
            tl.atomic_add(hist_row + num_pass * 256 + bins, local, mask=(bins < 256) & (local > 0), sem="relaxed")


@triton.jit
def _chunk_counts_kernel(
    logits_ptr, key_limit_ptr, hist_ptr, counts_ptr, stride_lt, topk, num_chunks,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    """counts[t, c] = (#keys > thr, #keys == thr) in chunk c."""
    c = tl.program_id(0)
    t = tl.program_id(1)
    n = tl.load(key_limit_ptr + t)
    thr, _, _ = _threshold(hist_ptr + t.to(tl.int64) * 1024, n, topk, 4)
    row = logits_ptr + t.to(tl.int64) * stride_lt
    above = tl.zeros([], tl.int32)
    ties = tl.zeros([], tl.int32)
    lo = c * CHUNK
    for j0 in range(lo, tl.minimum(lo + CHUNK, n), BLOCK):
        pos = j0 + tl.arange(0, BLOCK)
        valid = pos < n
        key = _ordered_key(tl.load(row + pos, mask=valid, other=0.0))
        above += tl.sum((valid & (key > thr)).to(tl.int32), 0)
        ties += tl.sum((valid & (key == thr)).to(tl.int32), 0)
    cnt = counts_ptr + (t.to(tl.int64) * num_chunks + c) * 2
    tl.store(cnt, above)
    tl.store(cnt + 1, ties)


@triton.jit
def _compact_kernel(
    logits_ptr, key_limit_ptr, hist_ptr, counts_ptr, out_ptr, stride_lt, stride_ot, topk, num_chunks,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
):
    """Write kept positions of chunk c at its exclusive prefix; chunk 0 also writes the -1 tail."""
    c = tl.program_id(0)
    t = tl.program_id(1)
    n = tl.load(key_limit_ptr + t)
    thr, _, remaining = _threshold(hist_ptr + t.to(tl.int64) * 1024, n, topk, 4)
    out_row = out_ptr + t.to(tl.int64) * stride_ot
    if c == 0:
        for j0 in range(tl.minimum(n, topk), topk, BLOCK):
            pos = j0 + tl.arange(0, BLOCK)
            tl.store(out_row + pos, tl.full([BLOCK], -1, tl.int32), mask=pos < topk)
    chunks = tl.arange(0, MAX_CHUNKS)
    before = chunks < c
    cnt = counts_ptr + (t.to(tl.int64) * num_chunks + chunks) * 2
    above_before = tl.sum(tl.load(cnt, mask=before, other=0), 0)
    ties_seen = tl.sum(tl.load(cnt + 1, mask=before, other=0), 0)
    written = above_before + tl.minimum(ties_seen, remaining)
    row = logits_ptr + t.to(tl.int64) * stride_lt
    lo = c * CHUNK
    for j0 in range(lo, tl.minimum(lo + CHUNK, n), BLOCK):
        pos = j0 + tl.arange(0, BLOCK)
        valid = pos < n
        key = _ordered_key(tl.load(row + pos, mask=valid, other=0.0))
        tie = valid & (key == thr)
        tie_rank = ties_seen + tl.cumsum(tie.to(tl.int32), 0) - 1
        take = (valid & (key > thr)) | (tie & (tie_rank < remaining))
        slot = written + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(out_row + slot, pos, mask=take)
        written += tl.sum(take.to(tl.int32), 0)
        ties_seen += tl.sum(tie.to(tl.int32), 0)


def topk_positions(
    logits: torch.Tensor,
    key_limit: torch.Tensor,
    topk: int,
    out: torch.Tensor | None = None,
    chunk: int = 16384,
    block: int = 4096,
) -> torch.Tensor:
    """logits [T, >= max key_limit] fp32, key_limit [T] int32 -> positions [T, topk] int32."""
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    assert key_limit.dtype == torch.int32 and key_limit.shape == (logits.shape[0],)
    T, width = logits.shape
    if out is None:
        out = torch.empty(T, topk, dtype=torch.int32, device=logits.device)
    assert out.shape == (T, topk) and out.stride(-1) == 1
    if T == 0:
        return out
    block = min(chunk, block)
    num_chunks = triton.cdiv(width, chunk)
    hist = torch.zeros(T, 4, 256, dtype=torch.int32, device=logits.device)
    counts = torch.empty(T, num_chunks, 2, dtype=torch.int32, device=logits.device)
    grid = (num_chunks, T)
    warps = max(4, min(8, block // 512))
    for num_pass in range(4):
        _digit_histogram_kernel[grid](
            logits, key_limit, hist, logits.stride(0), topk, num_pass, CHUNK=chunk, BLOCK=block,
            MATCHES_FEW=num_pass > 0, num_warps=warps,
        )
    _chunk_counts_kernel[grid](
        logits, key_limit, hist, counts, logits.stride(0), topk, num_chunks, CHUNK=chunk, BLOCK=block, num_warps=warps
    )
    _compact_kernel[grid](
        logits, key_limit, hist, counts, out, logits.stride(0), out.stride(0), topk, num_chunks,
        CHUNK=chunk, BLOCK=block, MAX_CHUNKS=triton.next_power_of_2(num_chunks), num_warps=warps,
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
