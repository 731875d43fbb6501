#!/usr/bin/env bash
# Issues 29, 30 and 31's GPU benchmarks on the H200 with real SGLang 0.5.23 (set up as scripts/run_gpu_suite.sh says):
#   bash scripts/gpu_bench.sh MODE     # packs its whole output into $OUT/MODE.tgz (the device returns 8 files at most)
#
# mode         issue  what runs; model: G = GLM-5.2-shaped (make_glm52_shaped.py), C = glm5-geometry-carry (.gpu/models)
# shapes       29     bench_mtp, C: plain vs EAGLE 1/2, 2/3, 3/4, 5/6, 3/4 without overlap, batch 1/8/32
#                     [SHAPES_CONFIGS="eagle_3_4 ..." serves only those beside plain; REPEATS]
# rounds       29     profile_decode, G: the EAGLE 3/4 round by phase at batch 1/32, the plain step, share off
# overlap      29     profile_decode, C: the EAGLE 3/4 round at batch 1/8, overlap on and off, then with stacks
# prefill      29     bench_mtp, C: plain and EAGLE 3/4 with and without breakable prefill graphs, batch 1/8/32;
#                     then a 4K and 32K prefill, G, with and without them
# tokenmap     29     bench_gpu, G: EAGLE 3/4 with and without a 32768-id --speculative-token-map against plain
#                     [GLM52_LAYERS, GLM52_EXPERTS (e.g. 40 and 64: a deep proxy), TOKENMAP_WORKLOADS, TOKENMAP_CONFIGS:
#                     e.g. "indexcache eagle_3_4 eagle_3_4_fp8_head eagle_3_4_token_map_fp8_head", the FP8 draft head
#                     alone and with the map (an 80 GB card: GLM52_LAYERS=6)]
# ingraph      29,31  before/after: bench_host_metadata, then bench_gpu, G, plain and EAGLE 3/4 decode b1/b32
#                     [INGRAPH_CONFIGS, INGRAPH_WORKLOADS (default decode_b1,decode_b32); on an H100 a server
#                     starts in ~96 s, so REPEATS=3 fits one config's pair in a 10-minute call]
# ingraph_mtp  29     the same before/after, C, held-out text, batch 1/8
# peer         30     bench_gpu + peer_report, G: SGLang's own GLM-DSA path (no plugin) against the plugin, one run
#                     [PEER_RUNS="eagle_3_4:decode_b1,decode_b32 all_full:prefill_32k" (default: indexcache decode
#                     b1/b32 + 32K prefill, fp8_kv decode b1/b32); the plugin side as `pip install
#                     sglang-glm[sglang]` serves it, FlashMLA on (PEER_FLASHMLA=1, the default); PEER_FLASHMLA=0:
#                     the plugin on Triton alone; PEER_FLASHMLA=both: each of the two against SGLang's path]
#                     Issue 30's whole table in five calls (two servers each; peer_report.py merges their
#                     results.jsonl): PEER_RUNS=
#                       "indexcache:decode_b1,decode_b8,decode_b32,decode_b64,prefill_4k,prefill_32k"
#                       "indexcache:decode_32k_b1,decode_32k_b8,decode_32k_b32,decode_32k_b64,prefill_128k"
#                       (an 80 GB card pools ~320K tokens: at 32K context batch 8 at most)
#                       "fp8_kv:decode_b1,decode_b32,decode_32k_b1,prefill_32k"
#                       "eagle_3_4:decode_b1,decode_b8,decode_b32"   (an 80 GB card: GLM52_LAYERS=6, session 31)
#                       "all_full:prefill_32k,prefill_128k,decode_32k_b1"
# peer_profile 30     profile_decode --prefill, G: a 32K prefill by kernel family on SGLang's own path, the plugin,
#                     and the plugin with FlashMLA on [PEER_PROFILE_CONTEXT, PEER_PROFILE_SIDES="plugin ...",
#                     PEER_PROFILE_STACK=1: Python stacks on, each kernel's launching line named;
#                     PEER_PROFILE_PHASE=decode: 8 decode steps at PEER_PROFILE_BATCH (1) x 4K context instead;
#                     PEER_PROFILE_CONFIG: bench_gpu's config, e.g. fp8_kv]
# glue         30,31  bench_mla_glue: RoPE + the absorbed query, and the output projection, around sparse MLA,
#                     each way (the plugin's, its earlier ones, SGLang's in-place rotary + concat kernel) on the
#                     same inputs; then profile_decode, G: plain decode b1 at 4K, eager with Python stacks (a
#                     graph replay names no line), so each of a step's ~700 launches is named by the line that made it
# flashmla     30     bench_kernels' peers and deepgemm sections (FlashMLA / DeepGEMM vs the plugin's kernels per
#                     shape, each checked against float64) [FLASHMLA_KERNELS=0 skips them], then G served with
#                     FlashMLA (@flashmla) and without [FLASHMLA_RUNS="indexcache:prefill_32k,decode_b32": at
#                     G's 64 heads the table gives FlashMLA BF16 prefill chunks (TTFT) and FP8 batches of
#                     65-512 rows, past the benchmark's 64-request decode graphs; decode b32 stays on Triton;
#                     FLASHMLA_SERVE=0 runs the kernel tables alone]
# decode_shapes 30,31 bench_small_batch --decode-shapes: the indexer's decode kernel by launch shape against
#                     .gpu/before_tree's default and DeepGEMM's, batch 1-64 at 4K and 32K in the decode graphs' width;
#                     an MTP verify's 4 queries a request per query (the default) and in strided query blocks
# indexer      30     sweep.py's indexer sweeps (decode, prefill, verify) with the e4m3-dot candidates (q_terms)
# topk         31,30  before/after of the top-k select: compare_versions on 1, 8 and 32 rows and a 16K-query prefill
#                     chunk at 32K and 128K, each beside torch.topk (SGLang's own path's select), both copies also
#                     with short rows in registers (small_row 4096, off by default); then G plain decode b1/b8
#                     [TOPK_SERVE=0: the kernels alone]
# gemm         31     tune_fp8_gemm.py on G's linears [GEMM_TP, GEMM_M=1,16,64], then G plain decode b1/b32 with
#                     the configs (@gemm) and without (@nogemm)
# moe          29,31  tune_fused_moe.py on G's routed experts [MOE_TP, MOE_M=1,4,32,128,8,16,64], then G plain
#                     decode and EAGLE 3/4 b1/b32 with the configs (@moe) and without (@nomoe) (4 servers:
#                     in one 10-minute call only with the default timeouts; or SERVE=0, then MOE_TUNE=0)
#                     [gemm and moe: GEMM_TUNE=0 / MOE_TUNE=0 serves the shipped configs, SERVE=0 only tunes;
#                     the tuned files come back in $WORK/gemm_configs or moe_configs: commit them to sglang_glm/]
# cold         31     cold_start, G: a fresh server's first 32K prompt vs the next ten, BF16 and FP8 KV, start-up
#                     by phase, a second start on a warm Triton cache
# BENCH_TIMEOUT: seconds for the serving part (all but rounds, overlap, prefill, tokenmap); gemm, moe: TUNE_TIMEOUT too.
# REPEATS: runs of every workload on its server, medians recorded (bench_gpu's --repeats; default 1, shapes 2):
#   before/after modes want 3 where the timeout allows (session 33's single runs could not tell a 2% gain from noise).
#
# What the modes need beside the tree and .gpu/ (`bash scripts/prepare_device_carry.sh` builds .gpu/, the
# models aside, which `scripts/device_tree.sh out MODEL_DIR` packs; each piece by hand:)
# - C: .gpu/models/*.tar.xz (the carry model).
# - before/after modes (ingraph, ingraph_mtp, topk): .gpu/before_tree, a plugin tree, e.g.
#   `mkdir -p .gpu/before_tree && git archive REV sglang_glm kernels pyproject.toml README.md | tar x -C .gpu/before_tree`.
#   topk: HEAD's tree with only the select before the change timed, so the pair differs in that change alone
#   (session 36: 278d4b6^, both small_row paths in one kernel, against 278d4b6's launch of its own):
#   `git archive HEAD ... | tar x -C .gpu/before_tree && git show 278d4b6^:kernels/glm_dsa_kernels/topk_select.py \
#   > .gpu/before_tree/kernels/glm_dsa_kernels/topk_select.py`.
# - peer, flashmla: .gpu/peer/sgl_flash_mla-1.0.0-*.whl (9.9 MB; `pip download --no-deps sgl-flash-mla==1.0.0`,
#   the device has no registry); optionally .gpu/deepgemm/sgl_deep_gemm-*.whl for SGLang's DeepGEMM
#   indexer (else its torch fall-back): `bash scripts/build_deep_gemm.sh` builds one for the device's torch (4.3 MiB). Both wheels and .gpu
#   fit the 64 MiB carry (53.4 MiB) once `scripts/device_tree.sh out` has xz-compressed .gpu/carry.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/glm_gpu_out}
WORK=/tmp/gpu_bench_$1
rm -rf "$WORK"  # a machine kept warm between calls still holds the last call's run
mkdir -p "$OUT" "$WORK"
# whatever the run made comes back, also when a step fails or is cut short
# (and SGLang's JIT-compiled CUDA modules, for .gpu/carry/jitcache.tar.gz: ~2 minutes of nvcc otherwise)
# (and DeepGEMM's, where a run used it: $OUT/dgcache.tar.gz, carried as .gpu/carry/dgcache.tar.gz)
# (modes whose steps may be cut short call pack between steps too)
MODE=$1
pack() { tar czf "$OUT/$MODE.tgz" -C "$WORK" --exclude="*.json.gz" --exclude=heldout_sharegpt.json .; }
trap 'pack
      tar czf "$OUT/jitcache.tar.gz" -C /tmp/sgljit . 2>/dev/null
      [ -d /tmp/dgcache ] && tar czf "$OUT/dgcache.tar.gz" -C /tmp/dgcache .' EXIT
# .gpu/ is git-ignored: a device call brings it only when asked (carry: [".gpu"])
[ -f .gpu/device_env.sh ] || { echo "no .gpu/device_env.sh: run the device call with carry [\".gpu\"]" >&2; exit 2; }
. .gpu/device_env.sh
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/site_plugin . || exit 1
# SIGINT lets a benchmark cut short stop its servers (their context managers run) before the next one starts
limit() { timeout -s INT -k 30 "$@"; }
export PYTHONPATH=/tmp/site_plugin:$PYTHONPATH TORCHDYNAMO_DISABLE=1
# every bench_gpu run of every mode, REPEATS runs of each workload
BENCH_GPU=(python3 bench_gpu.py --repeats "${REPEATS:-1}")
# DeepGEMM compiles each kernel with nvcc at first use; SGLang points it at SGLANG_DG_CACHE_DIR
export SGLANG_DG_CACHE_DIR=/tmp/dgcache DG_JIT_CACHE_DIR=/tmp/dgcache
[ -f .gpu/carry/dgcache.tar.gz ] && mkdir -p /tmp/dgcache && tar xzf .gpu/carry/dgcache.tar.gz -C /tmp/dgcache
DEEPGEMM_WHL=$(ls .gpu/deepgemm/sgl_deep_gemm-*.whl 2>/dev/null | head -1)
cd benchmarks/serving/gpu
# SGLang's own GLM-DSA path's packages (peer, peer_profile): FlashMLA, and DeepGEMM where it runs here
peer_site() {
  rm -rf /tmp/site_peer  # a machine kept warm still holds the last call's packages (--target adds, never removes)
  python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site_peer ../../../.gpu/peer/sgl_flash_mla-*.whl \
    ${DEEPGEMM_WHL:+../../../$DEEPGEMM_WHL} || return 1
  # a deep_gemm that fails to import or to run is worse than none (scripts/deep_gemm_runs.py says why)
  if [ -d /tmp/site_peer/deep_gemm ] && ! PYTHONPATH=/tmp/site_peer:$PYTHONPATH python3 ../../../scripts/deep_gemm_runs.py \
      > "$WORK/deep_gemm_probe.log" 2>&1; then
    head -1 "$WORK/deep_gemm_probe.log"; tail -1 "$WORK/deep_gemm_probe.log"
    echo "deep_gemm does not run here: the peer's indexer runs on torch"
    rm -rf /tmp/site_peer/deep_gemm
  fi
}
# the plugin with FlashMLA's wheel in one directory: --plugin puts it first on a server's PYTHONPATH
plugin_flashmla() {
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_flashmla \
    ../../.. ../../../.gpu/peer/sgl_flash_mla-*.whl
}
# G, in every mode: GLM52_LAYERS / GLM52_EXPERTS make it shallower or narrower (an 80 GB card holds the 8-layer
# model beside its MTP draft only at 6 layers)
make_g() { python3 make_glm52_shaped.py /tmp/glm52 --layers "${GLM52_LAYERS:-8}" ${GLM52_EXPERTS:+--experts $GLM52_EXPERTS}; }
case "$1" in
  shapes)
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    limit "${BENCH_TIMEOUT:-540}" python3 bench_mtp.py --model /tmp/models/glm5-geometry-carry --out "$WORK" \
      --repeats "${REPEATS:-2}" ${SHAPES_CONFIGS:+--configs $SHAPES_CONFIGS} 2>&1 | tee "$WORK/bench_mtp.log" ;;
  rounds)
    make_g > /dev/null
    P="python3 profile_decode.py --model /tmp/glm52 --out $WORK --context 4096 --steps 8 --no-stack"
    { limit 200 $P --config eagle_3_4 --batch 1 32
      limit 170 $P --config indexcache --batch 1 32
      limit 150 $P --config mtp_share_off --batch 1; } 2>&1 | tee "$WORK/profile.log" ;;
  overlap)
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    P="python3 profile_decode.py --model /tmp/models/glm5-geometry-carry --out $WORK --config eagle_3_4 --text --context 512"
    # the archive is refreshed after each profile, so a run cut short still brings back what it made
    { limit 140 $P --batch 1 8 --steps 24 --no-stack --label eagle_3_4_overlap; pack
      limit 140 $P --batch 1 8 --steps 24 --no-stack --label eagle_3_4_no_overlap --server-args=--disable-overlap-schedule; pack
      limit 110 $P --batch 1 --steps 8 --label eagle_3_4_overlap_stack; } 2>&1 | tee "$WORK/profile.log" ;;
  peer)
    peer_site || exit 1
    make_g > /dev/null
    # PEER_FLASHMLA=1 (default): the plugin side is the plugin with FlashMLA on its path (as
    # `pip install sglang-glm[sglang]` brings the wheel), served as a copy: CONFIG@flashmla;
    # PEER_FLASHMLA=both: that copy and the plugin on Triton, each against SGLang's path (three servers a row)
    sides=""
    case "${PEER_FLASHMLA:-1}" in
      0) ;;
      1) sides="@flashmla" ;;
      both) sides="@flashmla -" ;;
      *) echo "PEER_FLASHMLA=${PEER_FLASHMLA}: use 0, 1 or both" >&2; exit 2 ;;
    esac
    if [ -n "$sides" ]; then
      export SGLANG_GLM_FLASHMLA=1  # only the copy has the wheel to take it up
      plugin_flashmla || exit 1
    fi
    limit "${BENCH_TIMEOUT:-540}" "${BENCH_GPU[@]}" --model /tmp/glm52 --out "$WORK" \
      --deadline-s $((${BENCH_TIMEOUT:-540} - 10)) --peer-site /tmp/site_peer \
      ${sides:+--plugin flashmla=/tmp/plugin_flashmla} \
      $(for r in ${PEER_RUNS:-indexcache:decode_b1,decode_b32,prefill_32k fp8_kv:decode_b1,decode_b32}; do
          echo --run "${r%%:*}@sglang:${r#*:}"
          for side in ${sides:--}; do echo --run "${r%%:*}${side#-}:${r#*:}"; done; done) 2>&1 | tee "$WORK/peer.log"
    python3 peer_report.py "$WORK/results.jsonl" --out "$WORK" 2>&1 | tee -a "$WORK/peer.log" ;;
  peer_profile)
    # issue 30's gap named per part: one prefill of PEER_PROFILE_CONTEXT tokens (default 32K: two 16K
    # chunks, so two forward steps) profiled by kernel family on SGLang's own path, the plugin, and the
    # plugin with FlashMLA switched on; the archive is refreshed after each
    sides=${PEER_PROFILE_SIDES:-sglang plugin plugin_flashmla}
    for side in $sides; do
      case $side in sglang|plugin|plugin_flashmla) ;;
        *) echo "PEER_PROFILE_SIDES: unknown side $side; use sglang, plugin, plugin_flashmla" >&2; exit 2 ;;
      esac
    done
    peer_site || exit 1
    plugin_flashmla || exit 1
    make_g > /dev/null
    stack=--no-stack; [ "${PEER_PROFILE_STACK:-0}" = 1 ] && stack=
    P="python3 profile_decode.py --model /tmp/glm52 --out $WORK --config ${PEER_PROFILE_CONFIG:-indexcache} $stack"
    case ${PEER_PROFILE_PHASE:-prefill} in
      prefill) ctx=${PEER_PROFILE_CONTEXT:-32768}
               P="$P --prefill --batch 1 --context $ctx --steps $(( (ctx + 16383) / 16384 ))" ;;
      decode)  P="$P --batch ${PEER_PROFILE_BATCH:-1} --context ${PEER_PROFILE_CONTEXT:-4096} --steps 8" ;;
      *) echo "PEER_PROFILE_PHASE: prefill or decode" >&2; exit 2 ;;
    esac
    for side in $sides; do
      case $side in
        sglang) limit 200 $P --peer-site /tmp/site_peer --label sglang ;;
        plugin) limit 150 $P --label plugin ;;
        plugin_flashmla) SGLANG_GLM_FLASHMLA=1 limit 150 $P --plugin /tmp/plugin_flashmla --label plugin_flashmla ;;
      esac
      pack
    done 2>&1 | tee "$WORK/peer_profile.log" ;;
  ingraph)
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_before \
      ../../../.gpu/before_tree || exit 1
    { python3 ../../kernels/bench_host_metadata.py --out "$WORK/host_metadata_after.json"
      PYTHONPATH=/tmp/plugin_before:$PYTHONPATH python3 ../../kernels/bench_host_metadata.py \
        --out "$WORK/host_metadata_before.json"
      make_g > /dev/null
      limit "${BENCH_TIMEOUT:-480}" "${BENCH_GPU[@]}" --model /tmp/glm52 --out "$WORK" \
        --deadline-s $((${BENCH_TIMEOUT:-480} - 10)) --plugin before=/tmp/plugin_before \
        $(W=${INGRAPH_WORKLOADS:-decode_b1,decode_b32}; for c in ${INGRAPH_CONFIGS:-indexcache eagle_3_4}; do
          echo --run $c@before:$W --run $c:$W; done); } 2>&1 | tee "$WORK/ingraph.log" ;;
  topk)
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_before \
      ../../../.gpu/before_tree || exit 1
    { python3 ../../kernels/compare_versions.py --pkg before=/tmp/plugin_before/glm_dsa_kernels \
        --pkg after=../../../kernels/glm_dsa_kernels --pkg before4k=/tmp/plugin_before/glm_dsa_kernels@small_row=4096 \
        --pkg after4k=../../../kernels/glm_dsa_kernels@small_row=4096 --problems topk:1:4096:202752,topk:8:4096:202752,topk:32:4096:202752,topk:1:32768:202752,topk:8:202752:202752,topkp:16384:32768,topkp:16384:131072 \
        --out "$WORK/compare_topk.json"
      # TOPK_SERVE=0: the kernel comparison alone
      [ "${TOPK_SERVE:-1}" = 1 ] && { make_g > /dev/null
        limit "${BENCH_TIMEOUT:-420}" "${BENCH_GPU[@]}" --model /tmp/glm52 --out "$WORK" \
          --deadline-s $((${BENCH_TIMEOUT:-420} - 10)) --plugin before=/tmp/plugin_before \
          --run indexcache@before:decode_b1,decode_b8 --run indexcache:decode_b1,decode_b8; }; } 2>&1 | tee "$WORK/topk.log" ;;
  prefill)
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    { limit 320 python3 bench_mtp.py --model /tmp/models/glm5-geometry-carry --out "$WORK" --repeats 3 \
        --plain prefill_graphs --headline eagle_3_4_prefill_graphs --configs eagle_3_4_prefill_graphs indexcache eagle_3_4
      make_g > /dev/null
      limit 200 "${BENCH_GPU[@]}" --model /tmp/glm52 --out "$WORK" --deadline-s 190 \
        --run indexcache:prefill_4k,prefill_32k --run prefill_graphs:prefill_4k,prefill_32k; } 2>&1 \
      | tee "$WORK/prefill.log" ;;
  ingraph_mtp)
    python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_before \
      ../../../.gpu/before_tree || exit 1
    mkdir -p /tmp/models && for m in ../../../.gpu/models/*.tar.xz; do tar xJf "$m" -C /tmp/models; done
    limit "${BENCH_TIMEOUT:-540}" "${BENCH_GPU[@]}" --model /tmp/models/glm5-geometry-carry --out "$WORK" \
      --deadline-s 530 --plugin before=/tmp/plugin_before --run indexcache:text_b1,text_b8 \
      --run eagle_3_4@before:text_b1,text_b8,text_b1,text_b8 --run eagle_3_4:text_b1,text_b8,text_b1,text_b8 \
      2>&1 | tee "$WORK/ingraph_mtp.log" ;;
  tokenmap)
    make_g | tee "$WORK/tokenmap.log"
    W=${TOKENMAP_WORKLOADS:-decode_b1,decode_b32}
    limit 500 "${BENCH_GPU[@]}" --model /tmp/glm52 --out "$WORK" --deadline-s 490 \
      $(for c in ${TOKENMAP_CONFIGS:-indexcache eagle_3_4 eagle_3_4_token_map}; do echo --run "$c:$W"; done) \
      2>&1 | tee -a "$WORK/tokenmap.log" ;;
  flashmla)
    export SGLANG_GLM_FLASHMLA=1  # said explicitly (a warning if unused); the Triton side's servers have no wheel
    plugin_flashmla || exit 1
    # DeepGEMM only in the kernel benchmark's path: importable in a server, it would turn on SGLang's
    # DeepGEMM FP8 GEMMs (and their minutes-long precompile) for the plugin's linears too
    [ -n "$DEEPGEMM_WHL" ] && python3 -m pip install -q --no-deps --no-index --upgrade --target /tmp/site_dg \
      "../../../$DEEPGEMM_WHL"
    { [ "${FLASHMLA_KERNELS:-1}" = 1 ] && PYTHONPATH=/tmp/plugin_flashmla:/tmp/site_dg:$PYTHONPATH limit 210 \
        python3 ../../kernels/bench_kernels.py --out-dir "$WORK/kernels" \
        --skip check,decode,indexer,prefill-indexer,indexcache,sglang-prefill
      # FLASHMLA_SERVE=0: the kernel tables alone
      [ "${FLASHMLA_SERVE:-1}" = 1 ] && { make_g > /dev/null
        limit "${BENCH_TIMEOUT:-400}" "${BENCH_GPU[@]}" --model /tmp/glm52 --out "$WORK" \
          --deadline-s $((${BENCH_TIMEOUT:-400} - 10)) --plugin flashmla=/tmp/plugin_flashmla \
          $(for r in ${FLASHMLA_RUNS:-indexcache:prefill_32k,decode_b32}; do
              echo --run "${r%%:*}@flashmla:${r#*:}" --run "${r%%:*}:${r#*:}"; done)
        grep -h "sparse MLA on" "$WORK"/server_*.log; }; } 2>&1 | tee "$WORK/flashmla.log" ;;
  gemm|moe)
    # tune SGLang's block-FP8 GEMM (gemm) or its fused MoE kernel (moe) for the GLM-5.2-shaped model, then
    # serve one copy of the tree with the configs (@gemm / @moe) and one with none (@nogemm / @nomoe)
    kind=$1 dir=$1_configs
    if [ "$kind" = gemm ]; then
      tune_on=${GEMM_TUNE:-1} results=fp8_gemm_tuning.json runs="indexcache:decode_b1,decode_b32"
      tuner=(../../kernels/tune_fp8_gemm.py --tp "${GEMM_TP:-1}" --m "${GEMM_M:-1,16,64}")
      # GEMM_ONLY: a comma list of the tuner's shape names; GEMM_DRAFT_HEAD=1: the MTP draft's FP8 LM head
      # too (with GEMM_ONLY="draft head": that shape alone)
      [ -n "${GEMM_ONLY:-}" ] && tuner+=(--only "$GEMM_ONLY")
      [ "${GEMM_DRAFT_HEAD:-0}" = 1 ] && tuner+=(--draft-head)
    else
      # batches in order of use: decode and verify at batch 1, then at 32 (the files grow batch by batch)
      tune_on=${MOE_TUNE:-1} results=fused_moe_tuning.json runs="indexcache:decode_b1,decode_b32 eagle_3_4:decode_b1,decode_b32"
      tuner=(../../kernels/tune_fused_moe.py --tp "${MOE_TP:-1}" --m "${MOE_M:-1,4,32,128,8,16,64}")
    fi
    make_g > /dev/null
    mkdir -p "$WORK/$dir" && cp ../../../sglang_glm/$dir/*.json "$WORK/$dir/" 2>/dev/null
    # GEMM_TUNE=0 / MOE_TUNE=0: serve the tree's shipped configs without tuning; SERVE=0: tune only.
    # The mode exits with the worst status of its steps; with no config files it serves nothing.
    worst=0
    { if [ "$tune_on" = 1 ]; then
        limit "${TUNE_TIMEOUT:-260}" python3 "${tuner[@]}" --config /tmp/glm52/config.json --out-configs "$WORK/$dir" \
          --results "$WORK/$results" --deadline-s $((${TUNE_TIMEOUT:-260} - 40)) || worst=$?
      fi
      if [ "${SERVE:-1}" = 1 ] && ! ls "$WORK/$dir"/*.json > /dev/null 2>&1; then
        echo "no $dir files to serve: the @$kind and @no$kind servers would be the same"
        [ "$worst" = 0 ] && worst=1
      elif [ "${SERVE:-1}" = 1 ]; then
        for side in $kind no$kind; do
          python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/plugin_$side ../../..
          mkdir -p /tmp/plugin_$side/sglang_glm/$dir && rm -f /tmp/plugin_$side/sglang_glm/$dir/*.json
        done
        cp "$WORK/$dir"/*.json /tmp/plugin_$kind/sglang_glm/$dir/
        limit "${BENCH_TIMEOUT:-260}" "${BENCH_GPU[@]}" --model /tmp/glm52 --out "$WORK" \
          --deadline-s $((${BENCH_TIMEOUT:-260} - 10)) --plugin $kind=/tmp/plugin_$kind --plugin no$kind=/tmp/plugin_no$kind \
          $(for r in $runs; do echo --run "${r%%:*}@$kind:${r#*:}" --run "${r%%:*}@no$kind:${r#*:}"; done) || worst=$?
        grep -h "block-FP8 GEMM\|fused MoE" "$WORK"/server_*.log | sort | uniq -c
      fi
      echo "exit $worst" > "$WORK/$kind.status"; } 2>&1 | tee "$WORK/$kind.log"
    exit "$(cut -d' ' -f2 "$WORK/$kind.status")" ;;
  glue)
    { limit "${BENCH_TIMEOUT:-300}" python3 ../../kernels/bench_mla_glue.py --out "$WORK/mla_glue.json"; pack
      make_g > /dev/null
      limit 200 python3 profile_decode.py --model /tmp/glm52 --out "$WORK" --config indexcache --batch 1 \
        --context 4096 --steps 8 --eager --label decode_eager_stack; } 2>&1 | tee "$WORK/glue.log" ;;
  decode_shapes)
    peer_site > /dev/null  # DeepGEMM's paged logits beside the plugin's, where its wheel came
    PYTHONPATH=/tmp/site_peer:$PYTHONPATH limit "${BENCH_TIMEOUT:-300}" python3 ../../kernels/bench_small_batch.py \
      --decode-shapes --before ../../../.gpu/before_tree/kernels/glm_dsa_kernels --out "$WORK/decode_shapes.json" \
      2>&1 | tee "$WORK/decode_shapes.log" ;;
  indexer)
    limit "${BENCH_TIMEOUT:-540}" python3 ../../kernels/sweep.py --out "$WORK/sweep_indexer.json" \
      --only indexer,prefill-indexer,verify-indexer 2>&1 | tee "$WORK/sweep_indexer.log" ;;
  cold)
    make_g > /dev/null
    limit "${BENCH_TIMEOUT:-540}" python3 cold_start.py --model /tmp/glm52 --out "$WORK" --restart 2>&1 \
      | tee "$WORK/cold_start.log" ;;
  *) echo "usage: $0 shapes|rounds|overlap|peer|peer_profile|glue|ingraph|topk|prefill|ingraph_mtp|tokenmap|flashmla|decode_shapes|indexer|gemm|moe|cold" >&2; exit 2 ;;
esac
exit $?
