"""Every launch variant a served batch can select, built before the first request.

Triton builds a kernel variant at its first launch with new constexprs or a new pointer alignment
(0.1-2 s each; Triton's disk cache makes later processes load it in milliseconds). CUDA graphs
build the decode-shaped variants while they capture, but prefill batches run eagerly, so a user's
first long prompt used to pay for its variants inside the request. The launchers pick their
constexprs from a few inputs only, so the variants are enumerable:

- the indexer: `indexer.default_config(query count, queries per request)` (the query-blocked
  prefill kernel at >= 64 queries per request, and the keys each program scores);
- the top-k select: `MAX_CHUNKS`, the power of two above the row's width in top-k chunks, so one
  variant per power of two up to the longest context;
- sparse MLA: `sparse_mla.default_config(query count, heads, ...)` (top-k splits below one wave of
  programs, and with them the merge kernel);
- the batch layout: decode from positions, target verify, chain draft step, draft-extend window;
- positions -> pool rows: one variant;
- FP8 index keys into their pages (FP8 KV): one variant, launched on a scratch page;
- RoPE: one variant per rotated tensor of a layer (the query's and key's rope columns, the index
  query and key), by width, pass-through columns, head block, pair layout and dtype.

Integers that only bound loops or masks (query counts, chunk counts, page-table strides) are left
unspecialized in the kernels (`do_not_specialize`), so their values add no variants.
`warm_up` launches one representative of each variant on zero-filled inputs read from the served
KV pool's own buffers (same dtypes and layouts as a served forward; nothing is written to them: the
index-key store writes into a scratch page of the same layout).
"""

from dataclasses import dataclass

import torch

from . import indexer, sparse_mla
from .batch_layout import batch_layout
from .index_k_store import store_index_k_fp8
from .layout import INDEX_DIM, INDEX_HEADS, ROPE_DIM
from .pool_rows import positions_to_pool_rows
from .rope import rope
from .topk_select import topk_positions


@dataclass(frozen=True)
class WarmUpShapes:
    """What selects a variant on a served model (one tensor-parallel rank)."""

    heads: int  # attention heads of this rank
    topk: int  # index_topk
    page: int  # tokens per index-K page
    max_keys: int  # the longest context a request can reach (the page table's width in keys)
    num_sms: int
    warp_specialized: bool  # sparse MLA may take the SM90 warp-specialized kernel
    draft_tokens: int = 0  # MTP tokens verified per request per round (0: no speculative decoding)
    rope_interleave: bool = True  # the config's rope_interleave: MLA's rope pairs
    index_rope_interleave: bool = True  # indexer_rope_interleave: the index heads' pairs
    dtype: torch.dtype = torch.bfloat16  # activations: the rotated rows


def rope_variants(shapes: WarmUpShapes) -> list[tuple[int, int, bool]]:
    """(query heads, width, interleaved) of each rotation a layer launches, its key rows (one head) beside:
    the MLA query's and key's rope columns, then the index query and key (rope first, then pass-through)."""
    return [(shapes.heads, ROPE_DIM, shapes.rope_interleave), (INDEX_HEADS, INDEX_DIM, shapes.index_rope_interleave)]


def indexer_variants(max_queries: int = 128) -> dict:
    """{IndexerConfig: (queries, requests)}: one batch per indexer launch config. Decode-shaped
    batches (one query per request) and prefill-shaped ones (all queries in one request); configs
    stop changing at 128 queries (keys per program saturate at 32 query blocks)."""
    variants = {}
    for t in range(1, max_queries + 1):
        for requests in (t, 1):
            variants.setdefault(indexer.default_config(t, t // requests), (t, requests))
    return variants


def sparse_mla_variants(shapes: WarmUpShapes, kv_fp8: bool) -> dict:
    """{SparseMLAConfig: queries}: splits stop changing above one wave (num_sms queries)."""
    variants = {}
    for t in range(1, shapes.num_sms + 2):
        config = sparse_mla.default_config(t, shapes.heads, shapes.topk, kv_fp8, shapes.num_sms,
                                           shapes.warp_specialized)
        variants.setdefault(config, t)
    return variants


def topk_widths(max_keys: int, chunk: int) -> list[int]:
    """A row width (keys) for each MAX_CHUNKS the top-k select can see, up to max_keys."""
    widths, chunks = [], 1
    while True:
        widths.append(min(chunks * chunk, max_keys))
        if chunks * chunk >= max_keys:
            return widths
        chunks *= 2


def warm_up(shapes: WarmUpShapes, index_k_cache: torch.Tensor, mla_rows: torch.Tensor,
            req_to_token: torch.Tensor) -> int:
    """Launch every variant once on the served buffers' layouts; returns the number of launch
    configurations (each one variant per kernel it runs).

    index_k_cache: one full layer's index-K pages as the indexer reads them; mla_rows: one layer's
    latent+rope rows; req_to_token: SGLang's request-to-token table (int32)."""
    dev = mla_rows.device
    launches = 0
    pages = 2  # a small page table: the variants do not depend on its width (left unspecialized)

    def zeros(*shape, dtype=torch.int32):
        return torch.zeros(shape, dtype=dtype, device=dev)

    configs = indexer_variants()
    for config, (t, requests) in configs.items():
        q = zeros(t, indexer.N_HEADS, indexer.HEAD_DIM, dtype=torch.bfloat16)
        query_req = torch.arange(t, dtype=torch.int32, device=dev) // (t // requests)
        key_limit = torch.full((t,), pages * shapes.page, dtype=torch.int32, device=dev)
        indexer.indexer_topk(q, zeros(t, indexer.N_HEADS, dtype=torch.float32), index_k_cache,
                             zeros(requests, pages), query_req, key_limit, shapes.topk, config=config)
        launches += 1
    for chunk, block, select_block, sample, small_row in {
        (c.topk_chunk, c.topk_block, c.topk_select_block, c.topk_sample, c.topk_small_row) for c in configs
    }:
        for width in topk_widths(shapes.max_keys, chunk):
            topk_positions(zeros(1, width, dtype=torch.float32), torch.full((1,), width, dtype=torch.int32, device=dev),
                           shapes.topk, chunk=chunk, block=block, select_block=select_block, sample=sample,
                           small_row=small_row)
            launches += 1
    positions_to_pool_rows(zeros(1, shapes.topk), req_to_token, zeros(1))
    launches += 1
    if index_k_cache.dtype == torch.uint8:  # FP8 index keys
        store_index_k_fp8(zeros(1, INDEX_DIM, dtype=shapes.dtype), zeros(1, dtype=torch.int64),
                          torch.zeros_like(index_k_cache[:1]))
        launches += 1
    for heads, width, interleaved in dict.fromkeys(rope_variants(shapes)):
        q, k = zeros(1, heads, width, dtype=shapes.dtype), zeros(1, 1, width, dtype=shapes.dtype)
        rope(q, k, zeros(1, dtype=torch.int64), zeros(1, ROPE_DIM, dtype=torch.float32), torch.empty_like(q),
             torch.empty_like(k), interleaved)
        launches += 1
    for config, t in sparse_mla_variants(shapes, mla_rows.dtype == torch.uint8).items():
        q = zeros(t, shapes.heads, sparse_mla.D_QK, dtype=torch.bfloat16)
        sparse_mla.sparse_mla_fwd(q, mla_rows, zeros(t, shapes.topk), 1.0, config=config)
        launches += 1
    req, seq_lens = zeros(1), torch.ones(1, dtype=torch.int32, device=dev)
    n = max(shapes.draft_tokens, 1)
    layouts = [dict(per_request=1, positions=zeros(1))]  # decode
    if shapes.draft_tokens:
        layouts += [dict(per_request=n, offset=1, ramp=True, draft_start=True),  # target verify
                    dict(per_request=1, offset=1),  # a chain draft step
                    dict(per_request=n, offset=1 - n, ramp=True)]  # draft-extend over the verified window
    for layout in layouts:
        batch_layout(req, seq_lens, req_to_token, pages=pages, page=shapes.page, **layout)
        launches += 1
    return launches


__all__ = ["WarmUpShapes", "indexer_variants", "rope_variants", "sparse_mla_variants", "topk_widths", "warm_up"]
