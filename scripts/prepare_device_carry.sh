#!/usr/bin/env bash
# Everything a device call carries in .gpu/ beside the tree, built on this CPU machine from a fresh
# checkout (.gpu/ is git-ignored, so a new checkout has none of it):
#   bash scripts/prepare_device_carry.sh      # then `bash scripts/device_tree.sh out [MODEL_DIR ...]`
#
#   .gpu/{carry,whl,stub,device_env.sh}  SGLang 0.5.23 for the device (../shared/gpu/prepare.sh)
#   .gpu/peer/                           sgl-flash-mla 1.0.0: SGLang's own path, the plugin's FlashMLA dispatch
#   .gpu/deepgemm/                       DeepGEMM built for the device's torch (scripts/build_deep_gemm.sh);
#                                        DEEPGEMM=0 skips it (SGLang's own path then runs its torch indexer)
#   .gpu/before_tree/                    the plugin at BEFORE_REV (default HEAD) for the before/after modes,
#                                        with BEFORE_FILES="path:rev ..." taken from other revisions; the
#                                        default is the top-k select before fc17c9a (`gpu_bench.sh topk`)
#
# build_deep_gemm.sh clones its three repositories from GitHub unless DEEPGEMM_GIT, CUTLASS_GIT and
# FMT_GIT name local copies (in this workplace: the search library's `fetch` of sgl-project/DeepGEMM,
# NVIDIA/cutlass and fmtlib/fmt, under /work/.mirror/OWNER+NAME/repo, which this script uses when present).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

bash ../shared/gpu/prepare.sh .gpu

rm -rf .gpu/peer && mkdir -p .gpu/peer
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/peer sgl-flash-mla==1.0.0

if [ "${DEEPGEMM:-1}" = 1 ]; then
  mirror() { [ -d "/work/.mirror/$1/repo" ] && echo "/work/.mirror/$1/repo" || echo "$2"; }
  DEEPGEMM_GIT=${DEEPGEMM_GIT:-$(mirror sgl-project+DeepGEMM https://github.com/sgl-project/DeepGEMM)} \
  CUTLASS_GIT=${CUTLASS_GIT:-$(mirror NVIDIA+cutlass https://github.com/NVIDIA/cutlass)} \
  FMT_GIT=${FMT_GIT:-$(mirror fmtlib+fmt https://github.com/fmtlib/fmt)} \
    bash scripts/build_deep_gemm.sh
fi

rm -rf .gpu/before_tree && mkdir -p .gpu/before_tree
git archive "${BEFORE_REV:-HEAD}" sglang_glm kernels pyproject.toml README.md | tar x -C .gpu/before_tree
for spec in ${BEFORE_FILES-kernels/glm_dsa_kernels/topk_select.py:fc17c9a^}; do
  git show "${spec#*:}:${spec%%:*}" > ".gpu/before_tree/${spec%%:*}"
done

du -sh .gpu
