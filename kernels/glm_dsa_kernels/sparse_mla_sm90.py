"""Sparse MLA forward for 64 heads on Hopper (SM90), warp-specialized in Gluon.

Same op, shapes and reference as `sparse_mla.py` (BF16 KV rows [P, 576], or FlashMLA's 656-byte
FP8 rows, which `_producer_fp8` converts to BF16 inside their stage); this path exists
because plain Triton 3.6 runs QK wgmma -> softmax -> PV wgmma of the 64-head kernel one after
another with the gather in the same warps (a third of the H200's matmul ceiling).

One CTA owns the 64 heads of one query token and one split of its index list:
  - a producer partition (4 warps) gathers each block of 64 KV rows with cp.async into a ring of
    shared-memory stages and signals `ready[stage]` when its copies land;
  - the consumer (default partition, 8 warps = two warpgroups) keeps Q [64, 576] in shared memory,
    computes S = Q K^T (warpgroup w scores keys [32 w, 32 w + 32)), the online softmax, writes P to
    shared memory and accumulates O += P V (warpgroup w owns latent columns [256 w, 256 w + 256)),
    then frees the stage with `empty[stage]` the moment that PV retires.
Two stages are what shared memory holds next to Q, so the gather of block j + 2 starts while the
consumer still waits for block j + 1. Splits > 1 write fp32 partials that
`sparse_mla._merge_splits_kernel` merges. H200 results: benchmarks/kernels/results.md.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

D_QK = 576
D_V = 512
BLOCK_H = 64  # one warpgroup MMA's M
BLOCK_N = 64  # KV rows per stage (32 with 3-4 stages fits too, and was slower on the H200)
STAGES = 2  # Q (72 KB) + 2 stages of 64 rows (144 KB) + P (8 KB) fill the 227 KB of shared memory
PRODUCER_WARPS = 4
PRODUCER_REGS = 56  # the consumer keeps ~220: more for the producer makes the consumer spill
PRODUCER_REGS_FP8 = 72  # converting codes takes registers (ptxas, compile_sm90.py --fp8)
_LOG2E = 1.4426950408889634


@gluon.jit
def _block_rows(idx_row, k_lo, k_hi, j, keys, BLOCK_N: gl.constexpr):
    """KV row indices of top-k block j of [k_lo, k_hi), in the layout of `keys`; -1 past k_hi."""
    pos = k_lo + j * BLOCK_N + keys
    return gl.load(idx_row + pos, mask=pos < k_hi, other=-1)


@gluon.jit
def _producer(kv_ptr, idx_row, kv_smem, rope_smem, ready, empty, k_lo, k_hi, n_blocks,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_QK: gl.constexpr, D_V: gl.constexpr):
    # 16-byte copies: 8 bf16 per thread along a row, a [16, 64] tile per pass of 4 warps
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    rows_next = _block_rows(idx_row, k_lo, k_hi, 0, keys, BLOCK_N)
    for j in range(n_blocks):
        stage = j % STAGES
        # block j + 1's indices are read while block j waits for its stage
        rows = rows_next
        rows_next = _block_rows(idx_row, k_lo, k_hi, j + 1, keys, BLOCK_N)
        # the consumer frees a stage once its block's PV has finished (the first pass is free)
        mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
        valid = rows >= 0
        base = kv_ptr + gl.where(valid, rows, 0).to(gl.int64)[:, None] * D_QK + cols[None, :]
        dst = kv_smem.index(stage)
        for c in gl.static_range(D_V // 64):
            # masked rows are zero-filled, so P = 0 never meets stale or non-finite values
            async_copy.async_copy_global_to_shared(dst.slice(c * 64, 64, dim=1), base + c * 64, mask=valid[:, None])
        async_copy.async_copy_global_to_shared(rope_smem.index(stage), base + D_V, mask=valid[:, None])
        async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)


@gluon.jit
def _producer_fp8(kv_ptr, idx_row, kv_smem, rope_smem, ready, empty, k_lo, k_hi, n_blocks,
                  BLOCK_N: gl.constexpr, STAGES: gl.constexpr, D_V: gl.constexpr, ROW_BYTES: gl.constexpr,
                  WARPS: gl.constexpr):
    """FlashMLA's 656-byte FP8 rows, dequantized to BF16 inside their stage (wgmma has no e4m3 x bf16
    form). A block's 512 codes per row land by cp.async, all at once, in the stage's upper half as
    eight [rows, 64] chunks; chunk c is then converted into the stage's BF16 columns [64 c, 64 c + 64).
    The rope, BF16 already, is copied straight to its buffer. Converting in place keeps a whole block
    of copies in flight with no extra shared memory (Q and two stages fill it)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [WARPS, 1], [1, 0])  # 16 codes per thread
    rope_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    raw_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    CHUNKS: gl.constexpr = D_V // 64
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    rope_cols = gl.arange(0, 64, layout=gl.SliceLayout(0, rope_layout))
    codes_ptr = kv_ptr.to(gl.pointer_type(gl.float8e4nv))
    scale_ptr = kv_ptr.to(gl.pointer_type(gl.float32))
    rope_ptr = kv_ptr.to(gl.pointer_type(gl.bfloat16))
    rows_next = _block_rows(idx_row, k_lo, k_hi, 0, keys, BLOCK_N)
    for j in range(n_blocks):
        stage = j % STAGES
        rows = rows_next
        rows_next = _block_rows(idx_row, k_lo, k_hi, j + 1, keys, BLOCK_N)
        valid = rows >= 0
        rows64 = gl.where(valid, rows, 0).to(gl.int64)
        dst = kv_smem.index(stage)
        # the stage's 64 KB as sixteen [rows, 64] e4m3 chunks; the codes land in the upper eight. The
        # 128-byte-swizzled stage keeps each 64-column BF16 slice as one contiguous [rows, 128 B] tile
        raw = dst._reinterpret(gl.float8e4nv, [2 * CHUNKS, BLOCK_N, 64], raw_layout)
        mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1, pred=j >= STAGES)
        for c in gl.static_range(CHUNKS):
            # masked rows are zero-filled (codes and scales), so P = 0 meets zeros
            async_copy.async_copy_global_to_shared(raw.index(CHUNKS + c),
                                                   codes_ptr + rows64[:, None] * ROW_BYTES + c * 64 + cols[None, :],
                                                   mask=valid[:, None])
        rope_rows = gl.convert_layout(rows64, gl.SliceLayout(1, rope_layout))
        rope_ok = gl.convert_layout(valid, gl.SliceLayout(1, rope_layout))
        # 64 bf16 rope values start at byte 528 of the row, after 512 codes and 4 fp32 scales
        async_copy.async_copy_global_to_shared(rope_smem.index(stage),
                                               rope_ptr + rope_rows[:, None] * (ROW_BYTES // 2) + 264 + rope_cols[None, :],
                                               mask=rope_ok[:, None])
        async_copy.commit_group()
        scales = scale_ptr + rows64 * (ROW_BYTES // 4) + D_V // 4  # one fp32 per 128 columns
        s0 = gl.load(scales, mask=valid, other=0.0)
        s1 = gl.load(scales + 1, mask=valid, other=0.0)
        s2 = gl.load(scales + 2, mask=valid, other=0.0)
        s3 = gl.load(scales + 3, mask=valid, other=0.0)
        async_copy.wait_group(0)
        gl.thread_barrier()  # every thread's copies have landed
        codes = raw.index(CHUNKS).load(layout)
        for c in gl.static_range(CHUNKS):
            if c + 1 < CHUNKS:
                codes_next = raw.index(CHUNKS + c + 1).load(layout)
            # BF16 chunk c overwrites code chunks 2c - 8 and 2c - 7: before chunk 4's write every
            # thread has read code chunks 0-5, before chunk 7's chunk 7
            if c == 4 or c == 7:
                gl.thread_barrier()
            if c < 2:
                scale = s0
            elif c < 4:
                scale = s1
            elif c < 6:
                scale = s2
            else:
                scale = s3
            dst.slice(c * 64, 64, dim=1).store((codes.to(gl.float32) * scale[:, None]).to(gl.bfloat16))
            if c + 1 < CHUNKS:
                codes = codes_next
        fence_async_shared()  # generic-proxy stores, read by wgmma through the async proxy
        gl.thread_barrier()
        mbarrier.arrive(ready.index(stage), count=1)


@gluon.jit
def _consumer(q_row, stride_qh, idx_row, out_base, lse_ptr, stride_oh, head0, num_heads, k_lo, k_hi, n_blocks,
              qk_scale_log2, q_smem, q_rope_smem, kv_smem, rope_smem, p_smem, ready, empty,
              SPLIT_OUT: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              D_QK: gl.constexpr, D_V: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    key_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    # Q [64, 576] -> shared memory once, 64 columns at a time
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    qh = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_layout))
    qc = gl.arange(0, 64, layout=gl.SliceLayout(0, q_layout))
    for c in gl.static_range(D_QK // 64):
        qv = gl.load(q_row + qh[:, None] * stride_qh + c * 64 + qc[None, :], mask=(qh < num_heads)[:, None], other=0.0)
        if c < D_V // 64:
            q_smem.slice(c * 64, 64, dim=1).store(qv)
        else:
            q_rope_smem.store(qv)
    fence_async_shared()
    gl.thread_barrier()

    acc = gl.zeros([BLOCK_H, D_V], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    # finite start so fully masked blocks give alpha = 1, p = 0 instead of NaN
    m_i = gl.full([BLOCK_H], -1.0e30, gl.float32, layout=row_layout)
    # row sums kept per element: summing across the two warpgroups once at the end saves a
    # cross-warpgroup reduction (shared memory and barriers) per block
    l_acc = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    keys = gl.arange(0, BLOCK_N, layout=key_layout)
    valid_next = _block_rows(idx_row, k_lo, k_hi, 0, keys, BLOCK_N) >= 0
    for j in range(n_blocks):
        stage = j % STAGES
        kv = kv_smem.index(stage)
        # the key mask of block j + 1 is read a block early, off the softmax's critical path
        valid = valid_next
        valid_next = _block_rows(idx_row, k_lo, k_hi, j + 1, keys, BLOCK_N) >= 0
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        fence_async_shared()  # cp.async wrote through the generic proxy; wgmma reads through the async one
        s = warpgroup_mma(q_rope_smem, rope_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(q_smem, kv.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))

        s = gl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_acc = l_acc * alpha[:, None] + p
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout), assert_trivial=True)[:, None]
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()  # both warpgroups' halves of P are written before either multiplies by it
        # PV waits here so the stage is freed the moment it retires: the gather of block j + 2 then
        # runs while the consumer waits for block j + 1 (H200: 194 vs 230 us at batch 256 against
        # freeing it after the next block's QK, benchmarks/kernels/logs/raw_logs.tar.gz: sweep_ws_run2.log)
        acc = warpgroup_mma(p_smem, kv, acc)
        gl.thread_barrier()
        mbarrier.arrive(empty.index(stage), count=1)

    l_i = gl.sum(l_acc, axis=1)
    has_key = l_i > 0.0
    inv_l = 1.0 / gl.where(has_key, l_i, 1.0)
    lse_log2 = gl.where(has_key, m_i + gl.log2(gl.where(has_key, l_i, 1.0)), float("-inf"))
    oh = head0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    od = gl.arange(0, D_V, layout=gl.SliceLayout(0, o_layout))
    o = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
    o_ptrs = out_base + oh.to(gl.int64)[:, None] * stride_oh + od[None, :]
    lh = head0 + gl.arange(0, BLOCK_H, layout=row_layout)
    if SPLIT_OUT:
        gl.store(o_ptrs, o, mask=(oh < num_heads)[:, None])
        gl.store(lse_ptr + lh, lse_log2, mask=lh < num_heads)
    else:
        gl.store(o_ptrs, o.to(gl.bfloat16), mask=(oh < num_heads)[:, None])
        gl.store(lse_ptr + lh, lse_log2 * 0.6931471805599453, mask=lh < num_heads)


@gluon.jit
def sparse_mla_fwd_sm90_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr,
    qk_scale_log2,
    num_heads, topk, split_len, splits,
    stride_qt, stride_qh, stride_it, stride_ot, stride_oh, stride_lt,
    SPLIT_OUT: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    D_QK: gl.constexpr, D_V: gl.constexpr, PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
    KV_FP8: gl.constexpr, ROW_BYTES: gl.constexpr,
):
    pid_h = gl.program_id(0)
    pid_s = gl.program_id(1)
    t = gl.program_id(2)
    head0 = pid_h * BLOCK_H
    k_lo = pid_s * split_len
    k_hi = gl.minimum(k_lo + split_len, topk)
    n_blocks = gl.cdiv(k_hi - k_lo, BLOCK_N)
    t64 = t.to(gl.int64)
    q_row = q_ptr + t64 * stride_qt
    idx_row = idx_ptr + t64 * stride_it
    if SPLIT_OUT:
        part = (t64 * splits + pid_s) * num_heads
        out_base = part_out_ptr + part * D_V
        lse_base = part_lse_ptr + part
        stride_o = D_V
    else:
        out_base = out_ptr + t64 * stride_ot
        lse_base = lse_ptr + t64 * stride_lt
        stride_o = stride_oh

    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # power-of-two shapes: the 512 latent and 64 rope columns are separate buffers
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_V], smem_layout)
    q_rope_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_QK - D_V], smem_layout)
    kv_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_V], smem_layout)
    rope_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, D_QK - D_V], smem_layout)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        # BF16: one cp.async arrival per producer thread; FP8: one arrival after the partition's stores
        mbarrier.init(ready.index(i), count=1 if KV_FP8 else PRODUCER_WARPS * 32)
        mbarrier.init(empty.index(i), count=1)

    gl.warp_specialize(
        [
            (_consumer, (q_row, stride_qh, idx_row, out_base, lse_base, stride_o, head0, num_heads, k_lo, k_hi, n_blocks,
                         qk_scale_log2, q_smem, q_rope_smem, kv_smem, rope_smem, p_smem, ready, empty,
                         SPLIT_OUT, BLOCK_H, BLOCK_N, STAGES, D_QK, D_V)),
            # the producer by KV format, chosen at compile time (Gluon keeps no function in a variable)
            (_producer_fp8, (kv_ptr, idx_row, kv_smem, rope_smem, ready, empty, k_lo, k_hi, n_blocks,
                             BLOCK_N, STAGES, D_V, ROW_BYTES, PRODUCER_WARPS)) if KV_FP8 else
            (_producer, (kv_ptr, idx_row, kv_smem, rope_smem, ready, empty, k_lo, k_hi, n_blocks,
                         BLOCK_N, STAGES, D_QK, D_V)),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGS],
    )


def sparse_mla_fwd_sm90(q, kv, indices, qk_scale_log2: float, out, lse, part_out, part_lse, split_len: int,
                        splits: int, block_n: int = BLOCK_N, stages: int = STAGES) -> None:
    """Launch on checked inputs (`sparse_mla.sparse_mla_fwd` is the public entry, and owns the split
    partials and their merge): q [T, H, 576] bf16 with H a multiple of 64, kv BF16 rows [P, 576]
    or FP8 rows uint8 [P, 656], indices [T, topk] int32."""
    T, H, _ = q.shape
    kv_fp8 = kv.element_size() == 1  # FlashMLA uint8 rows
    sparse_mla_fwd_sm90_kernel[(H // BLOCK_H, splits, T)](
        q, kv, indices, out, lse, part_out, part_lse,
        qk_scale_log2,
        H, indices.shape[1], split_len, splits,
        q.stride(0), q.stride(1), indices.stride(0), out.stride(0), out.stride(1), lse.stride(0),
        SPLIT_OUT=splits > 1, BLOCK_H=BLOCK_H, BLOCK_N=block_n, STAGES=stages, D_QK=D_QK, D_V=D_V,
        PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS_FP8 if kv_fp8 else PRODUCER_REGS, KV_FP8=kv_fp8,
        ROW_BYTES=kv.shape[1] * kv.element_size(), num_warps=8,
    )
