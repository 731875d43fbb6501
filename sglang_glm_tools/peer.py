"""SGLang's own GLM-DSA path, the plugin's peer (issue 30): how to serve it beside the plugin.

Its `GlmMoeDsaForCausalLM` and `dsa` backend, with FlashMLA's sparse kernels (`sgl-flash-mla`, on
PYTHONPATH) and the indexer on SGLang's own torch fall-back, so DeepGEMM is not needed. Read from
SGLang 0.5.23's source (`benchmarks/serving/gpu/peer_setup.md`, section 4.3); used by the serving
benchmark's `CONFIG@sglang` runs and the GPU suite's peer test.
"""

from __future__ import annotations

ENV = {
    "SGLANG_PLUGINS": "gpu_standin",  # an allow-list: the GPU machine's stand-in plugin, not this one
    "SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD": "0",  # short prefills' dense path needs FA3
    "SGLANG_DSA_FUSE_TOPK": "0",  # the fused top-k transform is an sgl_kernel op the stand-in lacks
    "SGLANG_ENABLE_JIT_DEEPGEMM": "0",
    "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",  # SGLang's indexer fall-back: no DeepGEMM needed
}

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
