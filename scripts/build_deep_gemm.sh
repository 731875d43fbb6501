#!/usr/bin/env bash
# Builds a DeepGEMM wheel for the GPU machine's torch 2.11 on this CPU machine, into .gpu/deepgemm/.
#
# Why: every published sgl-deep-gemm fails there. 0.2.3+ does not load, and 0.1.7-0.2.2 load but
# misread their tensor arguments. Their _C.so was compiled against a torch development snapshot's
# headers (benchmarks/serving/gpu/peer_setup.md, point 3), and the wheels ship no csrc to rebuild from.
# SGLang's DSA indexer calls four functions, and the sgl-project fork's tvm-ffi branch has them all.
# So the host module (one C++ file) is compiled here against torch 2.11.0's own headers. The CUDA
# kernels are JIT-compiled with nvcc on the device at first use, as in any DeepGEMM install. The
# build also checks that one of those kernels compiles for sm_90a with this machine's nvcc.
#
# Needs: g++, a CUDA 13 toolkit (nvcc, cuda.h; CUDA_HOME, default /usr/local/cuda), a pip registry
# for the torch / CUDA-library header wheels (~1 GB of downloads, cached in $WORK), and the three
# source repositories at the commits below (git URLs or local git dirs):
#   DEEPGEMM_GIT=... CUTLASS_GIT=... FMT_GIT=... bash scripts/build_deep_gemm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${WORK:-/tmp/deep_gemm_build}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PY:-$ROOT/.venv/bin/python}
DEEPGEMM_GIT=${DEEPGEMM_GIT:-https://github.com/sgl-project/DeepGEMM}
CUTLASS_GIT=${CUTLASS_GIT:-https://github.com/NVIDIA/cutlass}
FMT_GIT=${FMT_GIT:-https://github.com/fmtlib/fmt}
DEEPGEMM_REV=2176dff556d6fb8f0184516dc224a3b31a094b98  # branch dev: tvm-ffi bindings, 16-head MQA logits
CUTLASS_REV=f3fde58372d33e9a5650ba7b80fc48b3b49d40c8   # its third-party/cutlass submodule
FMT_REV=553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28       # its third-party/fmt submodule
TORCH=2.11.0      # the GPU machine's torch (../shared/notes/sglang-gpu-recipe.md)
TVM_FFI=0.1.11    # what ../shared/gpu/prepare.sh installs there
VERSION="2.5.0+torch${TORCH//./}.${DEEPGEMM_REV:0:7}"
OUT=$ROOT/.gpu/deepgemm
mkdir -p "$WORK"/{dl,hdr,src}

pip_get() {  # pip_get SPEC...: wheels into $WORK/dl (any CPython's tags do: headers and libraries only)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYV:-3.11}" --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$WORK/dl" "$@"
}
checkout() {  # checkout GIT REV DEST [PATHS...]: the tree at REV, without a work tree of ours
  local git=$1 rev=$2 dest=$3; shift 3
  if [ -d "$git" ]; then (cd "$git" && git archive "$rev" "$@") | tar x -C "$dest"
  else
    local clone=$WORK/src/clone_$(basename "$dest")
    [ -d "$clone" ] || git clone -q --filter=blob:none --no-checkout "$git" "$clone"
    (cd "$clone" && git archive "$rev" "$@") | tar x -C "$dest"
  fi
}

echo "== sources"
SRC=$WORK/src/tree && rm -rf "$SRC" && mkdir -p "$SRC"/third-party/{cutlass,fmt}
checkout "$DEEPGEMM_GIT" $DEEPGEMM_REV "$SRC" csrc deep_gemm
checkout "$CUTLASS_GIT" $CUTLASS_REV "$SRC/third-party/cutlass" include
checkout "$FMT_GIT" $FMT_REV "$SRC/third-party/fmt" include

echo "== headers and link libraries: torch $TORCH, tvm-ffi $TVM_FFI, cuBLAS, NVRTC, cuSPARSE, cuSOLVER"
H=$WORK/hdr
if [ ! -f "$H/torch/lib/libtorch_cuda.so" ]; then
  pip_get "torch==$TORCH"
  (cd "$H" && unzip -q -o "$WORK"/dl/torch-"$TORCH"-*.whl 'torch/include/*' 'torch/lib/libtorch.so' \
    'torch/lib/libtorch_cpu.so' 'torch/lib/libc10.so' 'torch/lib/libc10_cuda.so' 'torch/lib/libtorch_cuda.so')
fi
if [ ! -d "$H/tvm_ffi/include" ]; then
  whl=$(ls "$ROOT"/.gpu/whl/apache_tvm_ffi-$TVM_FFI-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || { PYV=3.12 pip_get "apache-tvm-ffi==$TVM_FFI"; whl=$(ls "$WORK"/dl/apache_tvm_ffi-*.whl); }
  (cd "$H" && unzip -q -o "$whl" 'tvm_ffi/include/*' 'tvm_ffi/lib/*')
fi
# ATen's CUDA context header includes cuSPARSE's and cuSOLVER's; the module links cuBLAS(Lt) and NVRTC
# (versions: what this registry holds for CUDA 13; only their headers and sonames matter here)
if [ ! -f "$H/nvidia/cu13/include/cublasLt.h" ]; then
  pip_get nvidia-cublas==13.10.0.20 nvidia-cuda-nvrtc==13.5.37 nvidia-cusparse==12.9.4.2 nvidia-cusolver-cu12==11.7.1.2
  for w in "$WORK"/dl/nvidia_*.whl; do (cd "$H" && unzip -q -o "$w" 'nvidia/*'); done
fi
mkdir -p "$H/links"
for l in cublasLt cublas nvrtc; do ln -sf "$H/nvidia/cu13/lib/lib$l.so.13" "$H/links/lib$l.so"; done

echo "== the host module, against torch $TORCH's headers"
BUILD=$WORK/build && rm -rf "$BUILD" && mkdir -p "$BUILD"
# the flags deep_gemm/__init__.py's own _build_module passes through tvm_ffi.cpp.build (Python's headers:
# torch/python.h is included by the mega-MoE API; it declares, and nothing of it is called on this path)
g++ -std=c++17 -O3 -fPIC -Wno-psabi -Wno-deprecated-declarations -D_GLIBCXX_USE_CXX11_ABI=1 \
  -I"$H/tvm_ffi/include" -I"$CUDA_HOME/include" -I"$CUDA_HOME/include/cccl" -I"$H/nvidia/cu13/include" \
  -I"$H/nvidia/cusolver/include" -I"$("$PY" -c 'import sysconfig; print(sysconfig.get_path("include"))')" -I"$H/torch/include" -I"$H/torch/include/torch/csrc/api/include" \
  -I"$SRC/deep_gemm/include" -I"$SRC/third-party/cutlass/include" -I"$SRC/third-party/fmt/include" \
  -c "$SRC/csrc/tvm_ffi_api.cpp" -o "$BUILD/tvm_ffi_api.o"
g++ -shared "$BUILD/tvm_ffi_api.o" -o "$BUILD/_C.so" -L"$H/tvm_ffi/lib" -ltvm_ffi -L"$CUDA_HOME/lib64" \
  -L"$H/links" -L"$H/torch/lib" -lcudart -lnvrtc -lcublasLt -lcublas -ltorch -ltorch_cpu -lc10 -lc10_cuda -ltorch_cuda

echo "== the package: python, _C.so, and the headers its JIT compiles kernels with (DeepGEMM + CUTLASS/CuTe)"
PKG=$WORK/pkg && rm -rf "$PKG" && mkdir -p "$PKG"
cp -r "$SRC/deep_gemm" "$PKG/" && cp "$BUILD/_C.so" "$PKG/deep_gemm/"
cp -r "$SRC/third-party/cutlass/include/cute" "$SRC/third-party/cutlass/include/cutlass" "$PKG/deep_gemm/include/"

echo "== one JIT kernel (the prefill MQA logits SGLang's indexer calls) compiles for sm_90a with $CUDA_HOME's nvcc"
cat > "$BUILD/kernel.cu" <<'EOF'
#include <deep_gemm/impls/sm90_fp8_mqa_logits.cuh>
using namespace deep_gemm;
static void __instantiate_kernel() {
    auto ptr = reinterpret_cast<void*>(&sm90_fp8_mqa_logits<32, 128, false, 4, 256, 3, 3, 132, 128, 512, float>);
};
EOF
"$CUDA_HOME/bin/nvcc" "$BUILD/kernel.cu" -cubin -o "$BUILD/kernel.cubin" -std=c++20 -I"$PKG/deep_gemm/include" \
  --gpu-architecture=sm_90a --diag-suppress=39,161,174,177,186,940 -O3 --expt-relaxed-constexpr --expt-extended-lambda \
  --compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi

echo "== the wheel"
rm -f "$OUT"/sgl_deep_gemm-*.whl && mkdir -p "$OUT"
"$PY" - "$PKG" "$OUT" "$VERSION" "$DEEPGEMM_REV" <<'EOF'
import base64, hashlib, sys, zipfile
from pathlib import Path

pkg, out, version, rev = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
dist = f"sgl_deep_gemm-{version}.dist-info"
meta = {
    "METADATA": f"Metadata-Version: 2.1\nName: sgl-deep-gemm\nVersion: {version}\n"
                f"Summary: DeepGEMM (sgl-project fork, {rev}) built against torch 2.11.0 by scripts/build_deep_gemm.sh\n"
                "Requires-Dist: apache-tvm-ffi==0.1.11\n",
    "WHEEL": "Wheel-Version: 1.0\nGenerator: sglang-glm scripts/build_deep_gemm.sh\nRoot-Is-Purelib: false\n"
             "Tag: py3-none-linux_x86_64\n",
}
files = sorted(p for p in (pkg / "deep_gemm").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
record = []
wheel = out / f"sgl_deep_gemm-{version}-py3-none-linux_x86_64.whl"
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    def add(name, data):
        z.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    for p in files:
        add(p.relative_to(pkg).as_posix(), p.read_bytes())
    for name, text in meta.items():
        add(f"{dist}/{name}", text.encode())
    z.writestr(f"{dist}/RECORD", "\n".join(record + [f"{dist}/RECORD,,"]) + "\n")
print(wheel, f"{wheel.stat().st_size / 2**20:.1f} MiB")
EOF
