"""Triton kernels vs float64 references on fresh random data: poisoned outputs, -1 padding,
ragged lengths. "cuda" runs on a GPU; "interp" runs tiny shapes on CPU under TRITON_INTERPRET=1
(test_interpreted.py starts that in a subprocess, since the variable must be set before import)."""

import os

import pytest
import torch

from glm_dsa_kernels.batch_layout import BatchLayout, batch_layout, batch_layout_ref
from glm_dsa_kernels.indexer import IndexerConfig, indexer_logits, indexer_logits_ref, indexer_topk, quantize_index_k_fp8
from glm_dsa_kernels.index_k_store import store_index_k_fp8, store_index_k_fp8_ref
from glm_dsa_kernels.pool_rows import positions_to_pool_rows, positions_to_pool_rows_ref
from glm_dsa_kernels.rope import rope, rope_ref
from glm_dsa_kernels.sparse_mla import (
    SparseMLAConfig, default_config, quantize_kv_fp8, sparse_mla_fwd, sparse_mla_fwd_ref, warp_specialized_available,
)
from glm_dsa_kernels.topk_compact import compact_topk_rows, compact_topk_rows_ref
from glm_dsa_kernels.topk_select import topk_positions, topk_positions_ref

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cuda", marks=pytest.mark.gpu),
    pytest.param("interp", marks=pytest.mark.skipif(not INTERP, reason="needs TRITON_INTERPRET=1")),
]


def _dev(device):
    return "cuda" if device == "cuda" else "cpu"


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_fp8", [False, True])
@pytest.mark.parametrize(
    "heads,splits,prefetch",
    [(8, 1, False), (16, 2, False), (16, 3, True), (16, 1, True), (16, 8, False), (64, 1, False), (64, 4, False),
     (64, 32, False)],
)
def test_sparse_mla(device, kv_fp8, heads, splits, prefetch):
    dev = _dev(device)
    torch.manual_seed(100 + heads + splits + kv_fp8 + 13 * prefetch)
    T, P, topk = (7, 3000, 512) if device == "cuda" else (3, 300, 96)
    if device == "interp" and heads == 64:
        pytest.skip("64-head programs are too slow to interpret; the 16-head cases cover the code path")
    q = torch.randn(T, heads, 576, device=dev).bfloat16()
    kv_bf16 = torch.randn(P, 576, device=dev).bfloat16()
    kv = quantize_kv_fp8(kv_bf16) if kv_fp8 else kv_bf16
    idx = torch.randint(0, P, (T, topk), device=dev, dtype=torch.int32)
    lengths = torch.randint(1, topk + 1, (T,), device=dev)
    idx[torch.arange(topk, device=dev)[None, :] >= lengths[:, None]] = -1  # ragged, -1 padded
    idx[1] = -1  # a token with no key at all
    idx[0, ::5] = -1  # holes in the middle
    out = torch.full((T, heads, 512), float("nan"), device=dev).bfloat16()
    lse = torch.full((T, heads), float("nan"), device=dev)
    block_h = 64 if heads >= 64 else 16
    cfg = SparseMLAConfig(block_h, 16 if device == "interp" else 32, splits, 8 if block_h == 64 or prefetch else 4,
                          1 if prefetch else 2, prefetch)
    sparse_mla_fwd(q, kv, idx, 576**-0.5, out=out, lse=lse, config=cfg)
    ref_out, ref_lse = sparse_mla_fwd_ref(q, kv, idx, 576**-0.5)
    assert not out.isnan().any() and not lse.isnan().any()
    assert _rel(out, ref_out) < (2e-2 if kv_fp8 else 8e-3)
    assert torch.equal(lse[1].isinf(), torch.ones_like(lse[1], dtype=torch.bool)) and out[1].abs().max() == 0
    ok = ref_lse.isfinite()
    assert (lse[ok].double() - ref_lse[ok]).abs().max() < (2e-2 if kv_fp8 else 1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens, heads, topk", [(5, 16, 128), (1, 64, 2048), (4, 64, 2048)])
def test_sparse_mla_default_config(device, tokens, heads, topk):
    dev = _dev(device)
    if device == "interp" and heads == 64:
        pytest.skip("64-head programs are too slow to interpret")
    q = torch.randn(tokens, heads, 576, device=dev).bfloat16()
    kv = torch.randn(5000, 576, device=dev).bfloat16()
    idx = torch.randint(-1, 5000, (tokens, topk), device=dev, dtype=torch.int32)
    if device == "interp":
        out, lse = sparse_mla_fwd(q, kv, idx, 0.05, config=SparseMLAConfig(16, 16, 2, 4, 2))
    else:
        out, lse = sparse_mla_fwd(q, kv, idx, 0.05)
    ref_out, _ = sparse_mla_fwd_ref(q, kv, idx, 0.05)
    assert _rel(out, ref_out) < 8e-3


def test_default_configs_fill_the_h200_at_small_batch():
    """Batch-1 decode ran sparse MLA as 2 programs and the indexer's 4096 keys as 1 on 132 SMs."""
    from glm_dsa_kernels import indexer, sparse_mla

    splits = {t: sparse_mla.default_config(t, 64, 2048, False, 132).splits for t in (1, 4, 32, 64, 132, 256)}
    assert splits == {1: 32, 4: 32, 32: 4, 64: 2, 132: 2, 256: 1}  # T=64, 256: the swept optima
    programs = {t: indexer.default_config(t).programs_per_query for t in (1, 4, 8, 32, 64, 256)}
    assert programs == {1: 512, 4: 128, 8: 64, 32: 16, 64: 8, 256: 4}


@pytest.mark.gpu
@pytest.mark.parametrize("kv_fp8", [False, True])
@pytest.mark.parametrize("block_n,stages", [(64, 2), (32, 4)])
@pytest.mark.parametrize("heads,splits,topk", [(64, 1, 512), (64, 2, 1000), (64, 5, 2048), (128, 1, 700),
                                               (128, 32, 2048), (64, 64, 2048)])
def test_sparse_mla_warp_specialized(heads, splits, topk, block_n, stages, kv_fp8):
    """The SM90 Gluon kernel against float64, and against the Triton kernel on the same inputs:
    partial last blocks (topk 1000, 700), two head blocks, splits down to one block each."""
    if not warp_specialized_available("cuda"):
        pytest.skip("needs an SM90 GPU and Triton with Gluon")
    torch.manual_seed(heads + splits + topk)
    T, P = 7, 3000
    q = torch.randn(T, heads, 576, device="cuda").bfloat16()
    kv = torch.randn(P, 576, device="cuda").bfloat16()
    kv = quantize_kv_fp8(kv) if kv_fp8 else kv
    idx = torch.randint(0, P, (T, topk), device="cuda", dtype=torch.int32)
    lengths = torch.randint(1, topk + 1, (T,), device="cuda")
    idx[torch.arange(topk, device="cuda")[None, :] >= lengths[:, None]] = -1
    idx[1] = -1
    idx[0, ::5] = -1
    idx[2, 64:128] = -1  # a whole block masked in the middle
    out = torch.full((T, heads, 512), float("nan"), device="cuda").bfloat16()
    lse = torch.full((T, heads), float("nan"), device="cuda")
    cfg = SparseMLAConfig(64, block_n, splits, 8, stages, warp_specialized=True)
    sparse_mla_fwd(q, kv, idx, 576**-0.5, out=out, lse=lse, config=cfg)
    ref_out, ref_lse = sparse_mla_fwd_ref(q, kv, idx, 576**-0.5)
    assert not out.isnan().any() and not lse.isnan().any()
    assert _rel(out, ref_out) < (2e-2 if kv_fp8 else 8e-3)
    assert bool(lse[1].isinf().all()) and out[1].abs().max() == 0
    ok = ref_lse.isfinite()
    assert (lse[ok].double() - ref_lse[ok]).abs().max() < (2e-2 if kv_fp8 else 1e-3)
    tri_out, _ = sparse_mla_fwd(q, kv, idx, 576**-0.5, config=SparseMLAConfig(64, 64, splits, 8, 3 if kv_fp8 else 4))
    assert _rel(out, tri_out) < 8e-3


@pytest.mark.gpu
@pytest.mark.parametrize("kv_fp8", [False, True])
def test_sparse_mla_warp_specialized_is_deterministic(kv_fp8):
    """The same inputs give bit-identical outputs over many launches: a missed barrier between the
    producer's stores (FP8: codes converted inside their stage) and the consumer's reads would not."""
    if not warp_specialized_available("cuda"):
        pytest.skip("needs an SM90 GPU and Triton with Gluon")
    torch.manual_seed(0)
    T, H, P = 264, 64, 1 << 16  # two waves of CTAs on 132 SMs, unsplit
    kv = torch.randn(P, 576, device="cuda").bfloat16()
    kv = quantize_kv_fp8(kv) if kv_fp8 else kv
    q = torch.randn(T, H, 576, device="cuda").bfloat16()
    idx = torch.randint(0, P, (T, 2048), device="cuda", dtype=torch.int32)
    cfg = default_config(T, H, 2048, kv_fp8, 132, warp_specialized=True)
    first, _ = sparse_mla_fwd(q, kv, idx, 576**-0.5, config=cfg)
    for _ in range(50):
        out, _ = sparse_mla_fwd(q, kv, idx, 576**-0.5, config=cfg)
        assert torch.equal(out, first)


def test_warp_specialized_config_rules():
    """default_config picks the SM90 kernel only for a multiple of 64 heads, and an explicit
    warp-specialized config for anything else is refused by name (checked before any launch)."""
    assert default_config(64, 64, 2048, False, 132, warp_specialized=True).warp_specialized
    assert default_config(64, 64, 2048, True, 132, warp_specialized=True).warp_specialized
    assert not default_config(64, 16, 2048, False, 132, warp_specialized=True).warp_specialized
    assert not default_config(64, 64, 2048, False, 132).warp_specialized
    q = torch.zeros(2, 16, 576).bfloat16()
    kv = torch.zeros(10, 576).bfloat16()
    idx = torch.zeros(2, 64, dtype=torch.int32)
    with pytest.raises(ValueError, match="warp_specialized sparse MLA takes a multiple of 64 heads"):
        sparse_mla_fwd(q, kv, idx, 0.1, config=SparseMLAConfig(64, 64, 1, 8, 2, warp_specialized=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k_fp8", [False, True])
@pytest.mark.parametrize("config", [
    None, IndexerConfig(),
    # 3 programs a query: each walks every third key block, past its request's pages
    IndexerConfig(block_n=64, programs_per_query=3, num_stages=2, topk_sample=512),
    # query blocks: T = 7 queries of random requests, so blocks straddle requests and the last is short
    IndexerConfig(block_q=4, block_n=64, keys_per_program=128, num_stages=2, topk_sample=512),
    IndexerConfig(block_q=2, block_n=128, keys_per_program=256, num_stages=2, topk_sample=512),
    # query blocks whose key blocks are strided over 3 programs (a verify's draft tokens in a decode graph)
    IndexerConfig(block_q=4, block_n=64, keys_per_program=0, programs_per_query=3, num_stages=2, topk_sample=512),
])
def test_indexer(device, k_fp8, config):
    dev = _dev(device)
    torch.manual_seed(7 + k_fp8)
    B, max_pages, num_pages, topk = (4, 40, 200, 512) if device == "cuda" else (3, 5, 20, 64)
    k_bf16 = torch.randn(num_pages, 64, 128, device=dev).bfloat16()
    k_cache = quantize_index_k_fp8(k_bf16) if k_fp8 else k_bf16
    page_table = torch.stack([torch.randperm(num_pages, device=dev)[:max_pages] for _ in range(B)]).int()
    T = 2 * B + 1
    query_req = torch.randint(0, B, (T,), device=dev, dtype=torch.int32)
    key_limit = torch.randint(1, max_pages * 64 + 1, (T,), device=dev, dtype=torch.int32)
    key_limit[0] = topk - 3  # fewer keys than topk: -1 padding
    q = torch.randn(T, 32, 128, device=dev)
    q[1, 0] *= 1e4  # heads far from 1 in magnitude: the fp16 dot's per-head power-of-two scaling
    q[2, 1] = 0.0
    q[3, 2] *= 1e-6
    q = q.bfloat16()
    w = torch.randn(T, 32, device=dev) * 128**-0.5
    logits = torch.full((T, max_pages * 64), float("nan"), device=dev)
    indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits, config=config)
    ref = indexer_logits_ref(q, w, k_cache, page_table, query_req, key_limit)
    valid = ref.isfinite()
    assert not logits[valid].isnan().any()
    assert _rel(logits[valid], ref[valid]) < 1e-5
    # on the GPU the logits workspace holds 3 queries, so the query-chunk loop runs too
    workspace = 12 * 64 * max_pages * (3 if device == "cuda" else T)
    got = indexer_topk(q, w, k_cache, page_table, query_req, key_limit, topk, max_logits_bytes=workspace, config=config)
    # exact on the kernel's own fp32 logits (tie rule included) ...
    want = topk_positions_ref(logits.masked_fill(~valid, float("-inf")).cpu(), key_limit.cpu(), topk)
    assert torch.equal(got.cpu(), want)
    # ... and, against float64, every kept key scores at least the reference k-th score (up to fp32 noise)
    for t in range(T):
        n = int(key_limit[t])
        kept = got[t][got[t] >= 0].long()
        assert kept.numel() == min(n, topk) and (got[t, kept.numel():] == -1).all()
        if n > topk:
            kth = ref[t, :n].topk(topk).values[-1]
            assert (ref[t, kept] >= kth - 1e-4 * ref[t, :n].abs().max()).all()


@pytest.mark.parametrize("device", DEVICES)
def test_indexer_token_pages_match_64_token_pages(device):
    """Page size 1 (tree drafts): a page table of token slots reads the same keys as 64-token pages."""
    dev = _dev(device)
    torch.manual_seed(11)
    B, max_pages, num_pages, topk = (3, 6, 24, 128) if device == "cuda" else (2, 3, 8, 32)
    k_pages = torch.randn(num_pages, 64, 128, device=dev).bfloat16()
    page_table = torch.stack([torch.randperm(num_pages, device=dev)[:max_pages] for _ in range(B)]).int()
    slots = (page_table[:, :, None] * 64 + torch.arange(64, device=dev, dtype=torch.int32)).view(B, -1)
    T = 2 * B
    query_req = torch.arange(T, device=dev, dtype=torch.int32) % B
    key_limit = torch.randint(1, max_pages * 64 + 1, (T,), device=dev, dtype=torch.int32)
    q = torch.randn(T, 32, 128, device=dev).bfloat16()
    w = torch.randn(T, 32, device=dev) * 128**-0.5
    want = indexer_topk(q, w, k_pages, page_table, query_req, key_limit, topk)
    got = indexer_topk(q, w, k_pages.view(-1, 1, 128), slots, query_req, key_limit, topk)
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout,block_q,block_n", [
    ("fp8", 4, 64), ("fp8", 8, 128), ("fp8", 2, 32), ("bf16", 4, 32), ("bf16", 2, 128), ("bf16_tokens", 4, 64),
])
def test_indexer_query_blocks(device, layout, block_q, block_n):
    """The prefill kernel (block_q > 1) against float64 and against the one-query kernel: causal
    key_limits, blocks straddling requests, unsorted query_req, T not a multiple of block_q, a query
    with key_limit 0, key blocks inside one page (block_n <= 64) or across pages (128, page size 1)."""
    dev = _dev(device)
    torch.manual_seed(3)
    num_pages, topk = (300, 512) if device == "cuda" else (24, 64)
    prefix, queries = ([3000, 0, 700, 64], [150, 70, 100, 1]) if device == "cuda" else ([150, 0, 40, 64], [5, 3, 6, 1])
    B, T = len(prefix), sum(queries)
    # request b's i-th query sees prefix[b] + i + 1 keys; the first half of the queries in request
    # order (blocks of one request, then a block straddling two), the rest shuffled
    order = torch.randperm(T)
    order[: T // 2] = order[: T // 2].sort().values
    query_req = torch.cat([torch.full((n,), b, dtype=torch.int32) for b, n in enumerate(queries)])[order].to(dev)
    key_limit = torch.cat([p + torch.arange(1, n + 1, dtype=torch.int32) for p, n in zip(prefix, queries)])[order].to(dev)
    key_limit[T - 2] = 0  # no keys: the row is left as it was
    max_pages = -(-int(key_limit.max()) // 64)
    page_table = torch.stack([torch.randperm(num_pages, device=dev)[:max_pages] for _ in range(B)]).int()
    k_bf16 = torch.randn(num_pages, 64, 128, device=dev).bfloat16()
    if layout == "fp8":
        k_cache = quantize_index_k_fp8(k_bf16)
    elif layout == "bf16":
        k_cache = k_bf16
    else:  # page size 1: the page table holds each request's token slots
        k_cache = k_bf16.view(-1, 1, 128)
        page_table = (page_table[:, :, None] * 64 + torch.arange(64, device=dev, dtype=torch.int32)).view(B, -1)
    q = torch.randn(T, 32, 128, device=dev)
    q[1, 0] *= 1e4  # heads far from 1 in magnitude: the fp16 dot's per-head power-of-two scaling
    q[2, 1] = 0.0
    q = q.bfloat16()
    w = torch.randn(T, 32, device=dev) * 128**-0.5
    blocked = IndexerConfig(block_q=block_q, block_n=block_n, keys_per_program=4096 if device == "cuda" else 2 * block_n,
                            num_stages=2, topk_sample=512)
    logits, one = torch.full((2, T, max_pages * 64), float("nan"), device=dev)
    indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits, config=blocked)
    indexer_logits(q, w, k_cache, page_table, query_req, key_limit, one, config=IndexerConfig())
    ref = indexer_logits_ref(q, w, k_cache, page_table, query_req, key_limit)
    valid = ref.isfinite()
    assert torch.equal(logits.isnan(), ~valid)  # every visible key scored, nothing else written
    assert _rel(logits[valid], ref[valid]) < 1e-5
    assert _rel(logits[valid], one[valid]) < 1e-5
    got = indexer_topk(q, w, k_cache, page_table, query_req, key_limit, topk, config=blocked)
    assert torch.equal(got, indexer_topk(q, w, k_cache, page_table, query_req, key_limit, topk, config=IndexerConfig()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_q", [1, 4])
@pytest.mark.parametrize("q_terms,tol", [(2, 1e-3), (1, 6e-2)])
def test_indexer_e4m3_dot(device, block_q, q_terms, tol):
    """q_terms: FP8 keys scored by an e4m3 dot on their codes, q as one e4m3 term (SGLang's numerics:
    a few % of error) or two (a bf16 q's bits; on the GPU the fp8 MMA's accumulation leaves ~1e-4),
    in the decode and the query-blocked kernel: heads far from 1, a zero head, blocks straddling
    requests, and the launcher's top-k exact on the kernel's own logits."""
    dev = _dev(device)
    torch.manual_seed(5)
    B, max_pages, num_pages, topk = (4, 40, 200, 512) if device == "cuda" else (3, 3, 12, 32)
    k_bf16 = torch.randn(num_pages, 64, 128, device=dev).bfloat16()
    k_cache = quantize_index_k_fp8(k_bf16)
    page_table = torch.stack([torch.randperm(num_pages, device=dev)[:max_pages] for _ in range(B)]).int()
    T = 2 * B + 1
    query_req = torch.randint(0, B, (T,), device=dev, dtype=torch.int32)
    key_limit = torch.randint(1, max_pages * 64 + 1, (T,), device=dev, dtype=torch.int32)
    q = torch.randn(T, 32, 128, device=dev)
    q[1, 0] *= 1e4
    q[2, 1] = 0.0
    q[3, 2] *= 1e-6
    q = q.bfloat16()
    w = torch.randn(T, 32, device=dev) * 128**-0.5
    config = IndexerConfig(block_q=block_q, block_n=64, programs_per_query=2, keys_per_program=128, num_stages=2,
                           topk_sample=512, q_terms=q_terms)
    logits = torch.full((T, max_pages * 64), float("nan"), device=dev)
    indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits, config=config)
    ref = indexer_logits_ref(q, w, k_cache, page_table, query_req, key_limit)
    valid = ref.isfinite()
    assert torch.equal(logits.isnan(), ~valid)
    assert _rel(logits[valid], ref[valid]) < tol
    got = indexer_topk(q, w, k_cache, page_table, query_req, key_limit, topk, config=config)
    want = topk_positions_ref(logits.masked_fill(~valid, float("-inf")).cpu(), key_limit.cpu(), topk)
    assert torch.equal(got.cpu(), want)
    with pytest.raises(ValueError, match="IndexerConfig.q_terms=2: 0, or 1 or 2 with FP8 index keys"):
        indexer_logits(q, w, k_bf16, page_table, query_req, key_limit, logits, config=IndexerConfig(q_terms=2))


def test_indexer_default_config_blocks_prefill_only():
    """default_config: one query a program unless a request brings >= 64 queries (prefill)."""
    from glm_dsa_kernels import indexer

    for t in (1, 4, 8, 32, 64, 4096):
        assert indexer.default_config(t) == indexer.default_config(t, 63) and indexer.default_config(t).block_q == 1
    prefill = indexer.default_config(2048, 2048)
    assert prefill.block_q > 1 and prefill == indexer.default_config(2048, 64)
    assert prefill.keys_per_program % prefill.block_n == 0
    # the launchers' default counts queries per page-table row: a prefill chunk, a decode batch, a verify
    assert indexer._default_for(2048, torch.zeros(1, 512, dtype=torch.int32)) == prefill
    assert indexer._default_for(64, torch.zeros(64, 512, dtype=torch.int32)) == indexer.default_config(64)
    assert indexer._default_for(256, torch.zeros(64, 512, dtype=torch.int32)).block_q == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk,block,sample,small_row", [(1024, 1024, 1024, 256), (2048, 512, 256, 256),
                                                          (1024, 1024, 1024, 4096)])
def test_topk_select_ties(device, chunk, block, sample, small_row):
    """The reference's positions exactly, through the staged path (rows over small_row keys) and
    from registers (the rest)."""
    dev = _dev(device)
    W = 20000 if device == "cuda" else 3000
    logits = torch.randn(8, W, device=dev)
    logits[1] = torch.randint(0, 4, (W,), device=dev).float()  # heavy ties at the cut
    logits[2] = -1.5  # all equal
    logits[3, ::2] = -0.0
    logits[3, 1::2] = 0.0
    logits[6] = torch.rand(W, device=dev) + 3.0  # every key shares its leading digit: all four digits decide
    stride = -(-W // sample)
    logits[7] = -1.0  # every sampled key is high: too few candidates, the row is walked whole
    logits[7, ::stride] = 5.0 + torch.rand(logits[7, ::stride].shape, device=dev)
    key_limit = torch.tensor([W, W - 7, 2049, W // 2, 17, 300, W, W], dtype=torch.int32, device=dev)
    got = topk_positions(logits, key_limit, 300, chunk=chunk, block=block, select_block=256, sample=sample,
                         small_row=small_row)
    assert torch.equal(got.cpu(), topk_positions_ref(logits.cpu(), key_limit.cpu(), 300))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("small_row", [None, 512])
def test_topk_select_short_rows_in_wide_logits(device, small_row, monkeypatch):
    """Decode graphs size the logits for the longest context: rows well under one chunk, and just over,
    keep exactly the reference's top-k with garbage past their keys, and the select reads no chunk
    past a row's keys (those chunks' counts and stretches poisoned after the candidates launch)."""
    from glm_dsa_kernels import topk_select

    dev = _dev(device)
    torch.manual_seed(11)
    W, chunk, topk = (202752, 8192, 2048) if device == "cuda" else (5157, 1024, 300)
    kw = {} if device == "cuda" else dict(chunk=chunk, block=512, select_block=256, sample=256)
    kw.update({"small_row": small_row} if small_row else {})
    lengths = [0, 17, topk, topk + 1, chunk // 2, chunk, chunk + 1, chunk + chunk // 8, W]
    lengths += [n for n in (small_row or topk_select.SMALL_ROW, (small_row or topk_select.SMALL_ROW) + 1) if n <= W]
    logits = torch.randn(len(lengths), W, device=dev)
    for t, n in enumerate(lengths):
        logits[t, n:] = float("inf") if t % 2 else 3e38
    key_limit = torch.tensor(lengths, dtype=torch.int32, device=dev)
    want = topk_positions_ref(logits.cpu(), key_limit.cpu(), topk)
    assert torch.equal(topk_positions(logits, key_limit, topk, **kw).cpu(), want)

    candidates = topk_select._candidates_kernel

    class Poisoned:
        def __getitem__(self, grid):
            def launch(logits, key_limit, bound, cand_key, cand_pos, num_cand, *args, CHUNK, **kwargs):
                candidates[grid](logits, key_limit, bound, cand_key, cand_pos, num_cand, *args, CHUNK=CHUNK, **kwargs)
                for t, n in enumerate(key_limit.tolist()):
                    used = -(-n // CHUNK)
                    num_cand[t, used:] = 1  # each chunk past the row's keys: a key above any score, at a bogus position
                    cand_key[t, used * CHUNK:] = -1
                    cand_pos[t, used * CHUNK:] = W + 5
            return launch

    monkeypatch.setattr(topk_select, "_candidates_kernel", Poisoned())
    assert torch.equal(topk_positions(logits, key_limit, topk, **kw).cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_compaction(device):
    dev = _dev(device)
    rows = torch.randint(-1, 10**6, (13, 2048), device=dev, dtype=torch.int32)
    cu = torch.tensor([0, 3, 4, 9, 13], device=dev, dtype=torch.int32)
    accept = torch.tensor([3, 1, 2, 4], device=dev, dtype=torch.int32)
    out = torch.full((4, 2048), -7, device=dev, dtype=torch.int32)
    assert torch.equal(compact_topk_rows(rows, cu, accept, out=out), compact_topk_rows_ref(rows, cu, accept))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("topk", [2048, 100])
def test_pool_rows(device, topk):
    dev = _dev(device)
    # a table wider than it is used, rows of the batch's queries in any order, -1 anywhere in a row
    table = torch.randperm(5 * 3000, device=dev).to(torch.int32).view(5, 3000)[:, :2500]
    query_req = torch.tensor([3, 0, 3, 4, 1, 2, 2], device=dev, dtype=torch.int32)
    positions = torch.randint(0, 2500, (7, topk), device=dev, dtype=torch.int32)
    positions[torch.rand(7, topk, device=dev) < 0.2] = -1
    positions[1] = -1
    out = torch.full((7, topk), -7, device=dev, dtype=torch.int32)
    want = positions_to_pool_rows_ref(positions, table, query_req)
    assert torch.equal(positions_to_pool_rows(positions, table, query_req, out=out), want)
    assert torch.equal(out, want) and (want[1] == -1).all() and (want[0] >= 0).sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("heads,key_heads,width,rope_dim", [(1, 1, 64, 64), (5, 1, 64, 64), (3, 1, 128, 64),
                                                            (70, 2, 64, 64)])  # two query blocks, two key heads
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("nope", [192, 189])  # rows on 16-byte boundaries (vector loads), and not
def test_rope(device, interleaved, heads, key_heads, width, rope_dim, dtype, nope):
    """Query and key from strided views (the rope columns of a wider projection row) into strided
    destinations (the query rows' rope columns), poisoned around them: only the outputs' own columns change."""
    dev = _dev(device)
    torch.manual_seed(heads + width + interleaved)
    T, P = 6, 50
    proj = torch.randn(T, heads, width + nope, device=dev).to(dtype)
    q = proj[..., nope:]  # strided, as q[..., nope:] or a head's first columns
    k = torch.randn(T, key_heads, width + nope, device=dev).to(dtype)[..., nope:]
    positions = torch.randint(0, P, (T,), device=dev)
    cos_sin = torch.randn(P, rope_dim, device=dev)  # any values: the kernel must not assume |cos|, |sin| <= 1
    q_dest = torch.full((T, heads, width + 512), float("nan"), device=dev).to(dtype)
    k_dest = torch.full((T, key_heads, width + 512), float("nan"), device=dev).to(dtype)
    q_out, k_out = q_dest[..., 512:], k_dest[..., 512:]
    want_q, want_k = rope_ref(q, k, positions, cos_sin, torch.empty_like(q), torch.empty_like(k), interleaved)
    rope(q, k, positions, cos_sin, q_out, k_out, interleaved)
    tol = dict(rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-5)
    torch.testing.assert_close(q_out, want_q, **tol)
    torch.testing.assert_close(k_out, want_k, **tol)
    assert torch.isnan(q_dest[..., :512]).all() and torch.isnan(k_dest[..., :512]).all()  # nothing outside out
    assert torch.equal(q_out[0, :, rope_dim:], q[0, :, rope_dim:]) and not torch.equal(q_out[1], q[1])
    assert torch.equal(k_out[0, :, rope_dim:], k[0, :, rope_dim:]) and not torch.equal(k_out[1], k[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["decode", "verify", "draft_step", "draft_extend"])
@pytest.mark.parametrize("page", [1, 64])
def test_batch_layout(device, mode, page):
    """One launch against the plain-torch layout, into poisoned graph buffers larger than the batch."""
    dev = _dev(device)
    torch.manual_seed(7 + len(mode) + page)
    R, W, B = 9, 640, 5
    req_to_token = torch.randperm(R * W, device=dev).to(torch.int32).view(R, W)
    req = torch.randperm(R, device=dev)[:B]
    n = {"decode": 1, "verify": 4, "draft_step": 1, "draft_extend": 4}[mode]
    seq_lens = torch.randint(1, W - 8, (B,), device=dev)
    seq_lens[-1] = 1  # a graph's padded row: seq_lens is the fill value
    kw = {"decode": dict(positions=(seq_lens - 1).repeat_interleave(n)),
          "verify": dict(offset=1, ramp=True, draft_start=True),
          "draft_step": dict(offset=2),
          "draft_extend": dict(offset=1 - n, ramp=True)}[mode]
    pages = -(-W // page) if page == 64 else 37  # page size 1: a batch's width, not the table's
    poison = -12345
    out = BatchLayout(*(torch.full((32,), poison, dtype=torch.int32, device=dev) for _ in range(3)),
                      torch.full((8, -(-W // page)), poison, dtype=torch.int32, device=dev),
                      torch.full((32,), poison, dtype=torch.int32, device=dev))
    got = batch_layout(req, seq_lens, req_to_token, n, pages, page, out=out, **kw)
    want = batch_layout_ref(req, seq_lens, req_to_token, n, pages, page, **kw)
    for name, g, w in zip(BatchLayout._fields, got, want):
        assert (g is None) == (w is None), name
        if w is not None:
            assert torch.equal(g.cpu(), w.cpu()), name
    assert got.key_limit.data_ptr() == out.key_limit.data_ptr() and got.page_table.shape == (B, pages)
    assert (got.key_limit >= 1).all() and (out.key_limit[B * n:] == poison).all()
    fresh = batch_layout(req, seq_lens, req_to_token, n, pages, page, **kw)
    assert torch.equal(fresh.page_table.cpu(), want.page_table.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_index_k_store_fp8(device, dtype):
    """The one-launch FP8 index-key store writes exactly the bytes of the torch quantizer's, into exactly
    the slots named (every other byte of the pages kept): keys of every magnitude, an all-zero key (the
    scale's floor), a key whose amax lands on 448, ties of e4m3's rounding, its subnormals."""
    dev = _dev(device)
    torch.manual_seed(11)
    T, pages = (300, 8) if device == "cuda" else (6, 2)
    k = (torch.randn(T, 128, device=dev) * torch.logspace(-4, 3, T, device=dev)[:, None]).to(dtype)
    k[1] = 0
    k[2, 5] = 448.0
    # amax 448 makes row 2's scale 1: ties between e4m3 neighbours, subnormal ties, a negative zero
    k[2, 6:14] = torch.tensor([1.0625, 1.1875, -1.1875, 1.5 * 2**-9, 2.5 * 2**-9, 2**-10, -(2**-10), 0.0])
    loc = torch.randperm(pages * 64, device=dev)[:T]
    want = torch.randint(0, 256, (pages, 64 * 132), dtype=torch.uint8, device=dev)
    got = want.clone()
    store_index_k_fp8_ref(k, loc, want)
    store_index_k_fp8(k, loc, got)
    assert torch.equal(got, want), f"{(got != want).sum().item()} bytes differ"
    store_index_k_fp8(k[:0], loc[:0], got)  # no keys: no launch
    assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_index_k_store_fp8_rounds_every_code_like_torch(device):
    """Every e4m3 value and every midpoint between neighbours, both signs, in keys whose amax is 448 (scale
    1): the store's codes are torch's cast's, ties to even included."""
    dev = _dev(device)
    values = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    x = torch.cat([values, (values[1:] + values[:-1]) / 2])
    x = torch.cat([x, -x, torch.zeros(-2 * len(x) % 127)]).view(-1, 127)
    k = torch.cat([x, torch.full((len(x), 1), 448.0)], dim=1).to(dev)
    loc = torch.arange(len(k), device=dev)
    got = torch.zeros(1, 64 * 132, dtype=torch.uint8, device=dev)
    store_index_k_fp8(k, loc, got)
    want = k.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(got[0, : k.numel()].view_as(want), want)
