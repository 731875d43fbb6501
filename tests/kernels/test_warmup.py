"""The start-up warm-up (glm_dsa_kernels.warmup) covers every launch variant a served batch can select.

The enumeration is checked against the launchers' own config functions over every batch shape up to
large sizes (CPU); the warm-up itself runs on tiny shapes under the Triton interpreter; on a GPU,
after `warm_up`, served-like launches of random shapes must build no new variant.
"""

import os
import random

import pytest
import torch
import triton

from glm_dsa_kernels import indexer, sparse_mla
from glm_dsa_kernels.index_k_store import store_index_k_fp8
from glm_dsa_kernels.pool_rows import positions_to_pool_rows
from glm_dsa_kernels.rope import rope
from glm_dsa_kernels.warmup import WarmUpShapes, indexer_variants, rope_variants, sparse_mla_variants, topk_widths, warm_up

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


def test_indexer_variants_cover_every_batch_shape():
    covered = set(indexer_variants())
    for t in [*range(1, 600), 1000, 4096, 8191, 16384, 65536]:
        for requests in {1, 2, 3, 7, 64, t // 64 or 1, t // 2 or 1, t}:
            assert indexer.default_config(t, t // requests) in covered, (t, requests)
    assert {c.block_q for c in covered} == {1, 4}  # decode-shaped and query-blocked prefill launches


@pytest.mark.parametrize("heads,kv_fp8,num_sms,warp_specialized",
                         [(64, False, 132, True), (64, True, 132, False), (8, False, 132, False), (16, True, 78, False)])
def test_sparse_mla_variants_cover_every_query_count(heads, kv_fp8, num_sms, warp_specialized):
    shapes = WarmUpShapes(heads=heads, topk=2048, page=64, max_keys=1 << 17, num_sms=num_sms,
                          warp_specialized=warp_specialized)
    covered = set(sparse_mla_variants(shapes, kv_fp8))
    for t in [*range(1, 1000), 4096, 16384, 1 << 20]:
        assert sparse_mla.default_config(t, heads, 2048, kv_fp8, num_sms, warp_specialized) in covered, t
    assert len(covered) > 1  # split counts below one wave, one program per token above


@pytest.mark.parametrize("max_keys", [64, 8192, 8193, 100_000, 131072, 202752])
def test_topk_widths_cover_every_chunk_count(max_keys):
    chunk = indexer.IndexerConfig().topk_chunk
    widths = topk_widths(max_keys, chunk)
    assert max(widths) == max_keys
    seen = {triton.next_power_of_2(triton.cdiv(w, chunk)) for w in widths}
    for w in [*range(1, max_keys + 1, 997), max_keys]:
        assert triton.next_power_of_2(triton.cdiv(w, chunk)) in seen, w


def _tiny_pool(dev, page, kv_fp8):
    k_cache = torch.zeros(8, page, indexer.HEAD_DIM, dtype=torch.bfloat16, device=dev)
    rows = (torch.zeros(64, sparse_mla.FP8_ROW_BYTES, dtype=torch.uint8, device=dev) if kv_fp8
            else torch.zeros(64, sparse_mla.D_QK, dtype=torch.bfloat16, device=dev))
    return k_cache, rows, torch.zeros(4, 8 * page, dtype=torch.int32, device=dev)


@pytest.mark.skipif(not INTERP, reason="needs TRITON_INTERPRET=1 (test_interpreted.py)")
def test_warm_up_runs_interp():
    shapes = WarmUpShapes(heads=16, topk=64, page=64, max_keys=512, num_sms=4, warp_specialized=False, draft_tokens=4)
    launches = warm_up(shapes, *_tiny_pool("cpu", 64, kv_fp8=False))
    assert launches == (len(indexer_variants()) + len(topk_widths(512, 8192)) + len(sparse_mla_variants(shapes, False))
                        + 1 + len(rope_variants(shapes)) + 4)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_fp8", [False, True])
def test_no_variant_built_after_warm_up(kv_fp8):
    """Served-like launches (random query counts, requests, context widths) after the warm-up build nothing."""
    from triton import knobs

    dev = "cuda"
    page, max_keys = 64, 1 << 17
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    shapes = WarmUpShapes(heads=64, topk=2048, page=page, max_keys=max_keys, num_sms=num_sms,
                          warp_specialized=sparse_mla.warp_specialized_available(dev), draft_tokens=4)
    pages = max_keys // page
    k_cache = torch.zeros(pages, page, indexer.HEAD_DIM, dtype=torch.bfloat16, device=dev)
    if kv_fp8:
        k_cache = indexer.quantize_index_k_fp8(k_cache)
    rows = torch.zeros(4096, sparse_mla.D_QK, dtype=torch.bfloat16, device=dev)
    rows = sparse_mla.quantize_kv_fp8(rows) if kv_fp8 else rows
    req_to_token = torch.arange(max_keys, dtype=torch.int32, device=dev).repeat(4, 1)
    warm_up(shapes, k_cache, rows, req_to_token)
    built = []
    knobs.runtime.jit_post_compile_hook = lambda *, fn, **_: built.append(fn.name)
    try:
        rng = random.Random(0)
        for _ in range(40):
            t = rng.choice([1, 2, 3, 5, 17, 31, 64, 100, 333, 1000, 4099])
            requests = rng.choice([1, t])
            width_pages = rng.randint(1, pages)
            q = torch.randn(t, indexer.N_HEADS, indexer.HEAD_DIM, device=dev).bfloat16()
            page_table = torch.randint(0, pages, (requests, width_pages), dtype=torch.int32, device=dev)
            query_req = (torch.arange(t, device=dev) // (t // requests)).int()
            key_limit = torch.randint(1, width_pages * page + 1, (t,), dtype=torch.int32, device=dev)
            top = indexer.indexer_topk(q, torch.rand(t, indexer.N_HEADS, device=dev), k_cache, page_table, query_req,
                                       key_limit, shapes.topk)
            pool_rows = positions_to_pool_rows(top, req_to_token, query_req % req_to_token.shape[0])
            sparse_mla.sparse_mla_fwd(torch.randn(t, 64, sparse_mla.D_QK, device=dev).bfloat16(), rows,
                                      pool_rows.clamp(max=rows.shape[0] - 1), 0.04)
            # the layer's rotations, from views as the model takes them (positions at any offset)
            positions = torch.randint(0, 4096, (t + 3,), device=dev)[rng.randint(0, 3):][:t]
            cos_sin = torch.randn(4096, 64, device=dev)
            q, qkv_a = torch.randn(t, 64, 256, device=dev).bfloat16(), torch.randn(t, 2048 + 576, device=dev).bfloat16()
            query = torch.empty(t, 64, sparse_mla.D_QK, device=dev).bfloat16()
            rope(q[..., 192:], qkv_a[:, None, 2048 + 512:], positions, cos_sin, query[..., 512:],
                 torch.empty(t, 1, 64, device=dev).bfloat16(), True)
            q_idx = torch.randn(t, indexer.N_HEADS, indexer.HEAD_DIM, device=dev).bfloat16()
            k_idx = torch.randn(t, 1, indexer.HEAD_DIM, device=dev).bfloat16()
            rope(q_idx, k_idx, positions, cos_sin, torch.empty_like(q_idx), torch.empty_like(k_idx), True)
            if kv_fp8:
                store_index_k_fp8(k_idx[:, 0], torch.randperm(pages * page, device=dev)[:t], k_cache)
    finally:
        knobs.runtime.jit_post_compile_hook = None
    assert not built, f"variants built after the warm-up: {sorted(set(built))}"
