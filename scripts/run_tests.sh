#!/usr/bin/env bash
# Set up the CPU environment (first run only) and run the test suite against real SGLang.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_cpu_env.sh
exec .venv/bin/python -m pytest tests "$@"
