"""GLM-DSA building blocks in plain PyTorch: norms, interleaved RoPE, lightning indexer, MLA, MoE.

Module and parameter names follow the hub checkpoint, so `state_dict()` keys are the checkpoint's keys.
Reductions (norms, router, indexer, softmax) run in float32, or float64 when the model is float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import FP8_MAX
from .config import DsaConfig


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for low-precision inputs, float64 for float64 (the reference mode)."""
    return torch.promote_types(dtype, torch.float32)


def fp8_group_rounded(x: torch.Tensor, group: int) -> torch.Tensor:
    """x as a w8a8 block-FP8 GEMM reads it: each token's runs of `group` columns scaled by their
    amax / 448 and rounded to e4m3 codes (SGLang's per_token_group_quant_fp8), in x's dtype."""
    blocks = x.unflatten(-1, (-1, group))
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=1e-10)
    # SGLang's CUDA kernel: codes of x * (448 / amax), dequantized by amax * (1 / 448)
    codes = (blocks * (FP8_MAX / amax)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (codes.to(x.dtype) * (amax * (1 / FP8_MAX))).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(acc_dtype(x.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype):
    """cos/sin [..., dim/2] per rotated pair; frequencies in float32 as GLM/transformers define them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    angle = positions.to(acc_dtype(dtype))[..., None] * inv_freq.to(acc_dtype(dtype))
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x0,x1),(x2,x3),...; output lays out evens then odds, as transformers does (dot products agree)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def select_topk(index_scores: torch.Tensor, causal: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean [B,S,T] of each query's top-k causal keys.

    Tie rule: higher score first; equal scores -> lower key position first (stable descending sort).
    """
    if index_scores.shape[-1] <= k:
        return causal.expand_as(index_scores).clone()
    scores = index_scores.masked_fill(~causal, float("-inf"))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, order, True) & causal


def distill_kl(target: torch.Tensor, index_scores: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """KL(target || softmax(index scores)) over `support` keys, mean over queries (DSA indexer warm-up loss)."""
    logq = torch.log_softmax(index_scores.masked_fill(~support, float("-inf")), dim=-1)
    logq = logq.masked_fill(~support, 0.0)
    kl = torch.xlogy(target, target) - target * logq
    return kl.sum(-1).mean()


class Indexer(nn.Module):
    """Lightning indexer: score(s, t) = sum_h w_h(s) * H^-0.5 * relu(q_h(s) . k(t) * D^-0.5)."""

    def __init__(self, cfg: DsaConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(cfg.hidden_size, self.n_heads, bias=False)

    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Index scores [B, S, T] (no causal mask), computed outside autocast in float32/float64."""
        b, s, _ = x.shape
        acc = acc_dtype(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            x, q_resid = x.to(self.wk.weight.dtype), q_resid.to(self.wq_b.weight.dtype)
            q = self.wq_b(q_resid).view(b, s, self.n_heads, self.head_dim)
            k = self.k_norm(self.wk(x))
            r = self.rope_dim
            q = torch.cat([apply_rope_interleaved(q[..., :r], cos[:, :, None], sin[:, :, None]), q[..., r:]], -1)
            k = torch.cat([apply_rope_interleaved(k[..., :r], cos, sin), k[..., r:]], -1)
            scores = torch.einsum("bshd,btd->bsht", q.to(acc), k.to(acc)) * self.head_dim**-0.5
            weights = self.weights_proj(x).to(acc) * self.n_heads**-0.5
            return torch.einsum("bsh,bsht->bst", weights, F.relu(scores))


class MlaAttention(nn.Module):
    """MLA with q/kv LoRA; sparse over the indexer's top-k keys. Shared layers own no indexer."""

    def __init__(self, cfg: DsaConfig, has_indexer: bool):
        super().__init__()
        self.cfg = cfg
        h = cfg.num_attention_heads
        self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=False)
        if has_indexer:
            self.indexer = Indexer(cfg)

    def forward(self, x, cos, sin, causal, *, dense=False, selection=None, distill=False):
        """Returns (output, selection used, indexer KL or None).

        selection: a given top-k mask [B,S,T] (shared layer, or a reused MTP row); full layers compute their own
        when it is None. dense=True attends to all causal keys (the warm-up / dense-baseline mode).
        distill=True also returns the indexer's KL to this layer's attention distribution (inputs detached).
        """
        cfg = self.cfg
        b, s, _ = x.shape
        nope, rope, vdim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        q_resid = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_resid).view(b, s, -1, cfg.qk_head_dim)
        q = torch.cat([q[..., :nope], apply_rope_interleaved(q[..., nope:], cos[:, :, None], sin[:, :, None])], -1)
        kv_pass, k_rope = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_pass)).view(b, s, -1, nope + vdim)
        k_nope, v = kv.split([nope, vdim], dim=-1)
        k_rope = apply_rope_interleaved(k_rope, cos, sin)[:, :, None].expand(-1, -1, k_nope.shape[2], -1)
        k = torch.cat([k_nope, k_rope], -1)

        index_scores = None
        if selection is None and hasattr(self, "indexer") and not (dense and not distill):
            with torch.set_grad_enabled(distill and torch.is_grad_enabled()):
                index_scores = self.indexer(x.detach(), q_resid.detach(), cos, sin)
            selection = select_topk(index_scores.detach(), causal, cfg.index_topk)
        if not dense and selection is None:
            raise ValueError("a sparse shared layer needs the top-k of a full layer before it")
        allowed = causal if dense else causal & selection

        scores = torch.einsum("bshd,bthd->bhst", q, k) * cfg.qk_head_dim**-0.5
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=acc_dtype(scores.dtype))
        out = torch.einsum("bhst,bthd->bshd", probs.to(v.dtype), v).reshape(b, s, -1)

        kl = None
        if distill and index_scores is not None:
            kl = distill_kl(probs.detach().mean(1), index_scores, allowed)
        return self.o_proj(out), selection, kl


class Mlp(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Sigmoid scores, noaux_tc choice (scores + e_score_correction_bias, group-limited), weights from raw scores."""

    def __init__(self, cfg: DsaConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.zeros(cfg.n_routed_experts, cfg.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Dense combine weights [N, E]: zero for experts not chosen."""
        cfg = self.cfg
        acc = acc_dtype(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            scores = F.linear(x.to(acc), self.weight.to(acc)).sigmoid()
        choice = scores + self.e_score_correction_bias.to(acc)
        per_group = cfg.n_routed_experts // cfg.n_group
        groups = choice.view(-1, cfg.n_group, per_group).topk(min(2, per_group), dim=-1).values.sum(-1)
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, groups.topk(cfg.topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        chosen = choice.topk(cfg.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, chosen)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return torch.zeros_like(scores).scatter_(1, chosen, weights * cfg.routed_scaling_factor)


class MoE(nn.Module):
    """Routed experts (computed densely, then combined with zero weights for unchosen) + shared expert."""

    def __init__(self, cfg: DsaConfig):
        super().__init__()
        self.experts = nn.ModuleList(Mlp(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.n_routed_experts))
        self.gate = Router(cfg)
        self.shared_experts = Mlp(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)
        self.fp8_group: int | None = None  # set by round_fp8_activations: the experts' GEMMs read e4m3 inputs

    def _expert_input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.fp8_group is None else fp8_group_rounded(x, self.fp8_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        combine = self.gate(flat)
        gate = torch.stack([e.gate_proj.weight for e in self.experts])
        up = torch.stack([e.up_proj.weight for e in self.experts])
        down = torch.stack([e.down_proj.weight for e in self.experts])
        rows = self._expert_input(flat)
        h = F.silu(torch.einsum("nd,eid->nei", rows, gate)) * torch.einsum("nd,eid->nei", rows, up)
        y = torch.einsum("nei,edi->ned", self._expert_input(h), down)
        routed = torch.einsum("ne,ned->nd", combine.to(y.dtype), y)
        return routed.to(x.dtype).view_as(x) + self.shared_experts(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DsaConfig, has_indexer: bool, sparse_mlp: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MlaAttention(cfg, has_indexer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if sparse_mlp else Mlp(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, causal, **attn_kwargs):
        a, selection, kl = self.self_attn(self.input_layernorm(x), cos, sin, causal, **attn_kwargs)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), selection, kl


class SharedHead(nn.Module):
    def __init__(self, cfg: DsaConfig):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MtpLayer(DecoderLayer):
    """The NextN layer: x = eh_proj(cat(enorm(embed), hnorm(carry))), a decoder layer with its own indexer."""

    def __init__(self, cfg: DsaConfig):
        super().__init__(cfg, has_indexer=True, sparse_mlp=cfg.n_routed_experts > 0)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.shared_head = SharedHead(cfg)
