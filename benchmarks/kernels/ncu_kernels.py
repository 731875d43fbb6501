"""Launch one benchmark problem's kernel a few times for Nsight Compute (ncu) to profile.

  pip install -e .   # glm_dsa_kernels, from kernels/glm_dsa_kernels/
  ncu --clock-control none -k regex:_indexer_logits_kernel --launch-skip 2 --launch-count 2 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section LaunchStats --section ComputeWorkloadAnalysis \
      python3 benchmarks/kernels/ncu_kernels.py indexer-logits --prev DIR   # ncu_indexer_logits.txt
  ncu --clock-control none -k regex:_sparse_mla_fwd_kernel --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
      python3 benchmarks/kernels/ncu_kernels.py mla-fp8                     # ncu_sparse_mla_fp8_*.txt

indexer-logits: the decode indexer's logits kernel at batch 64 x 64K FP8 keys, alternating with the
previous kernels' (--prev DIR: an older copy of the package folder, see sweep.py), so the two
profiled launches are this version's, then the previous one's. ncu_indexer_logits.txt: this
kernel at 1024 keys per program against 6b54424's. mla-fp8: sparse MLA decode, FP8 KV, batch 256,
16 heads, default launch shape; ncu_sparse_mla_fp8_fp16dequant.txt profiled it with
experiments/fp8_mla_fp16_dequant.patch applied (the dropped fp16 dequantization). mla-64h: sparse
MLA decode, BF16 KV, batch --tokens (256), 64 heads, default launch shape (the SM90 warp-specialized
kernel on Hopper: -k regex:sparse_mla_fwd_sm90_kernel; at batch 1 add the split merge,
-k regex:"sparse_mla_fwd_sm90_kernel|_merge_splits_kernel").
"""

import argparse
from pathlib import Path

import torch

# Run as a script, this folder is on sys.path already.
from bench_kernels import decode_indexer_inputs, load_previous, mla_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("problem", choices=["indexer-logits", "mla-fp8", "mla-64h"])
    ap.add_argument("--prev", type=Path, help="folder holding an older copy of glm_dsa_kernels")
    ap.add_argument("--tokens", type=int, default=256, help="mla-64h: decode batch")
    args = ap.parse_args()
    if args.problem == "indexer-logits":
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
    elif args.problem == "mla-64h":
        from glm_dsa_kernels.sparse_mla import sparse_mla_fwd

        kv = torch.randn(1 << 20, 576, device="cuda", dtype=torch.bfloat16)
        q, idx = mla_inputs(kv, args.tokens, 64, 2048, 7)
        for _ in range(2):
            sparse_mla_fwd(q, kv, idx, 576**-0.5)
    else:
        from glm_dsa_kernels.sparse_mla import quantize_kv_fp8, sparse_mla_fwd

        kv = torch.randn(1 << 20, 576, device="cuda", dtype=torch.bfloat16)
        kv_fp8 = quantize_kv_fp8(kv)
        q, idx = mla_inputs(kv, 256, 16, 2048, 7)
        for _ in range(2):
            sparse_mla_fwd(q, kv_fp8, idx, 576**-0.5)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
