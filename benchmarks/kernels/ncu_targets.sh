#!/usr/bin/env bash
# Nsight Compute reports for issue 17's targets, one file per problem in OUT (ncu_kernels.py holds
# the problems; bench_kernels.py scores the same shapes). Each profiles the second call's kernels.
#   bash benchmarks/kernels/ncu_targets.sh OUT
set -uo pipefail
OUT=$(realpath "${1:?usage: ncu_targets.sh OUT}")
mkdir -p "$OUT"
cd "$(dirname "$0")"
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section LaunchStats --section MemoryWorkloadAnalysis)

profile() {  # name, kernel regex, launches per call, ncu_kernels.py arguments...
  local name=$1 regex=$2 per_call=$3
  shift 3
  timeout 150 ncu --clock-control none -k "regex:$regex" --launch-skip "$per_call" --launch-count "$per_call" \
    "${SECTIONS[@]}" python3 ncu_kernels.py "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "ncu_$name.txt: rc $? ($(grep -c 'Duration' "$OUT/ncu_$name.txt") kernels)"
}

profile mla_bf16_b64_h16 "^_sparse_mla_fwd_kernel" 1 mla-bf16 --tokens 64 --heads 16
profile mla_fp8_b256_h16 "^_sparse_mla_fwd_kernel" 1 mla-fp8 --tokens 256 --heads 16
profile mla_fp8_b256_h64 "sparse_mla_fwd_sm90_kernel" 1 mla-fp8 --tokens 256 --heads 64
profile mla_prefill_4096 "sparse_mla_fwd_sm90_kernel" 1 mla-64h --tokens 4096
profile mla_64h_b1 "sparse_mla_fwd_sm90_kernel|_merge_splits_kernel" 2 mla-64h --tokens 1
profile indexer_logits_b64_64k "_indexer_logits" 1 indexer-logits
profile topk_b64_64k "_sample_bound_kernel|_candidates_kernel|_select_kernel" 3 topk
profile indexer_prefill_32k "_indexer_logits" 1 indexer-prefill
