"""Exact top-k positions of each row of fp32 logits, by radix select.

Rule (the reference implements it exactly): among positions [0, key_limit[t]) of row t, keep the
topk highest scores; equal scores -> the lower position wins. The kept positions come back in
ASCENDING POSITION order, padded with -1 when key_limit[t] < topk. (Sparse attention does not
care about order; position order makes the result unique and cheap to write.)

Scores are compared as uint32 keys (`_ordered_key`). Three launches; with `small_row`, a row of at
most that many keys (a decode at a short context, the first queries of a prompt) is selected by a
fourth, `_select_small_kernel`, from registers, the other three skipping it. Off by default: on an H100
(session 36), with both paths in one select kernel, small_row 4096 took 4K rows from 47 to 33 us but
32K rows from 52 to 74 us, the staged path slower beside the register one
(benchmarks/kernels/logs/session36_h100_decode_shapes); they are separate launches since, not yet timed.
  1. `_sample_bound_kernel`, one program per row: an evenly strided sample of 4096 keys gives
     `bound`, a key a few standard deviations below where the k-th key is expected (the sample's
     two leading digits, by histogram); about 1.6-1.9 x topk keys of a 64K-128K row are >= bound.
  2. `_candidates_kernel`, one program per (chunk, row) so a decode batch of 32-64 rows still fills
     the GPU: the keys >= bound and their positions go to the chunk's stretch of `cand_key` /
     `cand_pos`, in position order. This is the only launch that reads whole rows.
  3. `_select_kernel`, one program per row, reads the candidates of the chunks its keys reach as one
     list: radix select (four 8-bit digits, a histogram each), then one ordered walk writes the kept
     positions (a short row in wide logits walks its own chunks, not the width's). Should
     the sample have missed (fewer than topk candidates), the row is walked whole instead: slower,
     same result.
"""

import torch
import triton
import triton.language as tl

SAMPLE = 4096  # keys per row in the sample that places the candidate bound
SMALL_ROW = 0  # rows of at most this many keys (a power of 2 from 16; 0: none) are selected in registers


@triton.jit
def _ordered_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-0.0 counted as +0.0)."""
    u = tl.where(x == 0.0, 0.0, x).to(tl.uint32, bitcast=True)
    return tl.where((u & 0x80000000) != 0, u ^ 0xFFFFFFFF, u | 0x80000000)


@triton.jit
def _masked_histogram(digit, match):
    """256-bin histogram of digit where match (unmatched values go to bin 0 and are taken back out)."""
    bins = tl.arange(0, 256)
    h = tl.histogram(tl.where(match, digit, 0).to(tl.int32), 256)
    return h - tl.where(bins == 0, tl.sum((~match).to(tl.int32), 0), 0)


@triton.jit
def _pick_digit(hist, remaining):
    """The k-th key's digit (the highest bin whose count at-or-above reaches `remaining`) and how
    many keys are still to take among those carrying it."""
    bins = tl.arange(0, 256)
    at_or_above = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
    d = tl.max(tl.where(at_or_above >= remaining, bins, -1), 0)
    return d, remaining - tl.sum(tl.where(bins > d, hist, 0), 0)


@triton.jit
def _sample_bound_kernel(logits_ptr, key_limit_ptr, bound_ptr, stride_lt, topk, SAMPLE: tl.constexpr,
                         SMALL_ROW: tl.constexpr):
    t = tl.program_id(0)
    n = tl.load(key_limit_ptr + t)
    # SMALL_ROW 0 compiles the path without the register branch (the default)
    if SMALL_ROW == 0:
        _store_sample_bound(logits_ptr, bound_ptr, stride_lt, topk, t, n, SAMPLE)
    elif n > SMALL_ROW:
        _store_sample_bound(logits_ptr, bound_ptr, stride_lt, topk, t, n, SAMPLE)


@triton.jit
def _store_sample_bound(logits_ptr, bound_ptr, stride_lt, topk, t, n, SAMPLE: tl.constexpr):
    stride = tl.maximum(tl.cdiv(n, SAMPLE), 1)
    i = tl.arange(0, SAMPLE)
    sampled = i * stride < n
    key = _ordered_key(tl.load(logits_ptr + t.to(tl.int64) * stride_lt + i * stride, mask=sampled, other=0.0))
    m = tl.cdiv(n, stride)  # keys in the sample
    expect = topk * m.to(tl.float32) / tl.maximum(n, 1).to(tl.float32)  # the k-th key's expected rank in the sample
    want = (expect + 6.0 * tl.sqrt(expect) + 8.0).to(tl.int32)  # sampled keys to keep at or above bound
    d0, left = _pick_digit(_masked_histogram(key >> 24, sampled), want)
    d1, _ = _pick_digit(_masked_histogram((key >> 16) & 255, sampled & ((key >> 24) == d0.to(tl.uint32))), left)
    # n <= topk, or a sample too small to cut: bound 0, every key is a candidate
    bound = tl.where((n > topk) & (want < m), (d0.to(tl.uint32) << 24) | (d1.to(tl.uint32) << 16), 0)
    tl.store(bound_ptr + t, bound.to(tl.int32, bitcast=True))


@triton.jit(do_not_specialize=["num_chunks"])  # the row width varies per batch
def _candidates_kernel(logits_ptr, key_limit_ptr, bound_ptr, cand_key_ptr, cand_pos_ptr, num_cand_ptr,
                       stride_lt, stride_ct, num_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                       SMALL_ROW: tl.constexpr):
    c = tl.program_id(0)
    t = tl.program_id(1)
    n = tl.load(key_limit_ptr + t)
    if SMALL_ROW > 0:
        n = tl.where(n > SMALL_ROW, n, 0)  # a small row is the select's alone
    bound = tl.load(bound_ptr + t).to(tl.uint32, bitcast=True)
    row = logits_ptr + t.to(tl.int64) * stride_lt
    stretch = t.to(tl.int64) * stride_ct + c * CHUNK
    written = tl.zeros([], tl.int32)
    for j0 in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, n), BLOCK):
        pos = j0 + tl.arange(0, BLOCK)
        key = _ordered_key(tl.load(row + pos, mask=pos < n, other=0.0))
        keep = (pos < n) & (key >= bound)
        slot = stretch + written + tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.store(cand_key_ptr + slot, key.to(tl.int32, bitcast=True), mask=keep)
        tl.store(cand_pos_ptr + slot, pos, mask=keep)
        written += tl.sum(keep.to(tl.int32), 0)
    tl.store(num_cand_ptr + t.to(tl.int64) * num_chunks + c, written)


@triton.jit
def _candidates_at(cand_key, cand_pos, num_cand, used_chunks, i, length, whole_row, CHUNK: tl.constexpr):
    """Keys and positions of candidates i (a block of list indices): the used chunks' stretches read
    as one list (or, when whole_row, the row itself, read by the caller)."""
    slot = i
    end = tl.zeros([], tl.int32)
    for c in range(used_chunks):
        count = tl.load(num_cand + c)
        end += count
        slot += tl.where(i >= end, CHUNK - count, 0)  # skip the unused tail of chunk c's stretch
    ok = (i < length) & (whole_row == 0)
    key = tl.load(cand_key + slot, mask=ok, other=0).to(tl.uint32, bitcast=True)
    pos = tl.load(cand_pos + slot, mask=ok, other=0)
    return key, pos


@triton.jit
def _row_or_candidates(row, cand_key, cand_pos, num_cand, used_chunks, i, n, length, whole_row, CHUNK: tl.constexpr):
    key, pos = _candidates_at(cand_key, cand_pos, num_cand, used_chunks, i, length, whole_row, CHUNK)
    if whole_row:
        key = _ordered_key(tl.load(row + i, mask=i < n, other=0.0))
        pos = i
    return key, pos


@triton.jit(do_not_specialize=["num_chunks"])
def _select_kernel(logits_ptr, key_limit_ptr, cand_key_ptr, cand_pos_ptr, num_cand_ptr, out_ptr,
                   stride_lt, stride_ct, stride_ot, topk, num_chunks,
                   CHUNK: tl.constexpr, BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr, SMALL_ROW: tl.constexpr):
    t = tl.program_id(0)
    n = tl.load(key_limit_ptr + t)
    if n > SMALL_ROW:  # a row of at most SMALL_ROW keys (> 0) is _select_small_kernel's
        out_row = out_ptr + t.to(tl.int64) * stride_ot
        _select_from_candidates(logits_ptr + t.to(tl.int64) * stride_lt, out_row, cand_key_ptr, cand_pos_ptr,
                                num_cand_ptr, t, n, stride_ct, topk, num_chunks, CHUNK, BLOCK, MAX_CHUNKS)
        _pad(out_row, n, topk, BLOCK)
    elif SMALL_ROW == 0:  # n == 0
        _pad(out_ptr + t.to(tl.int64) * stride_ot, n, topk, BLOCK)


@triton.jit
def _select_small_kernel(logits_ptr, key_limit_ptr, out_ptr, stride_lt, stride_ot, topk, SMALL_ROW: tl.constexpr):
    """A row of at most SMALL_ROW keys, held in registers: radix select on them, then the ordered write.
    A launch of its own, so the staged select's kernel keeps its registers for its own loops."""
    t = tl.program_id(0)
    n = tl.load(key_limit_ptr + t)
    if n <= SMALL_ROW:
        row = logits_ptr + t.to(tl.int64) * stride_lt
        out_row = out_ptr + t.to(tl.int64) * stride_ot
        pos = tl.arange(0, SMALL_ROW)
        ok = pos < n
        key = _ordered_key(tl.load(row + pos, mask=ok, other=0.0))
        thr = tl.zeros([], tl.uint32)
        remaining = tl.zeros([], tl.int32) + topk
        if n > topk:
            prefix_mask = tl.zeros([], tl.uint32)
            for p in tl.static_range(4):
                hist = _masked_histogram((key >> (24 - 8 * p)) & 255, ok & ((key & prefix_mask) == thr))
                d, remaining = _pick_digit(hist, remaining)
                thr = thr | (d.to(tl.uint32) << (24 - 8 * p))
                prefix_mask = prefix_mask | (tl.full([], 255, tl.uint32) << (24 - 8 * p))
        zero = tl.zeros([], tl.int32)
        _take_in_order(out_row, key, pos, ok, thr, remaining, zero, zero)
        _pad(out_row, n, topk, SMALL_ROW)


@triton.jit
def _pad(out_row, n, topk, BLOCK: tl.constexpr):
    """-1 in a row's slots past its n keys (n < topk)."""
    for j0 in range(tl.minimum(n, topk), topk, BLOCK):
        pos = j0 + tl.arange(0, BLOCK)
        tl.store(out_row + pos, tl.full([BLOCK], -1, tl.int32), mask=pos < topk)


@triton.jit
def _take_in_order(out_row, key, pos, ok, thr, remaining, ties_seen, written):
    """Of one block of keys in position order: those above thr, then ties of thr while fewer than
    `remaining` were taken before, written after `written` -> (ties_seen, written) after the block."""
    tie = ok & (key == thr)
    tie_rank = ties_seen + tl.cumsum(tie.to(tl.int32), 0) - 1
    take = (ok & (key > thr)) | (tie & (tie_rank < remaining))
    tl.store(out_row + written + tl.cumsum(take.to(tl.int32), 0) - 1, pos, mask=take)
    return ties_seen + tl.sum(tie.to(tl.int32), 0), written + tl.sum(take.to(tl.int32), 0)


@triton.jit
def _select_from_candidates(row, out_row, cand_key_ptr, cand_pos_ptr, num_cand_ptr, t, n, stride_ct, topk,
                            num_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr):
    cand_key = cand_key_ptr + t.to(tl.int64) * stride_ct
    cand_pos = cand_pos_ptr + t.to(tl.int64) * stride_ct
    num_cand = num_cand_ptr + t.to(tl.int64) * num_chunks
    # chunks past the row's keys hold no candidates, and decode graphs size the logits for the longest context
    used_chunks = tl.minimum(tl.cdiv(n, CHUNK), num_chunks)
    chunks = tl.arange(0, MAX_CHUNKS)
    total = tl.sum(tl.load(num_cand + chunks, mask=chunks < used_chunks, other=0), 0)
    whole_row = total < tl.minimum(n, topk)  # the sample missed: walk the row itself
    length = tl.where(whole_row, n, total)
    # n <= topk: threshold key 0 with every candidate (every key) taken
    thr = tl.zeros([], tl.uint32)
    remaining = tl.zeros([], tl.int32) + topk
    if n > topk:
        prefix_mask = tl.zeros([], tl.uint32)
        for p in tl.static_range(4):
            hist = tl.zeros([256], tl.int32)
            for j0 in range(0, length, BLOCK):
                i = j0 + tl.arange(0, BLOCK)
                key, _ = _row_or_candidates(row, cand_key, cand_pos, num_cand, used_chunks, i, n, length,
                                            whole_row, CHUNK)
                hist += _masked_histogram((key >> (24 - 8 * p)) & 255, (i < length) & ((key & prefix_mask) == thr))
            d, remaining = _pick_digit(hist, remaining)
            thr = thr | (d.to(tl.uint32) << (24 - 8 * p))
            prefix_mask = prefix_mask | (tl.full([], 255, tl.uint32) << (24 - 8 * p))
    # one walk over the candidates in position order: keys above thr, then the first `remaining` ties
    written = tl.zeros([], tl.int32)
    ties_seen = tl.zeros([], tl.int32)
    for j0 in range(0, length, BLOCK):
        i = j0 + tl.arange(0, BLOCK)
        key, pos = _row_or_candidates(row, cand_key, cand_pos, num_cand, used_chunks, i, n, length, whole_row, CHUNK)
        ties_seen, written = _take_in_order(out_row, key, pos, i < length, thr, remaining, ties_seen, written)


def topk_positions(
    logits: torch.Tensor,
    key_limit: torch.Tensor,
    topk: int,
    out: torch.Tensor | None = None,
    chunk: int = 8192,
    block: int = 4096,
    select_block: int = 2048,
    sample: int = SAMPLE,
    small_row: int = SMALL_ROW,
) -> torch.Tensor:
    """logits [T, >= max key_limit] fp32, key_limit [T] int32 -> positions [T, topk] int32.

    chunk/block: keys per program and per loop step of the whole-row launch; select_block: the
    per-row select's step; sample: keys in the bound's sample (a power of 2); small_row: rows of at most
    this many keys (a power of 2 from 16, or 0 for none) are selected in registers by one launch.
    Workspace: two int32 per logit (candidate keys and positions)."""
    assert logits.dtype == torch.float32 and logits.stride(-1) == 1
    assert key_limit.dtype == torch.int32 and key_limit.shape == (logits.shape[0],)
    T, width = logits.shape
    if out is None:
        out = torch.empty(T, topk, dtype=torch.int32, device=logits.device)
    assert out.shape == (T, topk) and out.stride(-1) == 1
    assert small_row == 0 or (small_row >= 16 and small_row & (small_row - 1) == 0), \
        f"small_row={small_row}: a power of 2 from 16, or 0 (off)"
    if T == 0:
        return out
    block = min(chunk, block)
    num_chunks = triton.cdiv(width, chunk)
    bound = torch.empty(T, dtype=torch.int32, device=logits.device)
    cand_key = torch.empty(T, width, dtype=torch.int32, device=logits.device)
    cand_pos = torch.empty(T, width, dtype=torch.int32, device=logits.device)
    num_cand = torch.empty(T, num_chunks, dtype=torch.int32, device=logits.device)
    _sample_bound_kernel[(T,)](logits, key_limit, bound, logits.stride(0), topk, SAMPLE=sample, SMALL_ROW=small_row,
                               num_warps=8)
    _candidates_kernel[(num_chunks, T)](
        logits, key_limit, bound, cand_key, cand_pos, num_cand, logits.stride(0), cand_key.stride(0), num_chunks,
        CHUNK=chunk, BLOCK=block, SMALL_ROW=small_row, num_warps=max(4, min(8, block // 512)),
    )
    _select_kernel[(T,)](
        logits, key_limit, cand_key, cand_pos, num_cand, out, logits.stride(0), cand_key.stride(0), out.stride(0),
        topk, num_chunks, CHUNK=chunk, BLOCK=select_block, MAX_CHUNKS=triton.next_power_of_2(num_chunks),
        SMALL_ROW=small_row, num_warps=max(4, min(8, select_block // 256)),
    )
    if small_row:
        _select_small_kernel[(T,)](logits, key_limit, out, logits.stride(0), out.stride(0), topk, SMALL_ROW=small_row,
                                   num_warps=max(4, min(8, small_row // 256)))
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
