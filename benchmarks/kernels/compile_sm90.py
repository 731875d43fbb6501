"""Compile the SM90 sparse-MLA kernel for sm_90a without a GPU: shared memory, registers, spills.

Needs Triton 3.6 (the H200's version; its Gluon API differs from later ones), e.g. a side venv:
  python3.11 -m venv /tmp/t36 && /tmp/t36/bin/pip install --no-index /opt/pypi/files/triton-3.6.0-cp311-*.whl
  /tmp/t36/bin/python benchmarks/kernels/compile_sm90.py [--split-out] [--block-n 64] [--stages 2]
Prints the kernel's dynamic shared memory, then `ptxas -v` (registers, spills) on its PTX.
"""

import argparse
import importlib.util
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

KERNEL = Path(__file__).resolve().parents[2] / "kernels/glm_dsa_kernels/sparse_mla_sm90.py"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--split-out", action="store_true", help="the variant that writes fp32 split partials")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--fp8", action="store_true", help="FlashMLA's 656-byte FP8 KV rows (dequantizing producer)")
    ap.add_argument("--producer-regs", type=int, help="registers of the producer partition (default: the launcher's)")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("sparse_mla_sm90", KERNEL)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    fn = m.sparse_mla_fwd_sm90_kernel
    types = {"q_ptr": "*bf16", "kv_ptr": "*u8" if args.fp8 else "*bf16", "idx_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
             "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "qk_scale_log2": "fp32"}
    constants = {"SPLIT_OUT": args.split_out, "BLOCK_H": m.BLOCK_H, "BLOCK_N": args.block_n, "STAGES": args.stages,
                 "D_QK": m.D_QK, "D_V": m.D_V, "KV_FP8": args.fp8, "ROW_BYTES": 656 if args.fp8 else 2 * m.D_QK,
                 "PRODUCER_WARPS": m.PRODUCER_WARPS, "PRODUCER_REGS": args.producer_regs or (m.PRODUCER_REGS_FP8 if args.fp8 else m.PRODUCER_REGS)}
    signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in fn.arg_names}
    # as the launcher specializes them at run time: 16-byte aligned pointers and strides
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n.endswith("_ptr") or n.startswith("stride")}
    kernel = triton.compile(GluonASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 8})
    print(f"dynamic shared memory: {kernel.metadata.shared} bytes (227 KB = 232448 available)")
    ptx = Path("/tmp/sparse_mla_sm90.ptx")
    ptx.write_text(kernel.asm["ptx"])
    ptxas = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
    out = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(ptx), "-o", "/tmp/sparse_mla_sm90.cubin"],
                         capture_output=True, text=True)
    print(out.stderr.strip())


if __name__ == "__main__":
    main()
