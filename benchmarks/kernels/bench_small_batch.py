"""Small-batch decode launch shapes, old against new, in one GPU run (issue 16's batch-1 profile).

At batch 1 the old shapes ran GLM-5.2's 64-head sparse MLA as 2 programs (top-k split in two) and
the indexer's first 4096 keys of a query as 1 program, on 132 SMs. The new defaults
(`sparse_mla.default_config`, `indexer.default_config`) fill the SMs below one wave. Times are the
median of CUDA-graph replays with L2 evicted (`bench_kernels.bench`); each row's ratio is old / new.

    python3 benchmarks/kernels/bench_small_batch.py --out benchmarks/kernels/logs/small_batch.json

`--decode-shapes` times instead what session 35's tables left open: the indexer's decode logits by keys per
program (DeepGEMM's ran 4x faster at batch 32 x 4K, where the default gives 32 programs) and the top-k select
with short rows in registers (`small_row`), at batch 1-64 on 4K and 32K contexts in the decode graphs'
202,752-key width; every variant is checked against the default's output first.
"""

import argparse
import json
from pathlib import Path

import torch

# Run as a script, this folder is on sys.path already.
from bench_kernels import bench, decode_indexer_inputs

from glm_dsa_kernels import indexer, sparse_mla
from glm_dsa_kernels.indexer import IndexerConfig, indexer_topk
from glm_dsa_kernels.sparse_mla import SparseMLAConfig, sparse_mla_fwd

TOPK, HEADS, POOL = 2048, 64, 200_000
OLD_MLA = SparseMLAConfig(64, 64, 2, num_warps=8, num_stages=4)  # the old rule below one wave
OLD_INDEXER = IndexerConfig()


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


def indexer_rows():
    # width: page-table keys; served under CUDA graphs it is the context length (202752), key_limit less
    for B, keys, width in ((1, 4096, 4096), (1, 4096, 202752), (1, 131072, 131072), (8, 4096, 4096),
                           (32, 131072, 131072)):
        q, w, k_cache, page_table, query_req, key_limit = decode_indexer_inputs(B, keys)
        page_table = torch.nn.functional.pad(page_table, (0, (width - keys) // 64))
        new = indexer.default_config(B)
        old_s = bench(lambda: indexer_topk(q, w, k_cache, page_table, query_req, key_limit, TOPK, config=OLD_INDEXER))
        new_s = bench(lambda: indexer_topk(q, w, k_cache, page_table, query_req, key_limit, TOPK, config=new))
        yield {"kernel": "indexer + top-k fp8", "tokens": B, "keys": keys, "width": width, "old_us": old_s * 1e6, "new_us": new_s * 1e6,
               "old": f"{OLD_INDEXER.keys_per_program} keys/program", "new": f"{new.keys_per_program} keys/program"}


def decode_shape_rows(width=202752):
    """Per (batch, context): indexer logits at each keys-per-program against the default, then the top-k
    select of those logits with each small_row against the default (0: off); old = the default."""
    from glm_dsa_kernels.topk_select import topk_positions

    for B, keys in ((1, 4096), (8, 4096), (32, 4096), (64, 4096), (1, 32768), (32, 32768)):
        q, w, k_cache, page_table, query_req, key_limit = decode_indexer_inputs(B, keys)
        page_table = torch.nn.functional.pad(page_table, (0, (width - keys) // 64))
        default = indexer.default_config(B)
        logits = torch.full((B, width), float("-inf"), device="cuda")

        def score(config):
            return indexer.indexer_logits(q, w, k_cache, page_table, query_req, key_limit, logits, config=config)

        score(default)
        want = logits.clone()
        base = bench(lambda: score(default))
        for kpp in (256, 512, 1024, 2048, 4096):
            cfg = IndexerConfig(keys_per_program=kpp)
            logits.fill_(float("nan"))  # a variant that leaves keys unscored cannot match
            score(cfg)
            same = torch.equal(logits[:, :keys], want[:, :keys])
            t = bench(lambda: score(cfg))
            yield {"kernel": "indexer logits fp8", "tokens": B, "keys": keys, "width": width, "old_us": base * 1e6,
                   "new_us": t * 1e6, "old": f"default, {default.keys_per_program} keys/program",
                   "new": f"{kpp} keys/program", "same_output": same}
        positions = topk_positions(want, key_limit, TOPK)
        base = bench(lambda: topk_positions(want, key_limit, TOPK))
        for small_row in (4096, 8192):
            same = torch.equal(topk_positions(want, key_limit, TOPK, small_row=small_row), positions)
            t = bench(lambda: topk_positions(want, key_limit, TOPK, small_row=small_row))
            yield {"kernel": "top-k select", "tokens": B, "keys": keys, "width": width, "old_us": base * 1e6,
                   "new_us": t * 1e6, "old": "default (small_row 0)", "new": f"small_row {small_row}",
                   "same_output": same}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--decode-shapes", action="store_true", help="the indexer's decode launch shapes and small_row")
    args = ap.parse_args()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for row in decode_shape_rows() if args.decode_shapes else [*mla_rows(num_sms), *indexer_rows()]:
        row["speedup"] = row["old_us"] / row["new_us"]
        rows.append(row)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"hardware": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
