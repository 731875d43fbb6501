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
# the prefill call SGLang's indexer makes first (session 18's t.is_cuda() assertion), at GLM-5's
# indexer shape; its distance from a float32 reading of DeepGEMM's documented formula is printed for
# the log (the exit status rests on the call running, not on that reading)
torch.manual_seed(0)
q = torch.randn(64, 32, 128, device="cuda").to(torch.float8_e4m3fn)
kv = torch.randn(256, 128, device="cuda").to(torch.float8_e4m3fn)
kv_scale = torch.rand(256, device="cuda") + 0.5
weights = torch.randn(64, 32, device="cuda")
ks = torch.zeros(64, dtype=torch.int32, device="cuda")
ke = torch.full((64,), 256, dtype=torch.int32, device="cuda")
logits = deep_gemm.fp8_mqa_logits(q, (kv, kv_scale), weights, ks, ke)
torch.cuda.synchronize()
want = (torch.einsum("shd,kd->shk", q.float(), kv.float()) * kv_scale).relu()
want = (want * weights[:, :, None]).sum(1)
err = ((logits[:, :256].float() - want).norm() / want.norm()).item()
print(f"fp8_mqa_logits ran: {tuple(logits.shape)}, relative distance from the float32 formula {err:.2e}")
print("deep_gemm runs")
