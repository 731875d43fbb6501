"""Exits 0 when the importable deep_gemm runs a call on this GPU, else prints why and exits 1.

An importable deep_gemm that cannot run is worse than none for SGLang's own GLM-DSA path: its indexer
asserts at the first prefill (published sgl-deep-gemm 0.2.1 on torch 2.11: `t.is_cuda()` on CUDA
tensors; scripts/build_deep_gemm.sh builds one against torch 2.11's headers instead). Used by
scripts/gpu_bench.sh and run_gpu_suite.sh.
"""

import torch
import tvm_ffi

import deep_gemm

print("torch", torch.__version__, "| tvm_ffi", tvm_ffi.__version__, tvm_ffi.__file__, "| deep_gemm", deep_gemm.__file__)
context_lens = torch.ones(4, 1, dtype=torch.int32, device="cuda")
deep_gemm.get_paged_mqa_logits_metadata(context_lens, 64, deep_gemm.get_num_sms())
torch.cuda.synchronize()
print("deep_gemm runs")
