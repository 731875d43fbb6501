"""Small-batch decode launch shapes, old against new, in one GPU run (issue 16's batch-1 profile).

At batch 1 the old shapes ran GLM-5.2's 64-head sparse MLA as 2 programs (top-k split in two) on 132
SMs; `sparse_mla.default_config` fills the SMs below one wave. (The indexer's half of that run, 2026-12-02,
timed a decode kernel since replaced: `--decode-shapes` below.) Times are the median of CUDA-graph
replays with L2 evicted (`bench_kernels.bench`); each row's ratio is old / new.

    python3 benchmarks/kernels/bench_small_batch.py --out benchmarks/kernels/logs/small_batch.json

`--decode-shapes` times instead the indexer's decode kernel by launch shape (session 35's tables: DeepGEMM's
paged logits ran 2-4x faster at batch 8-64 x 4K), at batch 1-64 on 4K and 32K contexts in the decode
graphs' 202,752-key width, and an MTP verify's 4 queries a request per-query against in query blocks,
against a `--before` copy's default and DeepGEMM's where it imports.
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

# Run as a script, this folder is on sys.path already.
from bench_kernels import bench, decode_indexer_inputs

from glm_dsa_kernels import indexer, sparse_mla
from glm_dsa_kernels.indexer import IndexerConfig
from glm_dsa_kernels.sparse_mla import SparseMLAConfig, sparse_mla_fwd

TOPK, HEADS, POOL = 2048, 64, 200_000
OLD_MLA = SparseMLAConfig(64, 64, 2, num_warps=8, num_stages=4)  # the old rule below one wave


def mla_rows(num_sms):
    torch.manual_seed(0)
    kv = torch.randn(POOL, 576, device="cuda").bfloat16()
    for T in (1, 4, 8, 32):
        q = torch.randn(T, HEADS, 576, device="cuda").bfloat16()
        idx = torch.randint(0, POOL, (T, TOPK), device="cuda", dtype=torch.int32)
        new = sparse_mla.default_config(T, HEADS, TOPK, False, num_sms)
        old_s = bench(lambda: sparse_mla_fwd(q, kv, idx, 0.05, config=OLD_MLA))
        new_s = bench(lambda: sparse_mla_fwd(q, kv, idx, 0.05, config=new))
        yield {"kernel": "sparse MLA bf16", "tokens": T, "heads": HEADS, "topk": TOPK, "old_us": old_s * 1e6,
               "new_us": new_s * 1e6, "old": f"splits {OLD_MLA.splits}", "new": f"splits {new.splits}"}


def decode_shape_rows(before: Path | None, width=202752):
    """Per (batch, context, queries per request) in the decode graphs' width: this tree's indexer at
    its default and at other launch shapes, against `before`'s default (old: a glm_dsa_kernels copy;
    else this tree's default) and DeepGEMM's paged logits where deep_gemm imports (a verify's queries
    as rows of their own, as SGLang's path hands them over); each variant checked against old first.
    Decode rows: the default's neighbours in programs per query and the e4m3 dot (session 36 swept
    the rest). Verify rows (4 queries a request): the per-query kernel (the default) against query
    blocks of a request's 4 queries, each key block read once for the 4, strided over P programs."""
    from bench_kernels import deepgemm_decode_logits, load_previous, quantize_q_fp8, rel_err

    old_indexer = load_previous(before, "indexer", name="before")[0] if before else indexer
    try:
        import deep_gemm  # noqa: F401
    except ImportError:
        deep_gemm = None
    shapes = [(B, keys, 1) for B, keys in ((1, 4096), (8, 4096), (32, 4096), (64, 4096), (1, 32768), (8, 32768),
                                           (32, 32768))]
    shapes += [(B, keys, 4) for B, keys in ((1, 4096), (8, 4096), (32, 4096), (1, 32768), (8, 32768), (32, 32768))]
    for B, keys, per in shapes:
        q, w, k_cache, page_table, query_req, key_limit = decode_indexer_inputs(B, keys, per)
        page_table = torch.nn.functional.pad(page_table, (0, (width - keys) // 64))
        T = B * per
        seen = torch.arange(keys, device="cuda")[None, :] < key_limit[:, None]
        logits = torch.full((T, width), float("-inf"), device="cuda")
        old_indexer.indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits)
        want = logits[:, :keys][seen]
        base = bench(lambda: old_indexer.indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits))
        default = indexer.default_config(T, per)
        p = default.programs_per_query
        variants = [("default", default)]
        if per == 1:
            variants += [(f"{p2} programs/query", replace(default, programs_per_query=p2)) for p2 in (p // 2, 2 * p)]
            variants += [("e4m3 dot (1 q term)", replace(default, q_terms=1))]
        else:
            p0 = max(4, 512 >> max(B - 1, 0).bit_length())  # the decode rule, a block counted as one query
            variants += [(f"{per}-query blocks, {p2} programs/block, {st} stages",
                          IndexerConfig(block_q=per, block_n=64, keys_per_program=0, programs_per_query=p2,
                                        num_stages=st)) for p2, st in ((p0 // 2, 5), (p0, 5), (2 * p0, 5), (p0, 3))]
        row = {"kernel": "indexer logits fp8", "tokens": T, "requests": B, "queries_per_request": per, "keys": keys,
               "width": width, "old_us": base * 1e6, "old": f"{'before' if before else 'this tree'}'s default"}
        for name, cfg in variants:
            logits.fill_(float("nan"))  # a variant that leaves keys unscored cannot match
            indexer.indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits, config=cfg)
            t = bench(lambda: indexer.indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits,
                                                     config=cfg))
            if name == "default":
                name = f"default ({cfg.programs_per_query} programs/query, block_n {cfg.block_n}, {cfg.num_stages} stages)"
            yield {**row, "new_us": t * 1e6, "new": name, "rel_err": rel_err(logits[:, :keys][seen], want)}
        if deep_gemm is not None:
            rows = page_table.repeat_interleave(per, 0).contiguous()  # a query, a row: SGLang's verify layout
            run = deepgemm_decode_logits(*quantize_q_fp8(q, w), k_cache, rows, key_limit)
            got = run()
            t = bench(run)
            yield {**row, "new_us": t * 1e6, "new": "deepgemm fp8_paged_mqa_logits (fp8 q, quantized outside)",
                   "rel_err": rel_err(got[:, :keys][seen], want)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--decode-shapes", action="store_true", help="the indexer's decode launch shapes")
    ap.add_argument("--before", type=Path, help="--decode-shapes: a glm_dsa_kernels copy whose default is the baseline")
    args = ap.parse_args()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for row in decode_shape_rows(args.before) if args.decode_shapes else mla_rows(num_sms):
        row["speedup"] = row["old_us"] / row["new_us"]
        rows.append(row)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"hardware": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
