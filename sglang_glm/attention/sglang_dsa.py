"""GPU deployments with SGLang's own CUDA `dsa` attention backend (`--attention-backend dsa`).

Not yet run with the plugin. It needs FlashMLA and DeepGEMM: sgl-flash-mla 1.0.0 runs on this project's
H200, and so does the DeepGEMM `scripts/build_deep_gemm.sh` builds for its torch 2.11 (session 23: it
served SGLang's own GLM-DSA path there; SGLang's pin, 0.2.3.post2, does not load). So far this path is
exercised on CPU only as far as its plumbing goes (tests/test_cuda_plumbing.py).
Full layers own SGLang's `Indexer` (FP8 index-K pool, DeepGEMM logits, CUDA top-k); its top-k
goes through the plugin's `TopkBuffer` into `RadixAttention(..., topk_indices=...)` like every
other backend, so IndexCache sharing works the same way.
"""

from __future__ import annotations

from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer


class SGLangDsaIndexer(Indexer):
    @classmethod
    def for_glm(cls, config, topk: int, layer_id: int, quant_config, prefix: str) -> "SGLangDsaIndexer":
        rope = dict(getattr(config, "rope_parameters", None) or {})
        return cls(
            hidden_size=config.hidden_size,
            index_n_heads=config.index_n_heads,
            index_head_dim=config.index_head_dim,
            rope_head_dim=config.qk_rope_head_dim,
            index_topk=topk,
            q_lora_rank=config.q_lora_rank,
            max_position_embeddings=config.max_position_embeddings,
            rope_theta=rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)),
            layer_id=layer_id,
            scale_fmt="ue8m0" if getattr(config, "scale_fmt", None) == "ue8m0" else None,
            rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
            is_neox_style=not getattr(config, "indexer_rope_interleave", True),
            prefix=prefix,
            quant_config=quant_config,
            config=config,
        )

    def forward(self, hidden_states, q_lora, positions, forward_batch, backend=None):
        # SGLang's indexer finds its pool and metadata through the forward context itself.
        return super().forward(hidden_states, q_lora, positions, forward_batch, self.layer_id)

    @staticmethod
    def load_fused_shard(name, tensor, params, pending, quant_config) -> bool:
        """CUDA fuses wk + weights_proj into one bf16 parameter; SGLang's loader fills it."""
        from sglang.srt.models.deepseek_common.deepseek_weight_loader import (
            _load_fused_indexer_wk,
        )

        return _load_fused_indexer_wk(name, tensor, params, pending, quant_config)
