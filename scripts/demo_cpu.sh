#!/usr/bin/env bash
# Serve the bundled GLM-DSA model with real SGLang on this CPU and query it over HTTP.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu_env.sh
exec .venv/bin/python scripts/demo_cpu.py "$@"
