"""Sparse MLA forward over top-k indices (absorbed MLA, DeepSeek sparse attention).

Shapes (GLM-5.2 per tensor-parallel rank: 8, 16 or 64 heads, top-k 2048):
  q        [T, H, 576] bf16   T query tokens: decode batch x 1..16 tokens flattened, or a prefill chunk
  kv       flat pool of token rows, either
             BF16 [P, 576]: 512 latent + 64 rope; the value is the latent (first 512 columns)
             FP8  uint8 [P, 656]: FlashMLA layout, 512 e4m3 latent bytes, 4 fp32 scales
                  (one per 128 latent columns), 64 bf16 rope values
  indices  [T, topk] int32 pool rows, -1 = masked
  out      [T, H, 512] bf16, lse [T, H] fp32 (natural log). A row with no valid index gives
           out 0 and lse -inf.

One program owns BLOCK_H heads of one query token and one split of its index list, so every
gathered KV row is shared by BLOCK_H heads ([BLOCK_H, 576] x [576, BLOCK_N] dots, online
softmax). Splits > 1 write partial (out, lse) that a second kernel merges.

On Hopper, 64-head blocks (BF16 or FP8 KV) go to the warp-specialized Gluon kernel in
`sparse_mla_sm90.py` (`SparseMLAConfig.warp_specialized`, picked by `default_config`); this module
stays the one launcher and the reference.
"""

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import layout
from .layout import D_QK, D_V, FP8_ROW_BYTES

_LOG2E = 1.4426950408889634
# TRITON_INTERPRET=1 (triton 3.8, CPU) mis-multiplies bf16 tl.dot operands; interpret in fp32
_DOT_DTYPE = tl.float32 if os.environ.get("TRITON_INTERPRET") == "1" else tl.bfloat16


@dataclass(frozen=True)
class SparseMLAConfig:
    block_h: int  # heads per program (>= 16: tl.dot needs M >= 16)
    block_n: int  # gathered KV rows per step
    splits: int  # programs per query token along top-k
    num_warps: int
    num_stages: int
    prefetch: bool = False  # gather the next block into registers by hand (use with num_stages 1)
    # the SM90 Gluon kernel (sparse_mla_sm90.py): 64-head blocks of 64 rows, BF16 or FP8 KV, 2 stages, 8 + 4 warps
    warp_specialized: bool = False


def warp_specialized_available(device) -> bool:
    """The SM90 warp-specialized kernel runs here: a Hopper GPU and a Triton with Gluon."""
    if torch.device(device).type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return False
    try:
        from . import sparse_mla_sm90  # noqa: F401
    except ImportError:
        return False
    return True


def default_config(
    num_tokens: int, num_heads: int, topk: int, kv_fp8: bool, num_sms: int, warp_specialized: bool = False
) -> SparseMLAConfig:
    """Launch shape for a problem, from the H200 sweeps (benchmarks/kernels/logs/raw_logs.tar.gz: sweep_run*.log).
    warp_specialized: the SM90 kernel may run (`warp_specialized_available`); it takes a multiple of
    64 heads, BF16 or FP8 KV."""
    if num_heads > 16:
        # 64 heads: one program per token covers all heads (acc 64 x 512 fp32, one program per SM).
        # Below one wave, split top-k until the programs fill the SMs (batch-1 decode with 2 programs
        # took 76 us a layer on the H200); each split's partial costs 128 KB/token each way.
        splits = 1 if num_tokens > num_sms else max(2, num_sms // num_tokens)
        splits = min(1 << (splits.bit_length() - 1), max(1, topk // 64))
        if warp_specialized and num_heads % 64 == 0:
            return SparseMLAConfig(64, 64, splits, num_warps=8, num_stages=2, warp_specialized=True)
        return SparseMLAConfig(64, 64, splits, num_warps=8, num_stages=3 if kv_fp8 else 4)
    # 8/16 heads are bandwidth-bound: split top-k until about 2 (BF16) or 1 (FP8) programs per SM
    programs_per_sm = 1 if kv_fp8 else 2
    splits = max(1, min(programs_per_sm * num_sms // num_tokens, topk // 128))
    splits = 1 << (splits.bit_length() - 1)
    if kv_fp8:
        # Triton does not pipeline the e4m3 gather feeding a 16-row mma.sync: prefetch by hand
        return SparseMLAConfig(16, 64, splits, num_warps=8, num_stages=1, prefetch=True)
    return SparseMLAConfig(16, 64, splits, num_warps=4, num_stages=4)


@triton.jit
def _latent_group(kv_ptr, rows64, valid, g: tl.constexpr, KV_FP8: tl.constexpr, ROW_ELEMS: tl.constexpr):
    """Latent columns [128 g, 128 g + 128) of the gathered rows as stored (bf16, or e4m3 codes),
    and the group's per-row FP8 scale (1 for BF16 rows)."""
    offs = rows64[:, None] * ROW_ELEMS + g * 128 + tl.arange(0, 128)[None, :]
    if KV_FP8:
        # loaded as e4m3 (not uint8 + bitcast) so Triton can pipeline the gather into shared memory
        latent = tl.load(kv_ptr.to(tl.pointer_type(tl.float8e4nv)) + offs, mask=valid[:, None], other=0.0)
        scale_ptr = kv_ptr.to(tl.pointer_type(tl.float32)) + rows64 * (ROW_ELEMS // 4) + 128 + g
        scale = tl.load(scale_ptr, mask=valid, other=0.0)
    else:
        latent = tl.load(kv_ptr + offs, mask=valid[:, None], other=0.0)
        scale = tl.full(rows64.shape, 1.0, tl.float32)
    return latent, scale


@triton.jit
def _block_rows(idx_row, k0, k_hi, BLOCK_N: tl.constexpr):
    """Pool rows named by indices [k0, k0 + BLOCK_N) of this program's split, and which are real."""
    pos = k0 + tl.arange(0, BLOCK_N)
    rows = tl.load(idx_row + pos, mask=pos < k_hi, other=-1)
    valid = rows >= 0
    return valid, tl.where(valid, rows, 0).to(tl.int64)


@triton.jit
def _gather_block(kv_ptr, valid, rows64, KV_FP8: tl.constexpr, ROW_ELEMS: tl.constexpr):
    """Latent groups (as stored), their FP8 scales and the rope part of the given pool rows."""
    k0_, sc0 = _latent_group(kv_ptr, rows64, valid, 0, KV_FP8, ROW_ELEMS)
    k1_, sc1 = _latent_group(kv_ptr, rows64, valid, 1, KV_FP8, ROW_ELEMS)
    k2_, sc2 = _latent_group(kv_ptr, rows64, valid, 2, KV_FP8, ROW_ELEMS)
    k3_, sc3 = _latent_group(kv_ptr, rows64, valid, 3, KV_FP8, ROW_ELEMS)
    if KV_FP8:
        rope_ptr = kv_ptr.to(tl.pointer_type(tl.bfloat16)) + rows64[:, None] * (ROW_ELEMS // 2) + 264
    else:
        rope_ptr = kv_ptr + rows64[:, None] * ROW_ELEMS + 512
    rope = tl.load(rope_ptr + tl.arange(0, 64)[None, :], mask=valid[:, None], other=0.0)
    return k0_, k1_, k2_, k3_, sc0, sc1, sc2, sc3, rope


@triton.jit
def _as_operand(latent, scale, KV_FP8: tl.constexpr, DOT_DTYPE: tl.constexpr):
    if KV_FP8:
        latent = latent.to(tl.float32) * scale[:, None]
    return latent.to(DOT_DTYPE)


@triton.jit
def _load_q_group(q_row, heads, head_ok, stride_qh, col0: tl.constexpr, width: tl.constexpr, DOT_DTYPE: tl.constexpr):
    c = col0 + tl.arange(0, width)
    return tl.load(q_row + heads[:, None] * stride_qh + c[None, :], mask=head_ok[:, None], other=0.0).to(DOT_DTYPE)


@triton.jit
def _store_group(o_base, o_h, acc_g, inv_l, head_ok, col0: tl.constexpr, O_DTYPE: tl.constexpr):
    c = col0 + tl.arange(0, 128)
    tl.store(o_base + o_h[:, None] + c[None, :], (acc_g * inv_l[:, None]).to(O_DTYPE), mask=head_ok[:, None])


@triton.jit
def _sparse_mla_fwd_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr, part_out_ptr, part_lse_ptr,
    qk_scale_log2,
    num_heads, topk, split_len, splits,
    stride_qt, stride_qh, stride_it, stride_ot, stride_oh, stride_lt,
    KV_FP8: tl.constexpr, ROW_ELEMS: tl.constexpr,
    SPLIT_OUT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    PREFETCH: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """The 512 latent columns are four groups of 128, each its own load, QK dot and PV
    accumulator (on the H200 this reached 93% of the bandwidth floor at batch 256, one [rows, 512]
    tile 73%). FP8 rows are dequantized (per-group scale) on their way to the dots."""
    # head block fastest: programs sharing a token's KV rows run side by side and hit L2
    pid_h = tl.program_id(0)
    pid_s = tl.program_id(1)
    t = tl.program_id(2)

    heads = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    q_row = q_ptr + t.to(tl.int64) * stride_qt
    q0 = _load_q_group(q_row, heads, head_ok, stride_qh, 0, 128, DOT_DTYPE)
    q1 = _load_q_group(q_row, heads, head_ok, stride_qh, 128, 128, DOT_DTYPE)
    q2 = _load_q_group(q_row, heads, head_ok, stride_qh, 256, 128, DOT_DTYPE)
    q3 = _load_q_group(q_row, heads, head_ok, stride_qh, 384, 128, DOT_DTYPE)
    q_rope = _load_q_group(q_row, heads, head_ok, stride_qh, 512, 64, DOT_DTYPE)
    acc0 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc1 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc2 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc3 = tl.zeros([BLOCK_H, 128], tl.float32)
    # finite start so fully masked blocks give alpha = 1, p = 0 instead of NaN
    m_i = tl.full([BLOCK_H], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)

    k_lo = pid_s * split_len
    k_hi = tl.minimum(k_lo + split_len, topk)
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    if PREFETCH:
        # register double buffer: block i + 1's rows are gathered and block i + 2's indices read
        # while block i computes
        valid_n, rows_n = _block_rows(idx_row, k_lo, k_hi, BLOCK_N)
        n0, n1, n2, n3, ns0, ns1, ns2, ns3, rope_n = _gather_block(kv_ptr, valid_n, rows_n, KV_FP8, ROW_ELEMS)
        valid_nn, rows_nn = _block_rows(idx_row, k_lo + BLOCK_N, k_hi, BLOCK_N)
    for k0 in tl.range(k_lo, k_hi, BLOCK_N, num_stages=NUM_STAGES):
        if PREFETCH:
            valid, k0_, k1_, k2_, k3_, sc0, sc1, sc2, sc3, rope = valid_n, n0, n1, n2, n3, ns0, ns1, ns2, ns3, rope_n
            valid_n, rows_n = valid_nn, rows_nn
            n0, n1, n2, n3, ns0, ns1, ns2, ns3, rope_n = _gather_block(kv_ptr, valid_n, rows_n, KV_FP8, ROW_ELEMS)
            valid_nn, rows_nn = _block_rows(idx_row, k0 + 2 * BLOCK_N, k_hi, BLOCK_N)
        else:
            valid, rows64 = _block_rows(idx_row, k0, k_hi, BLOCK_N)
            k0_, k1_, k2_, k3_, sc0, sc1, sc2, sc3, rope = _gather_block(kv_ptr, valid, rows64, KV_FP8, ROW_ELEMS)
        k0_ = _as_operand(k0_, sc0, KV_FP8, DOT_DTYPE)
        k1_ = _as_operand(k1_, sc1, KV_FP8, DOT_DTYPE)
        k2_ = _as_operand(k2_, sc2, KV_FP8, DOT_DTYPE)
        k3_ = _as_operand(k3_, sc3, KV_FP8, DOT_DTYPE)
        s = tl.dot(q_rope, tl.trans(rope.to(DOT_DTYPE)))  # [BLOCK_H, BLOCK_N]
        s = tl.dot(q0, tl.trans(k0_), s)
        s = tl.dot(q1, tl.trans(k1_), s)
        s = tl.dot(q2, tl.trans(k2_), s)
        s = tl.dot(q3, tl.trans(k3_), s)
        s = tl.where(valid[None, :], s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
        p = p.to(DOT_DTYPE)
        acc0 = tl.dot(p, k0_, acc0 * alpha[:, None])
        acc1 = tl.dot(p, k1_, acc1 * alpha[:, None])
        acc2 = tl.dot(p, k2_, acc2 * alpha[:, None])
        acc3 = tl.dot(p, k3_, acc3 * alpha[:, None])

    has_key = l_i > 0.0
    inv_l = 1.0 / tl.where(has_key, l_i, 1.0)
    lse_log2 = tl.where(has_key, m_i + tl.log2(tl.where(has_key, l_i, 1.0)), float("-inf"))
    if SPLIT_OUT:
        part = (t.to(tl.int64) * splits + pid_s) * num_heads + heads
        o_base = part_out_ptr
        o_h = part * 512
        o_dtype: tl.constexpr = tl.float32
        tl.store(part_lse_ptr + part, lse_log2, mask=head_ok)
    else:
        o_base = out_ptr + t.to(tl.int64) * stride_ot
        o_h = heads * stride_oh
        o_dtype: tl.constexpr = tl.bfloat16
        tl.store(lse_ptr + t.to(tl.int64) * stride_lt + heads, lse_log2 * 0.6931471805599453, mask=head_ok)
    _store_group(o_base, o_h, acc0, inv_l, head_ok, 0, o_dtype)
    _store_group(o_base, o_h, acc1, inv_l, head_ok, 128, o_dtype)
    _store_group(o_base, o_h, acc2, inv_l, head_ok, 256, o_dtype)
    _store_group(o_base, o_h, acc3, inv_l, head_ok, 384, o_dtype)


@triton.jit
def _merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, lse_ptr,
    num_heads, stride_ot, stride_oh, stride_lt,
    SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
):
    """out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse); one program per (token, head)."""
    h = tl.program_id(0)
    t = tl.program_id(1)
    s = tl.arange(0, SPLITS_P2)
    d = tl.arange(0, 512)
    part = (t.to(tl.int64) * SPLITS + s) * num_heads + h
    lse_s = tl.load(part_lse_ptr + part, mask=s < SPLITS, other=float("-inf"))
    m = tl.max(lse_s, 0)
    has_key = m > float("-inf")
    w = tl.where(has_key, tl.exp2(lse_s - tl.where(has_key, m, 0.0)), 0.0)
    w_sum = tl.sum(w, 0)
    o_s = tl.load(part_out_ptr + part[:, None] * 512 + d[None, :], mask=(s < SPLITS)[:, None], other=0.0)
    o = tl.sum(o_s * w[:, None], 0) / tl.where(has_key, w_sum, 1.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + d, o.to(tl.bfloat16))
    lse = tl.where(has_key, (m + tl.log2(tl.where(has_key, w_sum, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(lse_ptr + t.to(tl.int64) * stride_lt + h, lse)


def _check_inputs(q, kv, indices, d_v):
    assert d_v == D_V, "GLM-DSA absorbed MLA: d_v is 512"
    assert q.dtype == torch.bfloat16 and q.dim() == 3 and q.shape[-1] == D_QK and q.stride(-1) == 1
    assert indices.dtype == torch.int32 and indices.dim() == 2 and indices.shape[0] == q.shape[0]
    assert indices.stride(-1) == 1
    kv_fp8 = kv.dtype == torch.uint8
    if kv_fp8:
        assert kv.dim() == 2 and kv.shape[1] == FP8_ROW_BYTES and kv.is_contiguous()
    else:
        assert kv.dtype == torch.bfloat16 and kv.dim() == 2 and kv.shape[1] == D_QK and kv.is_contiguous()
    return kv_fp8


def sparse_mla_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = D_V,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    config: SparseMLAConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton sparse MLA forward; returns (out [T, H, 512] bf16, lse [T, H] fp32, natural log)."""
    kv_fp8 = _check_inputs(q, kv, indices, d_v)
    T, H, _ = q.shape
    topk = indices.shape[1]
    if out is None:
        out = torch.empty(T, H, D_V, dtype=torch.bfloat16, device=q.device)
    if lse is None:
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
    assert out.shape == (T, H, D_V) and out.stride(-1) == 1 and lse.shape == (T, H) and lse.stride(-1) == 1
    if T == 0:
        return out, lse
    if config is None:
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        config = default_config(T, H, topk, kv_fp8, num_sms, warp_specialized_available(q.device))
    if config.warp_specialized:
        smem = 2 * (64 * D_QK + config.num_stages * config.block_n * D_QK + 64 * config.block_n)
        if H % 64 or config.block_h != 64 or config.block_n not in (32, 64) or smem > 227 * 1024:
            raise ValueError(
                f"warp_specialized sparse MLA takes a multiple of 64 heads, block_h 64, block_n 32 or 64 "
                f"and stages that fit 227 KB of shared memory; got {H} heads, block_h "
                f"{config.block_h}, block_n {config.block_n}, {config.num_stages} stages ({smem // 1024} KB): "
                "use default_config(...) for this problem"
            )
    split_len = triton.cdiv(triton.cdiv(topk, config.splits), config.block_n) * config.block_n
    splits = triton.cdiv(topk, split_len)
    if splits > 1:
        part_out = torch.empty(T, splits, H, D_V, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(T, splits, H, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused placeholders
    if config.warp_specialized:
        from .sparse_mla_sm90 import sparse_mla_fwd_sm90

        sparse_mla_fwd_sm90(q, kv, indices, sm_scale * _LOG2E, out, lse, part_out, part_lse, split_len, splits,
                            config.block_n, config.num_stages)
    else:
        grid = (triton.cdiv(H, config.block_h), splits, T)
        _sparse_mla_fwd_kernel[grid](
            q, kv, indices, out, lse, part_out, part_lse,
            sm_scale * _LOG2E,
            H, topk, split_len, splits,
            q.stride(0), q.stride(1), indices.stride(0), out.stride(0), out.stride(1), lse.stride(0),
            KV_FP8=kv_fp8, ROW_ELEMS=kv.shape[1],
            SPLIT_OUT=splits > 1, BLOCK_H=config.block_h, BLOCK_N=config.block_n, NUM_STAGES=config.num_stages,
            PREFETCH=config.prefetch, DOT_DTYPE=_DOT_DTYPE, num_warps=config.num_warps,
        )
    if splits > 1:
        _merge_splits_kernel[(H, T)](
            part_out, part_lse, out, lse, H, out.stride(0), out.stride(1), lse.stride(0),
            SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), num_warps=4,
        )
    return out, lse


# ---------------------------------------------------------------------------------------------
# FP8 KV layout and plain-PyTorch reference
# ---------------------------------------------------------------------------------------------


def quantize_kv_fp8(kv: torch.Tensor) -> torch.Tensor:
    """BF16 rows [P, 576] -> FlashMLA FP8 rows uint8 [P, 656] (per-128-column absmax scales)."""
    return layout.quantize_mla_rows(kv[:, :D_V], kv[:, D_V:])


def dequantize_kv_fp8(kv: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """FlashMLA FP8 rows uint8 [P, 656] -> [P, 576] in dtype."""
    return layout.dequantize_mla_rows(kv, D_V, dtype)


def sparse_mla_fwd_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = D_V,
    compute_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather + matmul reference in compute_dtype; returns (out [T, H, d_v], lse [T, H]) in compute_dtype."""
    kv_f = dequantize_kv_fp8(kv, compute_dtype) if kv.dtype == torch.uint8 else kv.to(compute_dtype)
    valid = indices >= 0
    k = kv_f[indices.clamp(min=0).long()]  # [T, topk, 576]
    s = torch.einsum("thd,tkd->thk", q.to(compute_dtype), k) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    out = torch.einsum("thk,tkd->thd", p, k[..., :d_v])
    return out, lse


def sparse_mla_flops(num_tokens: int, num_heads: int, topk: int) -> int:
    """2 x T x H x topk x (576 + 512), as the issue counts it."""
    return 2 * num_tokens * num_heads * topk * (D_QK + D_V)


def sparse_mla_bytes(num_tokens: int, num_heads: int, topk: int, kv_row_bytes: int) -> int:
    """Each gathered row once per query + q + out (+ indices and lse, small)."""
    return num_tokens * (topk * (kv_row_bytes + 4) + num_heads * (D_QK * 2 + D_V * 2 + 4))


__all__ = [
    "SparseMLAConfig", "default_config", "warp_specialized_available", "sparse_mla_fwd", "sparse_mla_fwd_ref",
    "quantize_kv_fp8", "dequantize_kv_fp8", "sparse_mla_flops", "sparse_mla_bytes",
    "D_QK", "D_V", "FP8_ROW_BYTES",
]
