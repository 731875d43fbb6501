#!/usr/bin/env bash
# Issues 29, 30 and 31's GPU benchmarks on the H200 with real SGLang 0.5.23 (set up as scripts/run_gpu_suite.sh says).
# The device tool brings back 8 files at most, so each run packs its whole output into $OUT/NAME.tgz.
#   bash scripts/gpu_bench.sh shapes   # bench_mtp: plain vs EAGLE 1/2, 2/3, 3/4, 5/6 and 3/4 without
#                                      # overlap, batch 1/8/32, glm5-geometry-carry (needs .gpu/models;
#                                      # SHAPES_CONFIGS="eagle_3_4 ..." serves only those beside plain)
#   bash scripts/gpu_bench.sh rounds   # profile_decode: GLM-5.2-shaped round by phase (batch 1/32),
#                                      # the plain step, and the round with index share off
#   bash scripts/gpu_bench.sh overlap  # profile_decode: glm5-geometry-carry's EAGLE 3/4 round at batch 1/8 with
#                                      # SGLang's overlap scheduler on and off, then on with Python stacks
#                                      # (needs .gpu/models)
#   bash scripts/gpu_bench.sh peer     # issue 30: SGLang's own GLM-DSA path (FlashMLA, no plugin) against the
#                                      # plugin on the GLM-5.2-shaped model, BF16 and FP8 KV, decode b1/b32 and a
#                                      # 32K prefill; needs .gpu/peer/sgl_flash_mla-1.0.0-*.whl (`pip download
#                                      # --no-deps sgl-flash-mla==1.0.0`, 9.9 MB; the device has no registry);
#                                      # with .gpu/deepgemm/sgl_deep_gemm-0.2.1-*.whl (5.4 MB; `pip download --no-deps
#                                      # --only-binary=:all: -d .gpu/deepgemm sgl-deep-gemm==0.2.1`) the peer's indexer
#                                      # runs on DeepGEMM, as on a Hopper deployment (else on SGLang's torch
#                                      # fall-back). Both wheels and .gpu's 47 MiB pass the 64 MiB carry only
#                                      # with .gpu/whl/jedi-*.whl (an ipython dependency no server imports) held out.
#                                      # PEER_RUNS="eagle_3_4:decode_b1,decode_b32 all_full:prefill_32k" serves
#                                      # those configs instead, each on both sides (default: indexcache decode
#                                      # b1/b32 + 32K prefill, fp8_kv decode b1/b32); PEER_FLASHMLA=1: the plugin
#                                      # side runs with FlashMLA on (SGLANG_GLM_FLASHMLA=1 and the wheel)
#   bash scripts/gpu_bench.sh ingraph  # before/after in one run, before = .gpu/before_tree (a plugin tree, e.g.
#                                      # `git archive main sglang_glm kernels pyproject.toml README.md`):
#                                      # bench_host_metadata, then bench_gpu on the GLM-5.2-shaped model,
#                                      # plain and EAGLE 3/4 decode at batch 1 and 32, each config on both
#                                      # (INGRAPH_CONFIGS="eagle_3_4" runs only those)
#   bash scripts/gpu_bench.sh prefill  # breakable prefill graphs: plain and EAGLE 3/4 with and without them
#                                      # on glm5-geometry-carry, batch 1/8/32 (speedups against plain with
#                                      # them; needs .gpu/models), then
#                                      # a 4K and 32K prefill on the GLM-5.2-shaped model with and without
#   bash scripts/gpu_bench.sh ingraph_mtp  # the same before/after on glm5-geometry-carry's held-out text:
#                                      # plain, EAGLE 3/4 before and after, batch 1/8 (needs .gpu/models)
#   bash scripts/gpu_bench.sh tokenmap # issue 29: EAGLE 3/4 with and without a 32768-id --speculative-token-map
#                                      # (the draft's LM head cut to a fifth of GLM's vocabulary) against plain
#                                      # decode, GLM-5.2-shaped model, batch 1 and 32 (GLM52_LAYERS=12: a deeper
#                                      # proxy; GLM52_EXPERTS=64: fewer routed experts a layer, so e.g. 40 layers
#                                      # fit, a deep proxy for batch 1 (make_glm52_shaped.py says what it keeps);
#                                      # TOKENMAP_WORKLOADS=decode_b1: batch 1 only; TOKENMAP_CONFIGS: the servers)
#   bash scripts/gpu_bench.sh topk     # before/after of the top-k select, before = .gpu/before_tree as for ingraph:
#                                      # compare_versions on batch 1 and 8 rows of 4K keys in 202752-wide
#                                      # logits (decode graphs' width) and 8 full-width rows (every chunk used),
#                                      # then bench_gpu plain decode at batch 1/8 on the GLM-5.2-shaped model
#   bash scripts/gpu_bench.sh flashmla # issue 30 item 4, FlashMLA behind glm_dsa_triton: bench_kernels' peers section
#                                      # (FlashMLA vs the Triton kernel per shape, checked against float64), then the
#                                      # GLM-5.2-shaped model served with the wheel (@flashmla) and without (Triton):
#                                      # FP8 KV decode b1/b32, then BF16 KV 32K prefill as time allows; needs
#                                      # .gpu/peer/sgl_flash_mla-1.0.0-*.whl (as `peer`); with .gpu/deepgemm's
#                                      # wheel the kernel section also times DeepGEMM's indexer logits
#   bash scripts/gpu_bench.sh indexer  # sweep.py's indexer sweeps (decode, prefill, verify), the e4m3-dot
#                                      # candidates (IndexerConfig.q_terms) beside the fp16-dot shapes
#   bash scripts/gpu_bench.sh gemm     # tune_fp8_gemm.py: SGLang's block-FP8 GEMM tuned for the GLM-5.2-shaped
#                                      # model's linears (GEMM_TP=1, batch GEMM_M=1,16,64), the configs in
#                                      # $WORK/gemm_configs (commit them to sglang_glm/gemm_configs/), then plain
#                                      # decode b1/b32 with them (@gemm) and without, one run
#   bash scripts/gpu_bench.sh moe      # tune_fused_moe.py: SGLang's fused MoE kernel tuned for the GLM-5.2-shaped
#                                      # model's routed experts (MOE_TP=1, batch MOE_M=1,4,8,16,32,64,128), the
#                                      # configs in $WORK/moe_configs (commit them to sglang_glm/moe_configs/), then
#                                      # plain decode b1/b32 and EAGLE 3/4 b1 with them (@moe) and without, one run
#                                      # (gemm and moe: *_TUNE=0 serves the shipped configs, SERVE=0 only tunes)
#   bash scripts/gpu_bench.sh cold     # cold_start: a fresh server's first 32K prompt vs the next ten,
#                                      # BF16 and FP8 KV, start-up by phase, a second start (issue 31)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/glm_gpu_out}
WORK=/tmp/gpu_bench_$1
rm -rf "$WORK"  # a machine kept warm between calls still holds the last call's run
mkdir -p "$OUT" "$WORK"
# whatever the run made comes back, also when a step fails or is cut short
# (and SGLang's JIT-compiled CUDA modules, for .gpu/carry/jitcache.tar.gz: ~2 minutes of nvcc otherwise)
# (and DeepGEMM's, where a run used it: $OUT/dgcache.tar.gz, carried as .gpu/carry/dgcache.tar.gz)
trap 'tar czf "$OUT/$1.tgz" -C "$WORK" --exclude="*.json.gz" --exclude=heldout_sharegpt.json .
      tar czf "$OUT/jitcache.tar.gz" -C /tmp/sgljit . 2>/dev/null
      [ -d /tmp/dgcache ] && tar czf "$OUT/dgcache.tar.gz" -C /tmp/dgcache .' EXIT
. .gpu/device_env.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/site_plugin . || exit 1
# SIGINT lets a benchmark cut short stop its servers (their context managers run) before the next one starts
limit() { timeout -s INT -k 30 "$@"; }
export PYTHONPATH=/tmp/site_plugin:$PYTHONPATH TORCHDYNAMO_DISABLE=1
# DeepGEMM compiles each kernel with nvcc at first use; SGLang points it at SGLANG_DG_CACHE_DIR
export SGLANG_DG_CACHE_DIR=/tmp/dgcache DG_JIT_CACHE_DIR=/tmp/dgcache
[ -f .gpu/carry/dgcache.tar.gz ] && mkdir -p /tmp/dgcache && tar xzf .gpu/carry/dgcache.tar.gz -C /tmp/dgcache
DEEPGEMM_WHL=$(ls .gpu/deepgemm/sgl_deep_gemm-*.whl 2>/dev/null | head -1)
cd benchmarks/serving/gpu
case "$1" in
  shapes)
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    limit "${BENCH_TIMEOUT:-540}" python3 bench_mtp.py --model /tmp/models/glm5-geometry-carry --out "$WORK" \
      --repeats "${REPEATS:-2}" ${SHAPES_CONFIGS:+--configs $SHAPES_CONFIGS} 2>&1 | tee "$WORK/bench_mtp.log" ;;
  rounds)
    python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
    P="python3 profile_decode.py --model /tmp/glm52 --out $WORK --context 4096 --steps 8 --no-stack"
    { limit 200 $P --config eagle_3_4 --batch 1 32
      limit 170 $P --config indexcache --batch 1 32
      limit 150 $P --config mtp_share_off --batch 1; } 2>&1 | tee "$WORK/profile.log" ;;
  overlap)
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    P="python3 profile_decode.py --model /tmp/models/glm5-geometry-carry --out $WORK --config eagle_3_4 --text --context 512"
    # the archive is refreshed after each profile, so a run cut short still brings back what it made
    pack() { tar czf "$OUT/overlap.tgz" -C "$WORK" --exclude='*.json.gz' .; }
    { limit 140 $P --batch 1 8 --steps 24 --no-stack --label eagle_3_4_overlap; pack
      limit 140 $P --batch 1 8 --steps 24 --no-stack --label eagle_3_4_no_overlap --server-args=--disable-overlap-schedule; pack
      limit 110 $P --batch 1 --steps 8 --label eagle_3_4_overlap_stack; } 2>&1 | tee "$WORK/profile.log" ;;
  peer)
    python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site_peer ../../../.gpu/peer/sgl_flash_mla-*.whl \
      ${DEEPGEMM_WHL:+../../../$DEEPGEMM_WHL} || exit 1
    # a deep_gemm that fails to import is worse than none: SGLang then drops its GLM-DSA model classes
    if [ -d /tmp/site_peer/deep_gemm ] && ! PYTHONPATH=/tmp/site_peer:$PYTHONPATH python3 -c "import deep_gemm" \
        > "$WORK/deep_gemm_import.log" 2>&1; then
      tail -5 "$WORK/deep_gemm_import.log"; echo "deep_gemm does not import: the peer's indexer runs on torch"
      rm -rf /tmp/site_peer/deep_gemm
    fi
    python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
    # PEER_FLASHMLA=1: the plugin side is the plugin with FlashMLA on its path and switched on (as
    # `pip install sglang-glm[sglang]` brings the wheel), served as a copy: CONFIG@flashmla
    side=""
    if [ "${PEER_FLASHMLA:-0}" = 1 ]; then
      export SGLANG_GLM_FLASHMLA=1
      python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_flashmla \
        ../../.. ../../../.gpu/peer/sgl_flash_mla-*.whl || exit 1
      side="@flashmla"
    fi
    limit "${BENCH_TIMEOUT:-540}" python3 bench_gpu.py --model /tmp/glm52 --out "$WORK" \
      --deadline-s $((${BENCH_TIMEOUT:-540} - 10)) --peer-site /tmp/site_peer ${side:+--plugin flashmla=/tmp/plugin_flashmla} \
      $(for r in ${PEER_RUNS:-indexcache:decode_b1,decode_b32,prefill_32k fp8_kv:decode_b1,decode_b32}; do
          echo --run "${r%%:*}@sglang:${r#*:}" --run "${r%%:*}$side:${r#*:}"; done) 2>&1 | tee "$WORK/peer.log"
    python3 peer_report.py "$WORK/results.jsonl" --out "$WORK" 2>&1 | tee -a "$WORK/peer.log" ;;
  ingraph)
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_before \
      ../../../.gpu/before_tree || exit 1
    { python3 ../../kernels/bench_host_metadata.py --out "$WORK/host_metadata_after.json"
      PYTHONPATH=/tmp/plugin_before:$PYTHONPATH python3 ../../kernels/bench_host_metadata.py \
        --out "$WORK/host_metadata_before.json"
      python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
      limit "${BENCH_TIMEOUT:-480}" python3 bench_gpu.py --model /tmp/glm52 --out "$WORK" \
        --deadline-s $((${BENCH_TIMEOUT:-480} - 10)) --plugin before=/tmp/plugin_before \
        $(for c in ${INGRAPH_CONFIGS:-indexcache eagle_3_4}; do echo --run $c@before:decode_b1,decode_b32 \
          --run $c:decode_b1,decode_b32; done); } 2>&1 | tee "$WORK/ingraph.log" ;;
  topk)
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_before \
      ../../../.gpu/before_tree || exit 1
    { python3 ../../kernels/compare_versions.py --pkg before=/tmp/plugin_before/glm_dsa_kernels \
        --pkg after=../../../kernels/glm_dsa_kernels --problems topk:1:4096:202752,topk:8:4096:202752,topk:8:202752:202752 \
        --out "$WORK/compare_topk.json"
      python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
      limit "${BENCH_TIMEOUT:-420}" python3 bench_gpu.py --model /tmp/glm52 --out "$WORK" \
        --deadline-s $((${BENCH_TIMEOUT:-420} - 10)) --plugin before=/tmp/plugin_before \
        --run indexcache@before:decode_b1,decode_b8 --run indexcache:decode_b1,decode_b8; } 2>&1 | tee "$WORK/topk.log" ;;
  prefill)
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    { limit 320 python3 bench_mtp.py --model /tmp/models/glm5-geometry-carry --out "$WORK" --repeats 3 \
        --plain prefill_graphs --headline eagle_3_4_prefill_graphs --configs eagle_3_4_prefill_graphs indexcache eagle_3_4
      python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
      limit 200 python3 bench_gpu.py --model /tmp/glm52 --out "$WORK" --deadline-s 190 \
        --run indexcache:prefill_4k,prefill_32k --run prefill_graphs:prefill_4k,prefill_32k; } 2>&1 \
      | tee "$WORK/prefill.log" ;;
  ingraph_mtp)
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_before \
      ../../../.gpu/before_tree || exit 1
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    limit "${BENCH_TIMEOUT:-540}" python3 bench_gpu.py --model /tmp/models/glm5-geometry-carry --out "$WORK" \
      --deadline-s 530 --plugin before=/tmp/plugin_before --run indexcache:text_b1,text_b8 \
      --run eagle_3_4@before:text_b1,text_b8,text_b1,text_b8 --run eagle_3_4:text_b1,text_b8,text_b1,text_b8 \
      2>&1 | tee "$WORK/ingraph_mtp.log" ;;
  tokenmap)
    python3 make_glm52_shaped.py /tmp/glm52 --layers "${GLM52_LAYERS:-8}" ${GLM52_EXPERTS:+--experts $GLM52_EXPERTS} \
      | tee "$WORK/tokenmap.log"
    W=${TOKENMAP_WORKLOADS:-decode_b1,decode_b32}
    limit 500 python3 bench_gpu.py --model /tmp/glm52 --out "$WORK" --deadline-s 490 \
      $(for c in ${TOKENMAP_CONFIGS:-indexcache eagle_3_4 eagle_3_4_token_map}; do echo --run "$c:$W"; done) \
      2>&1 | tee -a "$WORK/tokenmap.log" ;;
  flashmla)
    export SGLANG_GLM_FLASHMLA=1  # the opt-in; the Triton side's servers have no wheel to take it up
    # the plugin and the wheel in one directory: --plugin puts it first on a server's PYTHONPATH
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_flashmla \
      ../../.. ../../../.gpu/peer/sgl_flash_mla-*.whl || exit 1
    # DeepGEMM only in the kernel benchmark's path: importable in a server, it would turn on SGLang's
    # DeepGEMM FP8 GEMMs (and their minutes-long precompile) for the plugin's linears too
    [ -n "$DEEPGEMM_WHL" ] && python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site_dg \
      "../../../$DEEPGEMM_WHL"
    { PYTHONPATH=/tmp/plugin_flashmla:/tmp/site_dg:$PYTHONPATH limit 210 python3 ../../kernels/bench_kernels.py \
        --out-dir "$WORK/kernels" --skip check,decode,indexer,prefill-indexer,indexcache,sglang-prefill
      python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
      limit "${BENCH_TIMEOUT:-400}" python3 bench_gpu.py --model /tmp/glm52 --out "$WORK" \
        --deadline-s $((${BENCH_TIMEOUT:-400} - 10)) --plugin flashmla=/tmp/plugin_flashmla \
        --run fp8_kv@flashmla:decode_b1,decode_b32 --run fp8_kv:decode_b1,decode_b32 \
        --run indexcache@flashmla:prefill_32k --run indexcache:prefill_32k
      grep -h "sparse MLA on" "$WORK"/server_*.log; } 2>&1 | tee "$WORK/flashmla.log" ;;
  gemm|moe)
    # tune SGLang's block-FP8 GEMM (gemm) or its fused MoE kernel (moe) for the GLM-5.2-shaped model, then
    # serve one copy of the tree with the configs (@gemm / @moe) and one with none (@nogemm / @nomoe)
    kind=$1 dir=$1_configs
    if [ "$kind" = gemm ]; then
      tune_on=${GEMM_TUNE:-1} results=fp8_gemm_tuning.json runs="indexcache:decode_b1,decode_b32"
      tuner="../../kernels/tune_fp8_gemm.py --tp ${GEMM_TP:-1} --m ${GEMM_M:-1,16,64}"
    else
      tune_on=${MOE_TUNE:-1} results=fused_moe_tuning.json runs="indexcache:decode_b1,decode_b32 eagle_3_4:decode_b1"
      tuner="../../kernels/tune_fused_moe.py --tp ${MOE_TP:-1} --m ${MOE_M:-1,4,8,16,32,64,128}"
    fi
    python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
    mkdir -p "$WORK/$dir" && cp ../../../sglang_glm/$dir/*.json "$WORK/$dir/" 2>/dev/null
    # GEMM_TUNE=0 / MOE_TUNE=0: serve the tree's shipped configs without tuning; SERVE=0: tune only
    { [ "$tune_on" = 1 ] && limit "${TUNE_TIMEOUT:-260}" python3 $tuner --config /tmp/glm52/config.json \
        --out-configs "$WORK/$dir" --results "$WORK/$results" --deadline-s $((${TUNE_TIMEOUT:-260} - 40))
      if [ "${SERVE:-1}" = 1 ]; then
        for side in $kind no$kind; do
          python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_$side ../../..
          mkdir -p /tmp/plugin_$side/sglang_glm/$dir && rm -f /tmp/plugin_$side/sglang_glm/$dir/*.json
        done
        cp "$WORK/$dir"/*.json /tmp/plugin_$kind/sglang_glm/$dir/
        limit "${BENCH_TIMEOUT:-260}" python3 bench_gpu.py --model /tmp/glm52 --out "$WORK" \
          --deadline-s $((${BENCH_TIMEOUT:-260} - 10)) --plugin $kind=/tmp/plugin_$kind --plugin no$kind=/tmp/plugin_no$kind \
          $(for r in $runs; do echo --run "${r%%:*}@$kind:${r#*:}" --run "${r%%:*}@no$kind:${r#*:}"; done)
        grep -h "block-FP8 GEMM\|fused MoE" "$WORK"/server_*.log | sort | uniq -c
      fi; } 2>&1 | tee "$WORK/$kind.log" ;;
  indexer)
    limit "${BENCH_TIMEOUT:-540}" python3 ../../kernels/sweep.py --out "$WORK/sweep_indexer.json" \
      --only indexer,prefill-indexer,verify-indexer 2>&1 | tee "$WORK/sweep_indexer.log" ;;
  cold)
    python3 make_glm52_shaped.py /tmp/glm52 > /dev/null
    limit "${BENCH_TIMEOUT:-540}" python3 cold_start.py --model /tmp/glm52 --out "$WORK" --restart 2>&1 \
      | tee "$WORK/cold_start.log" ;;
  *) echo "usage: $0 shapes|rounds|overlap|peer|ingraph|topk|prefill|ingraph_mtp|tokenmap|flashmla|indexer|gemm|moe|cold" >&2; exit 2 ;;
esac
exit $?
