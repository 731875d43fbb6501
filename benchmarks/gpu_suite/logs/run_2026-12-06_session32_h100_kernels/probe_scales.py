# Session 32, on the H100 beside kernel_tests.log: which bytes test_index_k_store_fp8 found unequal. Run from the
# repository root at tree ba11cd3 (the device call ran it as `python3 diag_tmp.py`); its output is probe_scales.log.
import torch, sys
sys.path.insert(0, "kernels")
from glm_dsa_kernels.index_k_store import store_index_k_fp8, store_index_k_fp8_ref
from glm_dsa_kernels.layout import quantize_index_k
dev = "cuda"; torch.manual_seed(11)
T, pages = 300, 8
k = (torch.randn(T, 128, device=dev) * torch.logspace(-4, 3, T, device=dev)[:, None]).float()
k[1] = 0; k[2, 5] = 448.0
loc = torch.randperm(pages * 64, device=dev)[:T]
want = torch.zeros(pages, 64 * 132, dtype=torch.uint8, device=dev); got = want.clone()
store_index_k_fp8_ref(k, loc, want); store_index_k_fp8(k, loc, got)
codes, scale = quantize_index_k(k)
gs = got[:, 64 * 128:].contiguous().view(torch.float32)[loc // 64, loc % 64]
gc = got[:, :64 * 128].reshape(pages, 64, 128)[loc // 64, loc % 64]
print("scale rows differ:", (gs != scale).sum().item(), "code bytes differ:", (gc != codes).sum().item())
r = (gs != scale).nonzero().flatten()[:5]
for t in r.tolist():
    amax = k[t].abs().amax().item()
    print("row", t, "amax", amax, "torch scale %.10e" % scale[t].item(), "triton %.10e" % gs[t].item())
bad = (gc != codes).nonzero()[:8]
for t, d in bad.tolist():
    x = k[t, d]; q = (x / scale[t]).item()
    print(t, d, "x/scale torch %.9e" % q, "triton-scale q %.9e" % (x / gs[t]).item(), "codes", codes[t, d].item(), gc[t, d].item())
