"""GLM-DSA (GLM-5 / 5.1 / 5.2) for SGLang: MLA + DeepSeek sparse attention, IndexCache, MoE.

Reads top to bottom: the decoder layer, the model, the causal LM with weight loading. The layer's
attention (MLA that consumes top-k from the top-k buffer, and the lightning indexer of a full
layer) is `models/attention.py`. Only full layers (per the IndexCache plan) construct an indexer;
every layer's sparse attention reads the indices the most recent full layer wrote into the one
`TopkBuffer`.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

import torch
from torch import nn
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.quantization.base_config import QuantizationConfig
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.layers.utils import PPMissingLayer
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, PPProxyTensors
from sglang.srt.models.deepseek_v2 import DeepseekV2MLP, DeepseekV2MoE, pp_stage_needs_embedding
from sglang.srt.runtime_context import get_parallel, get_spec
from sglang.srt.utils import add_prefix, make_pp_layers

from sglang_glm.layer_plan import LayerPlan
from sglang_glm.models.attention import GlmDsaAttention, side_stream
from sglang_glm.models.weights import (
    PACKED_MODULES,
    CheckpointAccounting,
    CheckpointError,
    SharedExpertFusion,
    dequantized_weight,
    expert_params_mapping,
    fused_shared_expert_name,
    fused_shared_experts,
    TensorLoader,
)
from sglang_glm.settings import SGLANG_INDEXER, GlmDsaSettings, module_config
from sglang_glm.topk_buffer import TopkBuffer

logger = logging.getLogger(__name__)


class GlmDsaDecoderLayer(nn.Module):
    def __init__(
        self, config, settings: GlmDsaSettings, layer_id: int, has_indexer: bool, quant_config, prefix: str,
        alt_stream: Optional[torch.cuda.Stream] = None,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.self_attn = GlmDsaAttention(
            config, settings, layer_id, has_indexer, quant_config, add_prefix("self_attn", prefix), alt_stream
        )
        # transformers' GlmMoeDsaConfig checks mlp_layer_types' length and entries ("dense" / "sparse")
        mlp_types = getattr(config, "mlp_layer_types", None)
        is_moe = mlp_types[layer_id] == "sparse" if mlp_types is not None else layer_id >= config.first_k_dense_replace
        if is_moe:
            self.mlp = DeepseekV2MoE(
                config, layer_id, quant_config=quant_config, prefix=add_prefix("mlp", prefix)
            )
        else:
            self.mlp = DeepseekV2MLP(
                config.hidden_size, config.intermediate_size, config.hidden_act,
                quant_config=quant_config, prefix=add_prefix("mlp", prefix),
            )
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual, forward_batch, topk_buffer, run_indexer):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(
            positions, hidden_states, forward_batch, topk_buffer, run_indexer
        )
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        if isinstance(self.mlp, DeepseekV2MoE):
            hidden_states = self.mlp(hidden_states, forward_batch)
        else:
            hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


class GlmDsaModel(nn.Module):
    """The decoder stack; under pipeline parallelism this rank's stage [start_layer, end_layer)."""

    def __init__(self, config, settings: GlmDsaSettings, quant_config, prefix: str = ""):
        super().__init__()
        self.plan = plan = settings.plan
        self.pp_group = get_parallel().pp_group
        if pp_stage_needs_embedding(self.pp_group, get_spec().speculative_algorithm):
            self.embed_tokens = VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, prefix=add_prefix("embed_tokens", prefix)
            )
        else:
            self.embed_tokens = PPMissingLayer()
        alt_stream = side_stream()
        self.layers, self.start_layer, self.end_layer = make_pp_layers(
            config.num_hidden_layers,
            lambda idx, prefix: GlmDsaDecoderLayer(
                config, settings, idx, plan.is_full(idx), quant_config, prefix, alt_stream
            ),
            prefix=add_prefix("layers", prefix),
        )
        if self.pp_group.is_last_rank:
            self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        else:
            self.norm = PPMissingLayer(return_tuple=True)
        self.topk_buffer = TopkBuffer(settings.index_topk)

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, plan=None, pp_proxy_tensors=None):
        plan = plan or self.plan
        self.topk_buffer.begin_forward(positions.shape[0])
        if self.pp_group.is_first_rank:
            hidden_states = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
            residual = None
        else:
            hidden_states, residual = pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]
            if not plan.is_full(self.start_layer):
                # A stage that starts at a shared layer reuses the previous stage's top-k.
                self.topk_buffer.write(plan.source_layer(self.start_layer), pp_proxy_tensors["topk_indices"])
        hidden_states, residual = self.run_layers(
            positions, forward_batch, plan, hidden_states, residual, self.start_layer, self.end_layer
        )
        if not self.pp_group.is_last_rank:
            tensors = {"hidden_states": hidden_states, "residual": residual}
            if not plan.is_full(self.end_layer):
                tensors["topk_indices"] = self.topk_buffer.read(self.end_layer)
            return PPProxyTensors(tensors)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states

    def run_layers(
        self,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        plan: LayerPlan,
        hidden_states: torch.Tensor,
        residual: Optional[torch.Tensor],
        start: int,
        end: int,
        after_layer: Optional[Callable[[int, torch.Tensor, Optional[torch.Tensor]], None]] = None,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Layers [start, end) with `plan`, from the residual stream entering layer `start`.

        The top-k buffer must hold what layer `start` reads (begun, and written if it is shared).
        `after_layer(i, hidden_states, residual)` runs after layer i: tools read the top-k buffer
        or keep the state entering layer i + 1 there (calibration).
        """
        check_plan_servable(plan, self.plan)
        for i in range(start, end):
            hidden_states, residual = self.layers[i](
                positions, hidden_states, residual, forward_batch, self.topk_buffer, plan.is_full(i)
            )
            if after_layer is not None:
                after_layer(i, hidden_states, residual)
        return hidden_states, residual


def check_plan_servable(plan: LayerPlan, built: LayerPlan) -> None:
    """A per-forward plan may share layers that own an indexer, never run one that has none."""
    if len(plan) != len(built):
        raise ValueError(f"plan has {len(plan)} layers, the model {len(built)}")
    missing = [i for i in plan.full_layers if not built.is_full(i)]
    if missing:
        raise ValueError(
            f"plan {plan.pattern} marks layers {missing} full, but the model was built with plan "
            f"{built.pattern} and those layers have no indexer; build the model with them full"
        )


class GlmMoeDsaForCausalLM(SharedExpertFusion, nn.Module):
    fused_shared_experts_architecture = "GlmMoeDsaForCausalLM"
    packed_modules_mapping = PACKED_MODULES  # read by SGLang's quantization configs

    def __init__(
        self,
        config,
        quant_config: Optional[QuantizationConfig] = None,
        prefix: str = "",
        settings: Optional[GlmDsaSettings] = None,
    ):
        super().__init__()
        self.settings = settings or GlmDsaSettings.for_this_process(config)
        self.plan = self.settings.plan
        # The one write to SGLang's config: its KV pool reads the plan from there (no index-K
        # cache for shared layers), so it must see the plan the model was built with.
        config.indexer_types = list(self.plan.kinds)
        config.index_topk_pattern = self.plan.pattern
        logger.info(self.plan.describe())
        config = module_config(config)
        self.config = config
        self.fused_shared_experts = fused_shared_experts(type(self).__name__, config)
        self.quant_config = quant_config
        self.model = GlmDsaModel(config, self.settings, quant_config, add_prefix("model", prefix))
        if self.model.pp_group.is_last_rank:
            self.lm_head = ParallelLMHead(
                config.vocab_size, config.hidden_size, prefix=add_prefix("lm_head", prefix)
            )
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config)

    @property
    def start_layer(self) -> int:
        return self.model.start_layer

    @property
    def end_layer(self) -> int:
        return self.model.end_layer

    @property
    def topk_buffer(self) -> TopkBuffer:
        return self.model.topk_buffer

    def allocate_forward_buffers(self, max_tokens: int, max_requests: int, device) -> None:
        """Once, when SGLang builds this runner's attention backends: fixed addresses for CUDA graphs."""
        self.model.topk_buffer.allocate(max_tokens, device)

    def get_embed_and_head(self):
        """What an EAGLE/NEXTN draft (the MTP layer) shares with the target."""
        return self.model.embed_tokens.weight, self.lm_head.weight

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: Optional[torch.Tensor] = None,
        plan: Optional[LayerPlan] = None,
        pp_proxy_tensors: Optional[PPProxyTensors] = None,
        **unused,
    ):
        hidden_states = self.model(input_ids, positions, forward_batch, input_embeds, plan, pp_proxy_tensors)
        if not self.model.pp_group.is_last_rank:
            return hidden_states  # PPProxyTensors for the next stage
        return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch)

    def get_weights_by_name(self, name: str, truncate_size: int = 100, tp_size: int = 1):
        """A parameter's first values (SGLang's weight-inspection API); None if the model has none."""
        param = dict(self.named_parameters()).get(name)
        if param is None:
            return None
        return param.data.flatten()[:truncate_size].float().cpu().tolist()

    # ---- weights ----------------------------------------------------------------------------

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        params = dict(self.named_parameters())
        accounting = CheckpointAccounting(self.config, self.plan, self.start_layer, self.end_layer, params)
        loader = TensorLoader(params, expert_params_mapping(self.config, self.fused_shared_experts), type(self).__name__)
        pending_fused: dict = {}  # FP8 halves of the fused indexer projection waiting for their other half
        fused_parts: dict[str, set] = {}
        for name, tensor in weights:
            if not accounting.admit(name, tensor):
                continue
            if self.fused_shared_experts:
                name = fused_shared_expert_name(name, self.config.n_routed_experts)
            fused = name.rsplit(".indexer.", 1)[0] + ".indexer.wk_weights_proj.weight"
            if (
                self.settings.indexer == SGLANG_INDEXER
                and (".indexer.wk." in name or ".indexer.weights_proj." in name)
                and fused in params
            ):
                # SGLang's CUDA indexer keeps wk and weights_proj fused where its kernels allow.
                from sglang_glm.attention.sglang_dsa import SGLangDsaIndexer

                if SGLangDsaIndexer.load_fused_shard(name, tensor, params, pending_fused, self.quant_config):
                    fused_parts.setdefault(fused, set()).add("wk" if ".indexer.wk." in name else "weights_proj")
                    continue
            loader.load(name, tensor)
        if pending_fused:
            raise CheckpointError(f"FP8 indexer tensors without their scale, or scales without their weight: "
                                  f"{sorted(pending_fused)}; use the complete checkpoint")
        # the fused parameter is loaded once both its halves are (else finish() names it)
        loader.loaded.update(f for f, parts in fused_parts.items() if parts == {"wk", "weights_proj"})
        accounting.finish(params, loader)
        self.post_load_weights()

    def post_load_weights(self) -> None:
        """Absorb kv_b_proj; SGLang calls this itself for loaders that skip load_weights (dummy)."""
        for layer in self.model.layers[self.start_layer : self.end_layer]:
            layer.self_attn.absorb_kv_b_proj(dequantized_weight(layer.self_attn.kv_b_proj))


EntryClass = [GlmMoeDsaForCausalLM]
