"""SGLang's own GLM-DSA path, the plugin's peer (issue 30): how to serve it beside the plugin.

Its `GlmMoeDsaForCausalLM` and `dsa` backend, with FlashMLA's sparse kernels (`sgl-flash-mla`) from
a site directory put first on PYTHONPATH. The indexer's logits run on DeepGEMM where that directory
also holds `deep_gemm`, as on a Hopper deployment, else on SGLang's own torch fall-back. No published
wheel runs under the H200's torch 2.11; scripts/build_deep_gemm.sh builds one. Read from SGLang 0.5.23's source
(`benchmarks/serving/gpu/peer_setup.md`, sections 1.3 and 4.3); used by the serving benchmark's
`CONFIG@sglang` runs and the GPU suite's peer test.
"""

from __future__ import annotations

from pathlib import Path

ENV = {
    "SGLANG_PLUGINS": "gpu_standin",  # an allow-list: the GPU machine's stand-in plugin, not this one
    "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0",  # short prefills' dense path needs FA3
    "SGLANG_DSA_FUSE_TOPK": "0",  # the fused top-k transform is an sgl_kernel op the stand-in lacks
    # DeepGEMM's FP8 GEMMs stay off: the linears run SGLang's Triton block-FP8 GEMM, as the plugin's do
    # (and its all-M precompile sweep would take minutes of nvcc); the indexer's calls do not read this
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
}
TORCH_INDEXER = {"SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1"}  # SGLang's indexer fall-back: no DeepGEMM needed


def indexer(site: str | Path) -> str:
    """Which indexer-logits kernels a peer served from site runs: "deepgemm" or "torch"."""
    return "deepgemm" if (Path(site) / "deep_gemm").is_dir() else "torch"


def env(site: str | Path) -> dict[str, str]:
    """The environment of a peer server whose packages are installed in site."""
    return {**ENV, **(TORCH_INDEXER if indexer(site) == "torch" else {})}


# The plugin's model logs its IndexCache plan when built; SGLang's own never does.
PLUGIN_MODEL_LOG_LINE = "IndexCache plan ("


def flags(config_flags: list[str]) -> list[str]:
    """SGLang's `dsa` backend on FlashMLA for a launch's other flags (BF16 KV: FlashMLA sparse; FP8
    KV: its 656-byte KV-cache kernel), top-k in torch."""
    attn = "flashmla_kv" if "fp8_e4m3" in config_flags else "flashmla_sparse"
    out = ["--attention-backend", "dsa", "--dsa-prefill-backend", attn, "--dsa-decode-backend", attn,
           "--dsa-topk-backend", "torch"]
    if "--speculative-algorithm" in config_flags:
        out += ["--speculative-dsa-topk-backend", "torch"]
    return out
