#!/usr/bin/env bash
# Builds .venv: real SGLang 0.5.23 on CPU (torch 2.14.1) plus this plugin, from a fresh machine.
# sglang's own dependency list pulls CUDA-only wheels, so the known-good freeze goes in with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
# Known-good package set for SGLang 0.5.23 on CPU (copy of the project's shared freeze).
FREEZE=scripts/sglang-cpu-freeze.txt
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import sglang, torch, transformers, pytest, hypothesis, sglang_glm" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q torch==2.14.1 torchvision==0.29.1
  .venv/bin/pip install -q --no-deps -r "$FREEZE"
  .venv/bin/pip install -q pytest==9.2.0 matplotlib==3.11.2 hypothesis==6.170.17 sortedcontainers==2.4.0
fi
# Every time: keeps the plugin's entry points (installed metadata) in step with pyproject.toml.
.venv/bin/pip install -q --no-deps -e .
echo "environment ready: $(pwd)/.venv"
