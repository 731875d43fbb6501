#!/usr/bin/env bash
# Issue 15's H200 pair, in one device call (no SGLang needed: the machine's torch, numpy, safetensors
# and transformers): a target with GLM-5's attention geometry (so glm_dsa_triton serves it) trained
# with its final norms started spread (config_glm5_geometry.json), its jointly trained post-norm MTP
# layer, then both carries' MTP layers trained again over the frozen target from that start.
#   here:   python benchmarks/train/prepare_data.py --tokenizer assets/glm-dsa-mini --out build/carry-data
#   device: BUDGET_S=280 bash benchmarks/train/carry/h200_glm5_pair.sh   (carry build/carry-data; ~9 minutes)
#   here:   python benchmarks/train/export.py RUN/target --tokenizer build/carry-data/tokenizer \
#             --dest assets/glm5-geometry-carry --logs benchmarks/train/carry/target
#           python benchmarks/train/carry/export_carry.py RUN/carry --target assets/glm5-geometry-carry \
#             --dest assets/glm5-geometry-carry --pre-norm-dest assets/glm5-geometry-carry.mtp_pre_norm.safetensors \
#             --logs benchmarks/train/carry
# Writes to $OUT: target shards (hub-NN.safetensors, each under the 16 MiB a file that comes back) and
# pair.tar.gz (logs, summaries, both MTP layers).
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/glm5_pair}
BUDGET_S=${BUDGET_S:-300}
CARRY_STEPS=${CARRY_STEPS:-600}
export PYTHONPATH=$PWD:$PWD/kernels${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
RUN=/tmp/glm5_run
rm -rf "$RUN" && mkdir -p "$RUN" "$OUT"
python3 benchmarks/train/train.py --config benchmarks/train/config_glm5_geometry.json --data build/carry-data \
  --out "$RUN/target" --budget-s "$BUDGET_S" --eval-windows 256 2>&1 | tee "$RUN/train.log"
python3 benchmarks/train/export.py "$RUN/target" --tokenizer build/carry-data/tokenizer --dest "$RUN/model" \
  --logs "$RUN/target_logs"
python3 benchmarks/train/carry/train_mtp_carry.py --out "$RUN/carry" --data build/carry-data --target "$RUN/model" \
  --sigma 0 --device cuda --steps "$CARRY_STEPS" --context 1024 --batch 16 2>&1 | tee "$RUN/carry.log"
cp "$RUN"/target/hub-*.safetensors "$OUT"/
tar czf "$OUT/pair.tar.gz" -C "$RUN" train.log carry.log target/log.csv target/summary.json target/model_config.json \
  carry/log_post_norm.csv carry/log_pre_norm.csv carry/summary.json carry/mtp_post_norm.safetensors \
  carry/mtp_pre_norm.safetensors
