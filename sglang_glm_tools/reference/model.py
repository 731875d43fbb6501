"""The GLM-DSA target model plus its MTP layer, loading and exporting the hub checkpoint layout."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .config import DsaConfig
from .layers import DecoderLayer, MoE, MtpLayer, RMSNorm, fp8_group_rounded, rope_cos_sin


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [B, S, V]
    hidden: torch.Tensor  # after the final norm: the MTP's h_prev for draft step 0
    indexer_kl: torch.Tensor | None  # summed over full layers, when distilling


@dataclass
class MtpOutput:
    logits: torch.Tensor  # lm_head(shared_head.norm(x))
    pre_norm: torch.Tensor  # x, the pre-norm carry
    post_norm: torch.Tensor  # shared_head.norm(x), the post-norm carry (GLM's default)
    selection: torch.Tensor | None  # the MTP indexer's top-k mask [B, S, T]
    indexer_kl: torch.Tensor | None


def causal_mask(s: int, device) -> torch.Tensor:
    return torch.ones(s, s, dtype=torch.bool, device=device).tril()[None]


class Backbone(nn.Module):
    """The checkpoint's `model.` prefix: embeddings, N target layers (+ the MTP layer at index N), final norm."""

    def __init__(self, cfg: DsaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layers = [DecoderLayer(cfg, kind == "full", mlp == "sparse")
                  for kind, mlp in zip(cfg.indexer_types, cfg.mlp_layer_types)]
        layers += [MtpLayer(cfg) for _ in range(cfg.num_nextn_predict_layers)]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GlmDsaForCausalLM(nn.Module):
    def __init__(self, cfg: DsaConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.fp8_weights = False  # loaded from a block-FP8 checkpoint (`load_reference_model`)

    @property
    def mtp_layer(self) -> MtpLayer:
        return self.model.layers[self.cfg.num_hidden_layers]

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_cos_sin(positions, self.cfg.qk_rope_head_dim, self.cfg.rope_theta, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, *,
                dense: bool = False, distill: bool = False) -> TargetOutput:
        """Target model. dense=True ignores top-k (dense causal MLA); distill=True sums the indexers' KL."""
        b, s = input_ids.shape
        if positions is None:
            positions = torch.arange(s, device=input_ids.device).expand(b, s)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(positions, x.dtype)
        causal = causal_mask(s, x.device)
        selection, kl_sum = None, None
        for layer in self.model.layers[: self.cfg.num_hidden_layers]:
            shared = not hasattr(layer.self_attn, "indexer")
            x, selection, kl = layer(x, cos, sin, causal, dense=dense, distill=distill,
                                     selection=selection if shared else None)
            if kl is not None:
                kl_sum = kl if kl_sum is None else kl_sum + kl
        hidden = self.model.norm(x)
        return TargetOutput(self.lm_head(hidden), hidden, kl_sum)

    def mtp_forward(self, next_ids: torch.Tensor, carry: torch.Tensor, positions: torch.Tensor, *,
                    selection: torch.Tensor | None = None, dense: bool = False, distill: bool = False) -> MtpOutput:
        """One MTP pass over a sequence: row i combines embed(next_ids[i]) with carry[i] at positions[i].

        selection: reuse a top-k mask (index share) instead of running the MTP indexer.
        """
        mtp = self.mtp_layer
        e = mtp.enorm(self.model.embed_tokens(next_ids))
        x = mtp.eh_proj(torch.cat([e, mtp.hnorm(carry)], dim=-1))
        cos, sin = self._rope(positions, x.dtype)
        x, selection, kl = mtp(x, cos, sin, causal_mask(x.shape[1], x.device),
                               dense=dense, distill=distill, selection=selection)
        post = mtp.shared_head.norm(x)
        return MtpOutput(self.lm_head(post), x, post, selection, kl)

    # ------------------------------------------------------------ checkpoint layout

    def _mtp_copies(self) -> dict[str, nn.Parameter]:
        """Hub names of the MTP layer's copies of the target's embedding and lm head."""
        p = f"model.layers.{self.cfg.num_hidden_layers}"
        if not self.cfg.num_nextn_predict_layers:
            return {}
        return {f"{p}.embed_tokens.weight": self.model.embed_tokens.weight,
                f"{p}.shared_head.head.weight": self.lm_head.weight}

    def hub_state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors named and laid out as the hub checkpoint (per-expert, MTP copies included)."""
        out = {k: v.detach().clone() for k, v in self.state_dict().items()}
        out.update({k: v.detach().clone() for k, v in self._mtp_copies().items()})
        return out

    def load_hub_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load hub tensors (dequantized); the MTP's embedding/head copies must equal the target's."""
        tensors = dict(tensors)
        for name in self._mtp_copies():
            copy = tensors.pop(name, None)
            main = tensors["model.embed_tokens.weight" if "embed" in name else "lm_head.weight"]
            if copy is not None and not torch.equal(copy.to(main.dtype), main):
                raise ValueError(f"{name} differs from the target's; the reference shares them")
        missing, unexpected = self.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise ValueError(f"checkpoint mismatch: missing {missing[:8]}, unexpected {unexpected[:8]}")

    def round_fp8_activations(self, modules: set[str], group: int) -> None:
        """Model a w8a8 block-FP8 server: the inputs of `modules` (hub names of FP8 linears) are
        rounded to e4m3 per token and `group` columns, as SGLang's FP8 GEMMs quantize them. A routed
        expert marks its whole MoE (the experts run as one batched product); kv_b_proj is left
        alone, since the server absorbs it into BF16 weights that no activation rounding reaches."""
        for name in sorted(modules):
            if name.endswith(".kv_b_proj"):
                continue
            if ".mlp.experts." in name:
                moe = self.get_submodule(name.split(".experts.")[0])
                assert isinstance(moe, MoE), name
                moe.fp8_group = group
                continue
            linear = self.get_submodule(name)
            assert isinstance(linear, nn.Linear), name
            if linear.in_features % group:
                raise ValueError(f"{name}: in_features={linear.in_features} is not a multiple of the FP8 block's "
                                 f"{group} columns; SGLang's block-FP8 GEMM needs it, so no server runs this checkpoint")
            linear.register_forward_pre_hook(lambda _, args: (fp8_group_rounded(args[0], group),))


def load_reference_model(path: str | Path, dtype: torch.dtype = torch.float64, device="cpu",
                         fp8_activations: bool = False) -> GlmDsaForCausalLM:
    """A reference model from a GLM-DSA checkpoint directory (FP8 weights are dequantized first).

    fp8_activations: for an FP8 checkpoint, also round each FP8 linear's input to e4m3 as SGLang's
    w8a8 block-FP8 GEMMs do on CUDA (`round_fp8_activations`); a CPU server dequantizes instead."""
    path = Path(path)
    cfg = DsaConfig.from_pretrained(path)
    tensors = load_file(str(path / "model.safetensors"))
    fp8_linears = {k.removesuffix(".weight_scale_inv") for k in tensors if k.endswith(".weight_scale_inv")}
    if fp8_linears:
        from ..checkpoint import dequantized_state_dict

        tensors = dequantized_state_dict(path, torch.float32)
    model = GlmDsaForCausalLM(cfg)
    model.load_hub_state_dict({k: v.to(torch.float32) for k, v in tensors.items()})
    model.fp8_weights = bool(fp8_linears)
    if fp8_activations and fp8_linears:
        quant = json.loads((path / "config.json").read_text())["quantization_config"]
        model.round_fp8_activations(fp8_linears, group=quant["weight_block_size"][1])
    return model.to(device=device, dtype=dtype).eval()
