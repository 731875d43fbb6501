#!/usr/bin/env bash
# The GPU suite (tests/gpu) on a CUDA machine, with real SGLang 0.5.23 set up by the shared recipe.
# Needs .gpu/ next to this repo's root, built on a CPU machine with registry access by
#   bash scripts/prepare_device_carry.sh        (git-ignored; carried to the GPU machine)
# usage: bash scripts/run_gpu_suite.sh [pytest args]. Writes gpu_suite.log, deep_gemm_probe.log (with
# .gpu/deepgemm), results.tar.gz (server logs, records.jsonl, failures.log) and jitcache.tar.gz (SGLang's compiled
# kernels, for .gpu/carry/) to $OUT. KERNEL_TESTS="EXPR" then also runs the kernels' GPU cases that match
# it (pytest -m gpu tests/kernels -k "EXPR", into kernel_tests.log; "gpu" runs them all).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/glm_gpu_out}
mkdir -p "$OUT"
[ -f .gpu/device_env.sh ] || { echo "no .gpu/device_env.sh: run the device call with carry [\".gpu\"]" >&2; exit 2; }
. .gpu/device_env.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/site_plugin . || exit 1
export PYTHONPATH=/tmp/site_plugin:$PYTHONPATH TORCHDYNAMO_DISABLE=1 GLM_GPU_RESULTS=/tmp/glm_gpu_results
# SGLang's own GLM-DSA path (tests/gpu/test_peer_gpu.py) needs FlashMLA: .gpu/peer's sgl-flash-mla wheel
for w in .gpu/peer/sgl_flash_mla-*.whl; do
  [ -f "$w" ] && python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site_peer "$w" && export GLM_PEER_SITE=/tmp/site_peer
  # with .gpu/deepgemm's wheel, SGLang's own path runs its indexer on DeepGEMM, from a site of its own: in a
  # plugin server's path deep_gemm would switch SGLang's FP8 linears to DeepGEMM too
  for d in .gpu/deepgemm/sgl_deep_gemm-*.whl; do
    [ -f "$d" ] && python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site_peer_dg "$w" "$d" \
      && PYTHONPATH=/tmp/site_peer_dg:$PYTHONPATH python3 scripts/deep_gemm_runs.py > "$OUT/deep_gemm_probe.log" 2>&1 \
      && export GLM_PEER_DEEPGEMM_SITE=/tmp/site_peer_dg
  done
done
# trained models carried as .gpu/models/*.tar.xz (`scripts/device_tree.sh out assets/glm5-geometry-carry`):
# tests/gpu/test_mtp_trained_gpu.py serves /tmp/models/glm5-geometry-carry, and skips without it
mkdir -p /tmp/models && for m in .gpu/models/*.tar.xz; do [ -f "$m" ] && tar xJf "$m" -C /tmp/models; done
# Multi-GPU hosts are shared: NVLink multicast stays off (the device notes say why).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf "$GLM_GPU_RESULTS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu_suite.log"
# SGLang's breakable prefill CUDA graphs need cuda-python (benchmarks/serving/gpu/prefill_graphs.md)
python3 -c "from cuda.bindings import runtime" 2>/dev/null && echo "cuda-python: present" | tee -a "$OUT/gpu_suite.log" \
  || echo "cuda-python: absent" | tee -a "$OUT/gpu_suite.log"
# the ids this run selects, so a run cut by its timeout can name the tests that never started too
python3 -m pytest tests/gpu -p no:cacheprovider --collect-only -q "$@" 2>/dev/null | grep "::" > /tmp/gpu_suite_ids.txt
timeout "${GPU_SUITE_TIMEOUT:-530}" python3 -m pytest tests/gpu -p no:cacheprovider -n "${GPU_WORKERS:-7}" -rA -v "$@" \
  2>&1 | tee -a "$OUT/gpu_suite.log"
rc=${PIPESTATUS[0]}
# cut by the timeout: every selected test without a result, started or not (xdist prints a node id as it starts)
[ "$rc" = 124 ] && python3 scripts/gpu_suite_unfinished.py "$OUT/gpu_suite.log" /tmp/gpu_suite_ids.txt | tee -a "$OUT/gpu_suite.log"
if [ -n "${KERNEL_TESTS:-}" ]; then
  timeout "${KERNEL_TESTS_TIMEOUT:-240}" python3 -m pytest tests/kernels -m gpu -k "$KERNEL_TESTS" -p no:cacheprovider \
    -q -rA 2>&1 | tee "$OUT/kernel_tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
tar czf "$OUT/results.tar.gz" -C "$GLM_GPU_RESULTS" . 2>/dev/null
tar czf "$OUT/jitcache.tar.gz" -C /tmp/sgljit . 2>/dev/null
exit "$rc"
