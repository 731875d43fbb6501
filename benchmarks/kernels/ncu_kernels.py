"""Launch one benchmark problem's kernels a few times for Nsight Compute (ncu) to profile.

  pip install -e .   # glm_dsa_kernels, from kernels/glm_dsa_kernels/
  bash benchmarks/kernels/ncu_targets.sh OUT          # every problem below, one report each
  ncu --clock-control none -k regex:_indexer_logits_kernel --launch-skip 2 --launch-count 2 \\
      --section SpeedOfLight --section WarpStateStats ... \\
      python3 benchmarks/kernels/ncu_kernels.py indexer-logits --prev DIR

Problems (the shapes of issue 17's targets, default launch shapes, so each report explains one
target that the bench scores):
  mla-bf16   sparse MLA decode, BF16 KV, --tokens (64) x --heads (16)
  mla-fp8    sparse MLA decode, FP8 KV (656-byte rows), --tokens (256) x --heads (16)
  mla-64h    sparse MLA, BF16 KV, 64 heads, --tokens (256; 4096 = the prefill-sized call)
  indexer-logits   decode indexer logits, batch 64 x 64K FP8 keys; with --prev DIR (an older copy of
                   the package folder, see sweep.py) alternating with that copy's kernel
  indexer-prefill  prefill indexer logits, 2048 queries at the end of a 32K context, causal
  topk       top-k 2048 select over batch 64 x 64K logits
Each problem runs its kernels twice (profile with --launch-skip to the second launch).
"""

import argparse
from pathlib import Path

import torch

# Run as a script, this folder is on sys.path already.
from bench_kernels import decode_indexer_inputs, load_previous, mla_inputs, prefill_indexer_inputs


def _mla(tokens, heads, fp8):
    from glm_dsa_kernels.sparse_mla import quantize_kv_fp8, sparse_mla_fwd

    kv = torch.randn(1 << 20, 576, device="cuda", dtype=torch.bfloat16)
    q, idx = mla_inputs(kv, tokens, heads, 2048, 7)
    if fp8:
        kv = quantize_kv_fp8(kv)
    for _ in range(2):
        sparse_mla_fwd(q, kv, idx, 576**-0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", choices=["mla-bf16", "mla-fp8", "mla-64h", "indexer-logits", "indexer-prefill", "topk"])
    ap.add_argument("--prev", type=Path, help="indexer-logits: folder holding an older copy of glm_dsa_kernels")
    ap.add_argument("--tokens", type=int, help="sparse MLA: queries")
    ap.add_argument("--heads", type=int, default=16, help="mla-bf16 / mla-fp8: heads")
    args = ap.parse_args()
    if args.problem == "mla-bf16":
        _mla(args.tokens or 64, args.heads, False)
    elif args.problem == "mla-fp8":
        _mla(args.tokens or 256, args.heads, True)
    elif args.problem == "mla-64h":
        _mla(args.tokens or 256, 64, False)
    elif args.problem == "indexer-logits":
        from glm_dsa_kernels.indexer import indexer_logits

        runs = [indexer_logits]
        if args.prev:
            (prev,) = load_previous(args.prev, "indexer")
            runs.append(prev.indexer_logits)
        q, w, k_cache, pt, qr, kl = decode_indexer_inputs(64, 65536)
        lg = torch.empty(64, 65536, device="cuda")
        for _ in range(2):
            for fn in runs:
                fn(q, w, k_cache, pt, qr, kl, lg)
    elif args.problem == "indexer-prefill":
        from glm_dsa_kernels.indexer import indexer_logits

        C, ctx = 2048, 32768
        q, w, k_cache, pt, qr, kl = prefill_indexer_inputs(C, ctx)
        lg = torch.empty(C, ctx, device="cuda")
        for _ in range(2):
            indexer_logits(q, w, k_cache, pt, qr, kl, lg)  # one request's 2048 queries: the query-blocked kernel
    else:
        from glm_dsa_kernels.indexer import indexer_logits
        from glm_dsa_kernels.topk_select import topk_positions

        q, w, k_cache, pt, qr, kl = decode_indexer_inputs(64, 65536)
        lg = indexer_logits(q, w, k_cache, pt, qr, kl, torch.empty(64, 65536, device="cuda"))
        for _ in range(2):
            topk_positions(lg, kl, 2048)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
