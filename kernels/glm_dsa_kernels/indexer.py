"""Lightning indexer (DSA): per-key scores over the paged index-K cache, then exact top-k.

  q          [T, 32, 128] bf16        indexer queries (after RoPE)
  weights    [T, 32] fp32             per-head weights, ALREADY including every scale the caller
                                      wants (GLM-DSA: weights_proj(x) * n_heads^-0.5 * head_dim^-0.5)
  k_cache    paged index-K cache, either
               BF16  [num_pages, P, 128], P = 64 (SGLang's DSA pages) or 1 (page size 1: the page
                     table is then simply each request's token slots)
               FP8   uint8 [num_pages, 64 * 132]: the page's 64 x 128 e4m3 bytes (token-major),
                     then its 64 fp32 scales (k = code * scale), 132 bytes a token
  page_table [B, max_pages] int32     request b's logical page i lives at k_cache[page_table[b, i]]
  query_req  [T] int32                request of query token t
  key_limit  [T] int32                query t sees its request's keys at positions [0, key_limit[t])

  score[t, j] = sum_h weights[t, h] * relu(q[t, h] . k_j)

indexer_logits spreads each query's key blocks over IndexerConfig.programs_per_query programs (decode,
verify, draft steps) or, with IndexerConfig.block_q > 1, scores blocks of consecutive queries per
program (prefill: each key block is read and converted once per block). FP8 keys meet q
in an fp16 dot (keys converted in registers, exact), or, with IndexerConfig.q_terms 1 or 2, in an
e4m3 dot on the keys' own codes (no conversion; q as one e4m3 term, as SGLang's and DeepGEMM's
indexer take it, or as two, which carry a bf16 q's 8 significant bits).

indexer_topk returns logical positions [T, topk] int32 (topk_select's rule: ties -> lower
position, ascending position order, -1 padding). Long prefill chunks are cut into query chunks
so the workspace (fp32 logits + top-k candidate keys and positions) stays under max_logits_bytes.
"""

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import layout
from .layout import FP8_INDEX_TOKEN_BYTES as FP8_TOKEN_BYTES
from .layout import INDEX_DIM as HEAD_DIM
from .layout import INDEX_HEADS as N_HEADS
from .layout import INDEX_PAGE as PAGE_SIZE
from .topk_select import topk_positions
# TRITON_INTERPRET=1 (triton 3.8, CPU) mis-multiplies bf16 tl.dot operands; interpret in fp32
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_DOT_DTYPE = tl.float32 if _INTERPRET else tl.bfloat16
_F16_DTYPE = tl.float32 if _INTERPRET else tl.float16


@dataclass(frozen=True, kw_only=True)  # positional configs would shift when a field is added
class IndexerConfig:
    """Launch shapes; the defaults won sweeps on the H200 (prefill: benchmarks/kernels/logs/raw_logs.tar.gz,
    sweep_run5.log, 12) and the H100 (decode: benchmarks/kernels/logs/session36_h100_decode_shapes)."""

    block_q: int = 1  # queries per program: 1 = the decode kernel, > 1 = the prefill kernel (keys read once a block)
    block_n: int = 64  # keys per dot
    programs_per_query: int = 64  # decode kernel: programs sharing a query's key blocks (strided)
    # prefill kernel: keys one program scores for its query block (0: its key blocks strided over
    # programs_per_query programs, as in the decode kernel: a verify's query blocks in a decode graph)
    keys_per_program: int = 4096
    num_stages: int = 3
    num_warps: int = 4
    topk_chunk: int = 8192  # keys per top-k candidates program (topk_select)
    topk_block: int = 4096  # keys per step of that program
    topk_select_block: int = 2048  # candidates per step of the per-row top-k select
    topk_sample: int = 4096  # keys per row in the sample placing the top-k candidate bound
    topk_small_row: int = 0  # rows of at most this many keys: top-k selected in registers (topk_select.SMALL_ROW)
    q_terms: int = 0  # FP8 keys: 0 = fp16 dot (keys converted), 1 or 2 = e4m3 dot on q's e4m3 terms


def default_config(num_queries: int, queries_per_request: int = 1) -> IndexerConfig:
    """The swept defaults. Decode (one query a program) spreads each query's keys over ~512 programs in
    all: on the H100 that was the fastest of 8-512 programs a query at batch 1-64 x 4K-32K, 1.2-4.3x the
    old 256-4096 keys a program, 0.89-1.05x DeepGEMM's paged logits (session 36,
    benchmarks/kernels/logs/session36_h100_decode_shapes). Prefill
    (queries_per_request >= 64) scores blocks of 4 queries per program, so each key block is read
    and converted once per 4 queries and the dot is a [64 keys, 4 x 32 heads, 128] wgmma."""
    if queries_per_request < 64:
        # 5 stages: 3-5% faster from 32 queries (32 x 32K: 59.9 -> 56.8 us), level at 8, 4% slower at 1
        return IndexerConfig(programs_per_query=max(4, 512 >> max(num_queries - 1, 0).bit_length()),
                             num_stages=5 if num_queries >= 8 else 3)
    keys = min(4096, max(256, 1 << (128 * max(num_queries // 4, 1)).bit_length() - 1))
    # H200 sweep (benchmarks/kernels/logs/raw_logs.tar.gz: sweep_session10_prefill_indexer.log): 424-435 TFLOP/s, 2.0x
    # the per-query kernel; 3 stages edged 5 by 1%; 8 queries or 128 keys a block were slower
    return IndexerConfig(block_q=4, block_n=64, keys_per_program=keys, num_stages=3, num_warps=4)


def _default_for(num_queries: int, page_table: torch.Tensor) -> IndexerConfig:
    """default_config for queries spread over page_table's requests: a prefill chunk brings many
    per request (and takes the query-blocked kernel), decode one, an MTP verify its draft tokens."""
    return default_config(num_queries, queries_per_request=num_queries // max(page_table.shape[0], 1))


@triton.jit
def _pow2(e):
    """2^e as fp32 for integer e in [-126, 127] (built from the exponent bits: exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _dot_operand_q(q, w, K_FP8: tl.constexpr, DOT_DTYPE: tl.constexpr, F16_DTYPE: tl.constexpr):
    """Rows of q (one query head each) as the dot's operand, and their weights w to match."""
    if K_FP8:
        # e4m3 -> fp16 is one instruction per pair (-> bf16 is several), so the dot runs in fp16: each
        # head of q is scaled by a power of two into fp16's range and w takes the inverse (exact)
        amax = tl.max(tl.abs(q), 1).to(tl.float32)  # in bf16 (exact): no fp32 copy of q stays live
        log2_amax = ((amax.to(tl.uint32, bitcast=True) >> 23) & 255).to(tl.int32) - 127
        shift = tl.minimum(tl.maximum(14 - log2_amax, -24), 24)
        q = (q.to(tl.float32) * _pow2(shift)[:, None]).to(F16_DTYPE)
        w = w * _pow2(-shift)
    else:
        q = q.to(DOT_DTYPE)
    return q, w


@triton.jit
def _to_e4m3(x):
    """fp32 -> e4m3: rounded to nearest-even at 3 mantissa bits in the fp32 bits first, so the cast
    itself is exact for e4m3's normal range whatever rounding it does (TRITON_INTERPRET's is not RTNE)."""
    b = x.to(tl.uint32, bitcast=True)
    b = ((b + 0x7FFFF + ((b >> 20) & 1)) >> 20) << 20
    return b.to(tl.float32, bitcast=True).to(tl.float8e4nv)


@triton.jit
def _e4m3_terms(q, w, Q_TERMS: tl.constexpr):
    """Rows of q as e4m3 dot operands: each head scaled by a power of two (amax into [128, 256)),
    then its e4m3 rounding (hi) and, for Q_TERMS 2, the e4m3 rounding of what hi left (lo: a bf16
    value's remaining 4 significant bits, so hi + lo is exact down to 2^-16 of the head's amax);
    w takes the inverse scale (exact). Q_TERMS 1 returns lo = hi, unused."""
    amax = tl.max(tl.abs(q), 1).to(tl.float32)
    log2_amax = ((amax.to(tl.uint32, bitcast=True) >> 23) & 255).to(tl.int32) - 127
    shift = tl.minimum(tl.maximum(7 - log2_amax, -24), 24)
    qs = q.to(tl.float32) * _pow2(shift)[:, None]
    hi = _to_e4m3(qs)
    lo = hi
    if Q_TERMS == 2:
        lo = _to_e4m3(qs - hi.to(tl.float32))
    return hi, lo, w * _pow2(-shift)


@triton.jit
def _qk(q, q_lo, k, Q_TERMS: tl.constexpr):
    """k . q^T, [BLOCK_N, rows] (both e4m3 terms of q for Q_TERMS 2): the keys are the wgmma's
    register operand, the rows of q its shared-memory one."""
    s = tl.dot(k, tl.trans(q))
    if Q_TERMS == 2:
        s = tl.dot(k, tl.trans(q_lo), s)
    return s


@triton.jit
def _key_block(k_ptr, pages_row, j0, n, BLOCK_N: tl.constexpr, K_FP8: tl.constexpr, PAGE: tl.constexpr,
               DOT_DTYPE: tl.constexpr, F16_DTYPE: tl.constexpr, K_CODES: tl.constexpr = False):
    """Keys j0 + [0, BLOCK_N) (j0 < n, a multiple of BLOCK_N) of the request whose page-table row
    starts at pages_row -> (keys [BLOCK_N, 128] as a dot operand, per-key fp32 scale); K_CODES:
    FP8 keys as their e4m3 codes, unconverted. Keys at or past n are 0 or, when read inside a page,
    whatever the page holds: callers store none of them."""
    d = tl.arange(0, 128)
    if BLOCK_N <= PAGE:
        # the block lies in one page: one page-table read, then BLOCK_N consecutive slots, all read
        page = tl.load(pages_row + j0 // PAGE).to(tl.int64)
        slot = j0 % PAGE + tl.arange(0, BLOCK_N)
        valid = tl.full([BLOCK_N], 1, tl.int1)  # a constant mask: the loads are unmasked
    else:
        pos = j0 + tl.arange(0, BLOCK_N)
        valid = pos < n
        page = tl.load(pages_row + pos // PAGE, mask=valid, other=0).to(tl.int64)
        slot = pos % PAGE
    if K_FP8:
        row = k_ptr.to(tl.pointer_type(tl.float8e4nv)) + page * (PAGE * 132) + slot * 128
        k = tl.load(row[:, None] + d[None, :], mask=valid[:, None], other=0.0)
        if not K_CODES:
            k = k.to(F16_DTYPE)  # exact in fp16
        scale = tl.load(k_ptr.to(tl.pointer_type(tl.float32)) + page * (PAGE * 33) + PAGE * 32 + slot,
                        mask=valid, other=0.0)
    else:
        row = k_ptr + (page * PAGE + slot) * 128
        k = tl.load(row[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(DOT_DTYPE)
        scale = tl.full([BLOCK_N], 1.0, tl.float32)  # a constant: the compiler drops the multiply
    return k, scale


@triton.jit(do_not_specialize=["stride_pb"])  # page-table width varies per batch
def _indexer_logits_kernel(
    q_ptr, w_ptr, k_ptr, page_table_ptr, query_req_ptr, key_limit_ptr, logits_ptr,
    stride_qt, stride_qh, stride_wt, stride_pb, stride_lt,
    K_FP8: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    DOT_DTYPE: tl.constexpr, F16_DTYPE: tl.constexpr, Q_TERMS: tl.constexpr,
):
    """The grid's P programs of query t score its key blocks p, p + P, p + 2P, ... (q loaded once),
    so a query's keys spread over all P programs at any context, and a decode graph sized for the
    longest context launches P programs a query, not one per stretch of the width. The dot is
    k . q^T, [BLOCK_N, 32], so sm_90's wgmma (64 rows or more) takes the keys from the registers they
    were converted in (q . k^T ran 5-10% slower: benchmarks/kernels/logs/session36_h100_decode_shapes)."""
    p = tl.program_id(0)
    t = tl.program_id(1)
    n = tl.load(key_limit_ptr + t)
    if p * BLOCK_N < n:
        h = tl.arange(0, 32)
        d = tl.arange(0, 128)
        q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + h[:, None] * stride_qh + d[None, :])
        w = tl.load(w_ptr + t.to(tl.int64) * stride_wt + h)
        if Q_TERMS > 0:
            q, q_lo, w = _e4m3_terms(q, w, Q_TERMS)
        else:
            q, w = _dot_operand_q(q, w, K_FP8, DOT_DTYPE, F16_DTYPE)
            q_lo = q
        b = tl.load(query_req_ptr + t)
        pages_row = page_table_ptr + b.to(tl.int64) * stride_pb
        out_row = logits_ptr + t.to(tl.int64) * stride_lt
        step = tl.num_programs(0) * BLOCK_N
        for j0 in tl.range(p * BLOCK_N, n, step, num_stages=NUM_STAGES):
            k, scale = _key_block(k_ptr, pages_row, j0, n, BLOCK_N, K_FP8, PAGE, DOT_DTYPE, F16_DTYPE, Q_TERMS > 0)
            pos = j0 + tl.arange(0, BLOCK_N)
            s = _qk(q, q_lo, k, Q_TERMS)  # [BLOCK_N, 32]
            # relu(q . k * scale) = scale * relu(q . k) for scale > 0
            score = tl.sum(tl.maximum(s, 0.0) * w[None, :], 1) * scale
            tl.store(out_row + pos, score, mask=pos < n)


@triton.jit(do_not_specialize=["T", "stride_pb"])  # query count and page-table width vary per batch
def _indexer_logits_blocked_kernel(
    q_ptr, w_ptr, k_ptr, page_table_ptr, query_req_ptr, key_limit_ptr, logits_ptr,
    T, stride_qt, stride_qh, stride_wt, stride_pb, stride_lt,
    K_FP8: tl.constexpr, PAGE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    KEYS_PER_PROGRAM: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_DTYPE: tl.constexpr, F16_DTYPE: tl.constexpr,
    Q_TERMS: tl.constexpr,
):
    """One program scores KEYS_PER_PROGRAM keys for BLOCK_Q consecutive queries (prefill), BLOCK_N
    keys at a time; KEYS_PER_PROGRAM 0: the grid's P programs of a query block take its key blocks
    p, p + P, ... as the decode kernel does (an MTP verify's draft tokens under a decode graph). q and w of the block, [BLOCK_Q * 32, 128] and [BLOCK_Q * 32], are loaded and
    scaled once; each key block is read and converted once for all BLOCK_Q queries. The dot is
    S^T = k . q^T, [BLOCK_N, BLOCK_Q * 32]: with the keys on the left, sm_90's wgmma takes them
    from the registers they were converted in (q stays in shared memory), and each query's sum
    over its 32 heads stays inside an accumulator row (adds in the thread, then quad shuffles).
    The block's queries may belong to several requests: one pass per request present (usually
    one) reads that request's page-table row up to its queries' largest key_limit and stores only
    its queries' logits; nothing at or past a query's key_limit is written."""
    if KEYS_PER_PROGRAM > 0:
        lo = tl.program_id(0) * KEYS_PER_PROGRAM
        step = BLOCK_N
    else:
        lo = tl.program_id(0) * BLOCK_N
        step = tl.num_programs(0) * BLOCK_N
    t0 = tl.program_id(1) * BLOCK_Q
    tq = t0 + tl.arange(0, BLOCK_Q)
    limit = tl.load(key_limit_ptr + tq, mask=tq < T, other=0)
    if lo < tl.max(limit, 0):
        r = tl.arange(0, BLOCK_Q * 32)  # row r: head r % 32 of query t0 + r // 32
        t_row = t0 + r // 32
        d = tl.arange(0, 128)
        q = tl.load(q_ptr + t_row.to(tl.int64)[:, None] * stride_qt + (r % 32)[:, None] * stride_qh + d[None, :],
                    mask=(t_row < T)[:, None], other=0.0)
        w = tl.load(w_ptr + t_row.to(tl.int64) * stride_wt + r % 32, mask=t_row < T, other=0.0)
        if Q_TERMS > 0:
            q, q_lo, w = _e4m3_terms(q, w, Q_TERMS)
        else:
            q, w = _dot_operand_q(q, w, K_FP8, DOT_DTYPE, F16_DTYPE)
            q_lo = q
        req = tl.load(query_req_ptr + tq, mask=tq < T, other=0)
        out = logits_ptr + tq.to(tl.int64)[None, :] * stride_lt
        todo = limit > lo  # queries with keys in this program's range (none past T: limit 0 there)
        while tl.max(todo.to(tl.int32), 0) > 0:
            b = tl.min(tl.where(todo, req, 2147483647), 0)  # the next request of the block
            lim = tl.where(todo & (req == b), limit, 0)  # 0: another request's query, stored in its own pass
            todo = todo & (req != b)
            n = tl.max(lim, 0)
            pages_row = page_table_ptr + b.to(tl.int64) * stride_pb
            if KEYS_PER_PROGRAM > 0:
                end = tl.minimum(lo + KEYS_PER_PROGRAM, n)
            else:
                end = n
            for j0 in tl.range(lo, end, step, num_stages=NUM_STAGES):
                k, scale = _key_block(k_ptr, pages_row, j0, n, BLOCK_N, K_FP8, PAGE, DOT_DTYPE, F16_DTYPE, Q_TERMS > 0)
                pos = j0 + tl.arange(0, BLOCK_N)
                s = _qk(q, q_lo, k, Q_TERMS)  # [BLOCK_N, BLOCK_Q * 32]
                p = tl.reshape(tl.maximum(s, 0.0) * w[None, :], [BLOCK_N, BLOCK_Q, 32])
                score = tl.sum(p, 2) * scale[:, None]  # [BLOCK_N, BLOCK_Q]
                tl.store(out + pos[:, None], score, mask=pos[:, None] < lim[None, :])


def page_size(k_cache: torch.Tensor) -> int:
    """Tokens per index-K page: 64 for FP8 pages, the middle dimension of BF16 ones."""
    return PAGE_SIZE if k_cache.dtype == torch.uint8 else k_cache.shape[1]


def _check_inputs(q, weights, k_cache, page_table, query_req, key_limit):
    assert q.dtype == torch.bfloat16 and q.shape[1:] == (N_HEADS, HEAD_DIM) and q.stride(-1) == 1
    assert weights.dtype == torch.float32 and weights.shape == q.shape[:2] and weights.stride(-1) == 1
    assert page_table.dtype == torch.int32 and page_table.stride(-1) == 1
    assert query_req.dtype == torch.int32 and key_limit.dtype == torch.int32
    k_fp8 = k_cache.dtype == torch.uint8
    if k_fp8:
        assert k_cache.dim() == 2 and k_cache.shape[1] == PAGE_SIZE * FP8_TOKEN_BYTES and k_cache.is_contiguous()
    else:
        assert k_cache.dtype == torch.bfloat16 and k_cache.shape[1] in (1, PAGE_SIZE) and k_cache.shape[2] == HEAD_DIM
        assert k_cache.is_contiguous()
    return k_fp8


def indexer_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_req: torch.Tensor,
    key_limit: torch.Tensor,
    logits: torch.Tensor,
    config: IndexerConfig | None = None,
) -> torch.Tensor:
    """Fill logits [T, >= max key_limit] fp32 at [t, 0:key_limit[t]]; the rest is left as is."""
    k_fp8 = _check_inputs(q, weights, k_cache, page_table, query_req, key_limit)
    T = q.shape[0]
    assert logits.dtype == torch.float32 and logits.shape[0] == T and logits.stride(-1) == 1
    if T:
        c = config or _default_for(T, page_table)
        args = (q, weights, k_cache, page_table, query_req, key_limit, logits)
        strides = (q.stride(0), q.stride(1), weights.stride(0), page_table.stride(0), logits.stride(0))
        if c.q_terms not in (0, 1, 2) or (c.q_terms and not k_fp8):
            raise ValueError(f"IndexerConfig.q_terms={c.q_terms}: 0, or 1 or 2 with FP8 index keys (the keys here are "
                             f"{k_cache.dtype}); use 0")
        meta = dict(K_FP8=k_fp8, PAGE=page_size(k_cache), BLOCK_N=c.block_n, NUM_STAGES=c.num_stages,
                    DOT_DTYPE=_DOT_DTYPE, F16_DTYPE=_F16_DTYPE, Q_TERMS=c.q_terms, num_warps=c.num_warps)
        if c.block_q == 1:
            programs = min(c.programs_per_query, triton.cdiv(logits.shape[1], c.block_n))
            _indexer_logits_kernel[(programs, T)](*args, *strides, **meta)
        else:
            assert c.keys_per_program % c.block_n == 0  # key blocks start at multiples of block_n
            spread = (triton.cdiv(logits.shape[1], c.keys_per_program) if c.keys_per_program
                      else min(c.programs_per_query, triton.cdiv(logits.shape[1], c.block_n)))
            grid = (spread, triton.cdiv(T, c.block_q))
            _indexer_logits_blocked_kernel[grid](*args, T, *strides, BLOCK_Q=c.block_q,
                                                 KEYS_PER_PROGRAM=c.keys_per_program, **meta)
    return logits


def indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    k_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_req: torch.Tensor,
    key_limit: torch.Tensor,
    topk: int,
    out: torch.Tensor | None = None,
    max_logits_bytes: int = 1 << 30,
    config: IndexerConfig | None = None,
) -> torch.Tensor:
    """Indexer scores + exact top-k -> logical positions [T, topk] int32 (-1 where fewer keys).

    Keys are read up to the page table's width (max_pages * page size): no host sync on key_limit.
    """
    T = q.shape[0]
    config = config or _default_for(T, page_table)
    width = page_table.shape[1] * page_size(k_cache)
    if out is None:
        out = torch.empty(T, topk, dtype=torch.int32, device=q.device)
    chunk = max(1, min(T, max_logits_bytes // (12 * width)))  # fp32 logits + top-k candidate keys and positions
    if chunk < T:  # chunks start at multiples of 16 rows: int32 row slices keep their 64-byte alignment
        chunk = max(16, chunk - chunk % 16)
    logits = torch.empty(chunk, width, dtype=torch.float32, device=q.device)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        lg = logits[: t1 - t0]
        indexer_logits(q[t0:t1], weights[t0:t1], k_cache, page_table, query_req[t0:t1], key_limit[t0:t1], lg, config)
        topk_positions(lg, key_limit[t0:t1], topk, out=out[t0:t1], chunk=config.topk_chunk, block=config.topk_block,
                       select_block=config.topk_select_block, sample=config.topk_sample,
                       small_row=config.topk_small_row)
    return out


# ---------------------------------------------------------------------------------------------
# FP8 layout and plain-PyTorch reference
# ---------------------------------------------------------------------------------------------


def quantize_index_k_fp8(k: torch.Tensor) -> torch.Tensor:
    """BF16 pages [num_pages, 64, 128] -> FP8 pages uint8 [num_pages, 64 * 132] (per-token absmax)."""
    codes, scale = layout.quantize_index_k(k.reshape(-1, HEAD_DIM))
    return layout.pack_index_k_pages(codes.view(k.shape), scale.view(k.shape[:2]))


def dequantize_index_k(k_cache: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Either cache layout -> [num_pages, page size, 128] in dtype."""
    if k_cache.dtype != torch.uint8:
        return k_cache.to(dtype)
    codes, scale = layout.unpack_index_k_pages(k_cache, HEAD_DIM)
    return layout.dequantize_index_k(codes.reshape(-1, HEAD_DIM), scale.reshape(-1), dtype).view(codes.shape)


def indexer_logits_ref(q, weights, k_cache, page_table, query_req, key_limit, compute_dtype=torch.float64):
    """Scores [T, max_pages * page size] in compute_dtype; -inf at positions >= key_limit[t]."""
    k = dequantize_index_k(k_cache, compute_dtype)
    width = page_table.shape[1] * page_size(k_cache)
    pos = torch.arange(width, device=q.device)
    pages = page_table[query_req.long()].long()  # [T, max_pages]
    keys = k[pages].reshape(q.shape[0], width, HEAD_DIM)  # [T, width, 128]
    s = torch.einsum("thd,tjd->thj", q.to(compute_dtype), keys).clamp(min=0)
    score = torch.einsum("thj,th->tj", s, weights.to(compute_dtype))
    return score.masked_fill(pos[None, :] >= key_limit[:, None], float("-inf"))


def indexer_bytes(num_keys_total: int, num_queries: int, topk: int, k_token_bytes: int = FP8_TOKEN_BYTES) -> int:
    """Roofline bytes as the issue counts them: keys x token bytes + q + weights + indices out."""
    return num_keys_total * k_token_bytes + num_queries * (N_HEADS * HEAD_DIM * 2 + N_HEADS * 4 + topk * 4)


def indexer_flops(num_keys_total: int) -> int:
    """2 x 32 x 128 per (query, key) pair for the dot, plus relu/weight/sum (counted as 3 x 32)."""
    return num_keys_total * N_HEADS * (2 * HEAD_DIM + 3)


__all__ = [
    "IndexerConfig", "default_config", "indexer_logits", "indexer_topk", "page_size", "quantize_index_k_fp8", "dequantize_index_k",
    "indexer_logits_ref", "indexer_bytes", "indexer_flops",
    "N_HEADS", "HEAD_DIM", "PAGE_SIZE", "FP8_TOKEN_BYTES",
]
