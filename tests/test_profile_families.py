"""profile_decode.py's kernel families: every DSA kernel, the plugin's and SGLang's own path's, is named.

The round profiles of sessions 15-16 counted the plugin's Hopper sparse-MLA kernel and its blocked indexer launch
as "other" (their names did not match the families' patterns); the kernels are listed here from
`glm_dsa_kernels` itself, so a renamed or new one is caught.
"""

import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "serving" / "gpu"))
import profile_decode  # noqa: E402

# the families by the module that defines the kernel (the plugin's RoPE counts with SGLang's, so a before/after
# compares like with like); the batch layout and the draft's top-k compaction are bookkeeping, not a family
MODULE_FAMILY = {"indexer": "indexer logits", "sparse_mla": "sparse MLA", "sparse_mla_sm90": "sparse MLA",
                 "topk_select": "top-k select", "rope": "rope"}


def plugin_kernels():
    import glm_dsa_kernels

    for info in pkgutil.iter_modules(glm_dsa_kernels.__path__):
        if info.name not in MODULE_FAMILY:
            continue
        module = importlib.import_module(f"glm_dsa_kernels.{info.name}")
        for name, value in vars(module).items():
            if name.endswith("kernel") and type(value).__name__ in ("JITFunction", "GluonJITFunction"):
                yield info.name, name


def test_every_plugin_dsa_kernel_has_its_family():
    found = list(plugin_kernels())
    assert {m for m, _ in found} == set(MODULE_FAMILY), found  # each module still defines a kernel
    assert [(m, k) for m, k in found if profile_decode.family(k) != MODULE_FAMILY[m]] == []


@pytest.mark.parametrize("kernel, fam", [
    # FlashMLA 1.0.0's legacy SM90 kernels (symbols of its _C_legacy.abi3.so) and DeepGEMM's MQA logits
    ("void legacy::sm90::prefill::sparse_fwd::sparse_attn_fwd_kernel<legacy::sm90::prefill::sparse_fwd::"
     "KernelTemplate<512, false>>(SparseAttnFwdParams)", "sparse MLA"),
    ("void flash::flash_fwd_splitkv_mla_fp8_sparse_kernel<KernelTemplate>(SparseAttnDecodeParams)", "sparse MLA"),
    ("void flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512>(DecodingParams)", "sparse MLA"),
    ("void deep_gemm::sm90_fp8_mqa_logits<128u, 64u>(unsigned int, ...)", "indexer logits"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<64u, 128u>(unsigned int, ...)", "indexer logits"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)", "torch top-k"),
    ("fused_moe_kernel", "MoE experts"),
    ("_w8a8_block_fp8_matmul", "FP8 block GEMM"),
])
def test_peer_kernels_have_their_family(kernel, fam):
    assert profile_decode.family(kernel) == fam


def test_steps_split_at_the_widest_idle_gaps():
    """Two prefill chunks: the cut falls in the scheduler's gap between them, not in a chunk's own small
    gaps, and a kernel on a second stream that outlasts the next one does not open a false gap."""
    def k(name, ts, dur):
        return {"name": name, "ts": ts, "dur": dur}

    # a long kernel, a short one beside it on a second stream, one more before the long one ends:
    # measured from the short one's end, the last would sit after a gap wider than the real one
    chunk1 = [k("sparse_mla_fwd_sm90_kernel", 0, 900), k("_w8a8_block_fp8_matmul", 10, 10),
              k("fused_moe_kernel", 880, 10)]
    chunk2 = [k("_indexer_logits_blocked_kernel", 1000, 300), k("sparse_mla_fwd_sm90_kernel", 1330, 100)]
    steps = profile_decode.split_steps(chunk1 + chunk2, 2)
    assert [s["kernels"] for s in steps] == [3, 2]
    assert [s["wall_us"] for s in steps] == [900, 430]
    assert steps[0]["families_us"] == {"sparse MLA": 900, "FP8 block GEMM": 10, "MoE experts": 10}
    assert steps[1]["families_us"] == {"indexer logits": 300, "sparse MLA": 100}
