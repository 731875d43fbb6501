#!/usr/bin/env bash
# The commands that made benchmarks/calibration/glm-dsa-mini/ (CPU, 2 cores, SGLang 0.5.23 + plugin).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}

# 1. Greedy search 8 -> 2 full layers on 8192 calibration tokens (8 windows of 1024), with the
#    searched-vs-uniform comparison on 8192 held-out tokens, the top-k overlap and the plots.
$PY -m sglang_glm_tools.calibrate --model assets/glm-dsa-mini --full-layers 2 \
    --data benchmarks/train/data/calib.txt --heldout benchmarks/train/data/heldout.txt \
    --max-tokens 8192 --out benchmarks/calibration/glm-dsa-mini

# 2. The searched patterns served by sglang.Engine (plugin, launch override): held-out loss from
#    the server's input logprobs vs the tool's figure.
$PY benchmarks/calibration/serve_check.py --result benchmarks/calibration/glm-dsa-mini/result.json \
    --heldout benchmarks/train/data/heldout.txt --budgets 5 4 3 2 --uniform
