"""bench_kernels.py's DeepGEMM baselines hand DeepGEMM the plugin's own FP8 index-K pages and an e4m3 q
with its scale folded into the head weights. On CPU a stand-in `deep_gemm` computes what DeepGEMM's
indexer calls are documented to compute (paged: 64-token pages of 64 x 128 e4m3 codes then 64 fp32
scales; ragged: contiguous codes + scales with a [ks, ke) key window per query), so these tests check
the argument layouts against the plugin's float64 reference; the GPU run checks DeepGEMM itself."""

import sys
import types
from pathlib import Path

import pytest
import torch

from glm_dsa_kernels.indexer import indexer_logits_ref, quantize_index_k_fp8

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "kernels"))
import bench_kernels as bk  # noqa: E402


def _scores(q, w, codes, scale):
    """sum_h w[t, h] relu(q[t, h] . k_j), keys k_j = codes_j * scale_j, in float64 -> [T, N]."""
    k = codes.view(torch.float8_e4m3fn).double() * scale.double()[:, None]
    return (torch.einsum("thd,nd->thn", q.double(), k).clamp(min=0) * w.double()[:, :, None]).sum(1)


def _paged(q, kv_cache, w, context_lens, block_table, schedule_meta, max_context_len, clean_logits=False):
    pages = kv_cache.view(kv_cache.shape[0], -1)[block_table.long()]  # [B, P, 64 * 132]
    codes, scale = pages[..., : 64 * 128], pages[..., 64 * 128:].contiguous().view(torch.float32)
    out = torch.full((q.shape[0], max_context_len), float("nan"), dtype=torch.float64)
    for b in range(q.shape[0]):
        s = _scores(q[b, 0:1], w[b : b + 1], codes[b].reshape(-1, 128), scale[b].reshape(-1))[0]
        n = int(context_lens[b, 0])
        out[b, :n] = s[:n]
    return out.float()


def _ragged(q, kv, w, ks, ke, clean_logits=False, max_seqlen_k=0):
    codes, scale = kv
    s = _scores(q, w, codes.view(torch.uint8), scale)
    pos = torch.arange(s.shape[1])
    inside = (pos[None, :] >= ks[:, None]) & (pos[None, :] < ke[:, None])
    return s.masked_fill(~inside, float("nan")).float()


@pytest.fixture
def deep_gemm(monkeypatch):
    fake = types.SimpleNamespace(fp8_paged_mqa_logits=_paged, fp8_mqa_logits=_ragged, get_num_sms=lambda: 132,
                                 get_paged_mqa_logits_metadata=lambda ctx, block, sms: None)
    monkeypatch.setitem(sys.modules, "deep_gemm", fake)


def _cache(num_pages, seed):
    torch.manual_seed(seed)
    return quantize_index_k_fp8(torch.randn(num_pages, 64, 128).bfloat16())


def test_e4m3_q_folds_its_scale_into_the_weights():
    torch.manual_seed(0)
    q = torch.randn(5, 32, 128).bfloat16()
    q[1, 3] *= 1e3  # heads of very different magnitude keep their own scale
    w = torch.randn(5, 32)
    q8, w8 = bk.quantize_q_fp8(q, w)
    assert q8.dtype == torch.float8_e4m3fn and q8.float().abs().amax() <= 448
    back = q8.double() * (w8 / w).double()[..., None]
    assert ((back - q.double()).norm() / q.double().norm()).item() < 4e-2  # e4m3: 3 mantissa bits


def test_paged_baseline_reads_the_plugins_pages(deep_gemm):
    B, pages = 3, 4
    k_cache = _cache(B * pages + 2, 1)
    page_table = torch.randperm(B * pages + 2)[: B * pages].int().view(B, pages)
    q = torch.randn(B, 32, 128).bfloat16()
    w = torch.randn(B, 32) / 32
    key_limit = torch.tensor([256, 100, 1], dtype=torch.int32)
    ref = indexer_logits_ref(q, w, k_cache, page_table, torch.arange(B, dtype=torch.int32), key_limit)
    got = bk.deepgemm_decode_logits(*bk.quantize_q_fp8(q, w), k_cache, page_table, key_limit)()
    ok = ref.isfinite()
    assert bk.rel_err(got[ok], ref[ok]) < 5e-2 and not got[ok].isnan().any()
    assert bk.topk_recall(got, ref, key_limit, topk=1) == 1.0


def test_ragged_baseline_gathers_the_request_in_position_order(deep_gemm):
    pages, C = 5, 48
    k_cache = _cache(pages + 3, 2)
    page_table = torch.randperm(pages + 3)[:pages].int().view(1, pages)
    ctx = pages * 64
    q = torch.randn(C, 32, 128).bfloat16()
    w = torch.randn(C, 32) / 32
    key_limit = torch.arange(ctx - C + 1, ctx + 1, dtype=torch.int32)
    ref = indexer_logits_ref(q, w, k_cache, page_table, torch.zeros(C, dtype=torch.int32), key_limit)
    got = bk.deepgemm_prefill_logits(*bk.quantize_q_fp8(q, w), k_cache, page_table, key_limit)()
    ok = ref.isfinite()
    assert torch.equal(got.isnan(), ~ok)
    assert bk.rel_err(got[ok], ref[ok]) < 5e-2
    # a page-order slip would score other keys: recall of the reference's top keys stays near 1
    assert bk.topk_recall(got.nan_to_num(float("-inf")), ref, key_limit, topk=32) > 0.9


def test_recall_counts_the_shared_top_keys():
    ref = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, float("-inf")]], dtype=torch.float64)
    limit = torch.tensor([5], dtype=torch.int32)
    assert bk.topk_recall(ref, ref, limit, topk=2) == 1.0
    assert bk.topk_recall(torch.tensor([[5.0, 0.0, 3.0, 2.0, 1.0, 9.0]]), ref, limit, topk=2) == 0.5  # 9.0: past the limit
