"""GLM-DSA hyper-parameters read from an HF config.json, with the per-layer indexer plan resolved."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


def resolve_indexer_types(cfg: dict) -> list[str]:
    """Full/shared per layer, as transformers 5.19 resolves it: list, else F/S pattern, else freq/offset."""
    n = cfg["num_hidden_layers"]
    if cfg.get("indexer_types") is not None:
        plan = list(cfg["indexer_types"])
    elif cfg.get("index_topk_pattern") is not None:
        plan = [{"F": "full", "S": "shared"}[c] for c in cfg["index_topk_pattern"]]
    else:
        freq = max(cfg.get("index_topk_freq", 1), 1)
        offset = cfg.get("index_skip_topk_offset", 2)  # transformers' default, not SGLang's
        plan = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(plan) != n or plan[0] != "full" or set(plan) - {"full", "shared"}:
        raise ValueError(f"invalid indexer plan for {n} layers: {plan}")
    return plan


@dataclass(frozen=True)
class DsaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    rms_norm_eps: float
    rope_theta: float
    indexer_types: tuple[str, ...]
    mlp_layer_types: tuple[str, ...]
    num_nextn_predict_layers: int = 0
    index_share_for_mtp_iteration: bool = False

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def from_dict(cls, cfg: dict) -> "DsaConfig":
        rope = cfg.get("rope_parameters") or {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"reference model supports plain RoPE only, got {rope}")
        if cfg.get("hidden_act", "silu") != "silu" or cfg.get("q_lora_rank") is None:
            raise ValueError("reference model expects silu and a q LoRA (as every GLM-DSA checkpoint has)")
        n = cfg["num_hidden_layers"]
        mlp = cfg.get("mlp_layer_types") or ["dense"] * min(cfg["first_k_dense_replace"], n) + ["sparse"] * max(
            n - cfg["first_k_dense_replace"], 0)
        names = {f for f in cls.__dataclass_fields__} - {"rope_theta", "indexer_types", "mlp_layer_types"}
        return cls(
            **{k: cfg[k] for k in names if k in cfg},
            rope_theta=float(rope["rope_theta"]),
            indexer_types=tuple(resolve_indexer_types(cfg)),
            mlp_layer_types=tuple(mlp),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "DsaConfig":
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))

    def to_hf_dict(self) -> dict:
        """Fields for `GlmMoeDsaConfig(**...)` (the checkpoint writer's input)."""
        d = asdict(self)
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": d.pop("rope_theta")}
        d["indexer_types"] = list(self.indexer_types)
        d["mlp_layer_types"] = list(self.mlp_layer_types)
        d["first_k_dense_replace"] = self.mlp_layer_types.index("sparse") if "sparse" in self.mlp_layer_types else self.num_hidden_layers
        d["num_key_value_heads"] = self.num_attention_heads
        d["tie_word_embeddings"] = False
        return d
