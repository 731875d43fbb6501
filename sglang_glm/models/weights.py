"""GLM-DSA weight loading shared by the target and the MTP draft, and checkpoint accounting.

`TensorLoader` puts checkpoint tensors into their parameters (stacked gate/up, routed experts, packed
linears such as q_a + kv_a, plain); a shared expert that SGLang fuses into the routed experts
(`SharedExpertFusion`) is loaded as routed expert `n_routed_experts`; `dequantized_weight` gives kv_b_proj in
floating point for MLA absorption.
Accounting: what is skipped, what must be there.

Shared (IndexCache) layers own no indexer, so their indexer tensors are skipped and reported in one
log line; a full layer missing indexer tensors, any other parameter the checkpoint does not fill, or
tensors for layers the model does not have, stop loading with an error that names them. Under
pipeline parallelism each rank loads its stage [start_layer, end_layer) (and the embedding, final
norm and lm head where it holds them) and counts the rest as other stages' tensors.
"""

from __future__ import annotations

import logging
import re

import torch
from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
from sglang.srt.layers.moe.utils import get_num_fused_shared_experts
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
from torch import nn

from sglang_glm.layer_plan import LayerPlan

logger = logging.getLogger(__name__)

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class CheckpointError(ValueError):
    pass


# (param_name, checkpoint shard name, shard_id) of SGLang's merged dense MLP projection.
STACKED_PARAMS_MAPPING = [
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]


def expert_params_mapping(config, fused_shared_experts: int) -> list:
    """SGLang's FusedMoE mapping from checkpoint expert tensors to its stacked expert parameters (the
    fused shared expert, if any, is expert n_routed_experts)."""
    return FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="gate_proj",
        ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name="up_proj",
        num_experts=config.n_routed_experts + fused_shared_experts,
    )


class SharedExpertFusion:
    """SGLang's rule for running a MoE layer's shared expert inside the routed experts' fused kernel,
    as routed expert `n_routed_experts` with a fixed weight: its loader asks the model class before
    building it (CUDA, 256 or 384 routed experts, one shared, no expert parallelism; or
    --enforce-shared-experts-fusion), and `DeepseekV2MoE` then builds no separate shared expert. Each
    model class names the architecture SGLang compares; the rule is SGLang's own, rebound to it."""

    fused_shared_experts_architecture: str
    shared_experts_fusion_disable_reason = vars(DeepseekV2ForCausalLM)["shared_experts_fusion_disable_reason"]
    num_fusable_shared_experts = vars(DeepseekV2ForCausalLM)["num_fusable_shared_experts"]


FUSED_SHARED_EXPERT_LOG_LINE = "runs each MoE layer's shared expert as routed expert"


def fused_shared_experts(model: str, config) -> int:
    """How many shared experts SGLang's loader fused into the routed experts of the model it is
    building (0 or 1, SharedExpertFusion's rule), logged when it did."""
    fused = get_num_fused_shared_experts()
    if fused:
        logger.info("%s %s %d of SGLang's fused MoE kernel (shared-expert fusion)", model,
                    FUSED_SHARED_EXPERT_LOG_LINE, config.n_routed_experts)
    return fused


def fused_shared_expert_name(name: str, n_routed_experts: int) -> str:
    """A shared expert's checkpoint tensor under the name of the routed expert it runs as when fused."""
    return name.replace(".mlp.shared_experts.", f".mlp.experts.{n_routed_experts}.")


# Linears that read the same input and run as one GEMM over their checkpoint tensors' rows, stacked in this
# order (SGLang's name and mapping: its quantization configs read it to check the parts' precision agree)
PACKED_MODULES = {"fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"]}


class TensorLoader:
    """Puts checkpoint tensors (named as the model's parameters are) into the model's parameters; `model`
    names the model in the error for a tensor it has no parameter for."""

    def __init__(self, params: dict, expert_mapping: list, model: str):
        self.params, self.expert_mapping, self.model = params, expert_mapping, model
        self.waiting: dict[str, dict[str, torch.Tensor]] = {}  # packed parameter -> its parts that arrived
        self.loaded: set[str] = set()

    def load(self, name: str, tensor: torch.Tensor) -> None:
        target = self._load(name, tensor)
        if target is not None:
            self.loaded.add(target)

    def _load(self, name: str, tensor: torch.Tensor) -> str | None:
        """The parameter the tensor went into; None while a packed parameter waits for its other parts."""
        for packed, parts in PACKED_MODULES.items():
            part = next((p for p in parts if f".{p}." in name), None)
            if part is not None:
                return self._load_packed(name.replace(f".{part}.", f".{packed}."), part, parts, tensor, name)
        for param_name, shard_name, shard_id in STACKED_PARAMS_MAPPING:
            if f".{shard_name}." not in name or ".experts." in name:  # routed experts below
                continue
            target = name.replace(shard_name, param_name)
            if target in self.params:
                self.params[target].weight_loader(self.params[target], tensor, shard_id)
                return target
        for param_name, shard_name, expert_id, shard_id in self.expert_mapping:
            if shard_name not in name or "shared_experts" in name:
                continue
            target = name.replace(shard_name, param_name)
            self.params[target].weight_loader(self.params[target], tensor, target, shard_id=shard_id,
                                              expert_id=expert_id)
            return target
        self._check_known(name, name)
        param = self.params[name]
        getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        return name

    def _load_packed(self, target: str, part: str, parts: list[str], tensor: torch.Tensor, name: str) -> str | None:
        self._check_known(target, name)
        arrived = self.waiting.setdefault(target, {})
        arrived[part] = tensor
        if len(arrived) < len(parts):
            return None
        del self.waiting[target]
        param = self.params[target]
        # FP8 block scales stack too: each part's rows fill whole blocks (check_fusable_a_proj)
        getattr(param, "weight_loader", default_weight_loader)(param, torch.cat([arrived[p] for p in parts]))
        return target

    def _check_known(self, target: str, name: str) -> None:
        if target not in self.params:
            raise CheckpointError(
                f"checkpoint tensor {name!r} has no parameter in {self.model}; "
                "the checkpoint does not match this GLM-DSA model"
            )

    def unloaded(self, names) -> list[str]:
        """The checkpoint tensors that the parameters `names` not loaded still need (a packed one's parts
        that did not arrive)."""
        return sorted(n for param in names if param not in self.loaded for n in self._checkpoint_names(param))

    def _checkpoint_names(self, param: str) -> list[str]:
        for packed, parts in PACKED_MODULES.items():
            if f".{packed}." in param:
                arrived = self.waiting.get(param, {})
                return [param.replace(f".{packed}.", f".{p}.") for p in parts if p not in arrived]
        return [param]


def dequantized_weight(linear: nn.Module) -> torch.Tensor:
    """A linear layer's weight in floating point (FP8 block-quantized checkpoints carry scales)."""
    weight = linear.weight
    if weight.dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        return weight.data
    from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant

    scale = getattr(linear, "weight_scale_inv", None)
    block = linear.quant_method.quant_config.weight_block_size
    return block_quant_dequant(weight.data, scale.data, block, torch.get_default_dtype())


_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.(experts\.\d+|shared_experts)\.(gate|up|down)_proj\.(\w+)$")


class ExpertInventory:
    """Every MoE layer's experts, counted by checkpoint name: SGLang stacks a layer's experts into one
    parameter, so a parameter counted as loaded says nothing of a missing expert (or of a fused shared
    expert), which would serve uninitialised weights."""

    def __init__(self, config):
        self.groups = [{f"experts.{e}" for e in range(config.n_routed_experts)}]  # the routed experts
        if getattr(config, "n_shared_experts", 0):
            self.groups.append({"shared_experts"})  # its own group: a quantization may keep it in BF16
        self.seen: dict[int, set[tuple[str, str, str]]] = {}

    def see(self, name: str) -> None:
        match = _EXPERT.match(name)
        if match:
            layer, expert, proj, tensor = match.groups()
            self.seen.setdefault(int(layer), set()).add((expert, proj, tensor))

    def missing(self) -> list[str]:
        """In every layer with experts: each expert's gate/up/down weight, and each other tensor kind
        (FP8 scales) that its group's other experts carry."""
        out = []
        for layer, seen in sorted(self.seen.items()):
            for group in self.groups:
                kinds = {t for e, _, t in seen if e in group} | {"weight"}
                out += [f"model.layers.{layer}.mlp.{expert}.{proj}_proj.{kind}" for expert in sorted(group)
                        for proj in ("gate", "up", "down") for kind in sorted(kinds)
                        if (expert, proj, kind) not in seen]
        return out


# FP8 KV-cache scales of SGLang's RadixAttention: a checkpoint may carry them, else SGLang uses 1.0.
_OPTIONAL = (".attn.k_scale", ".attn.v_scale")
# Tensors outside the decoder layers, and the module that holds each (absent on some PP stages).
_EDGE_TENSORS = ("model.embed_tokens.", "model.norm.", "lm_head.")


class CheckpointAccounting:
    def __init__(self, config, plan: LayerPlan, start_layer: int, end_layer: int, params: dict):
        self.num_layers = config.num_hidden_layers
        # The MTP layer sits at index num_hidden_layers, one per num_nextn_predict_layers.
        self.num_mtp_layers = getattr(config, "num_nextn_predict_layers", 0) or 0
        self.plan = plan
        self.stage = range(start_layer, end_layer)
        self.edges_held = {p for p in _EDGE_TENSORS if any(n.startswith(p) for n in params)}
        self.skipped_indexer = {"tensors": 0, "bytes": 0, "layers": set()}
        self.skipped_mtp = 0
        self.other_stages = 0
        self.experts = ExpertInventory(config)

    def admit(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether the target model loads `name`; skipped tensors are counted."""
        if "rotary_emb.inv_freq" in name:
            return False
        match = _LAYER.match(name)
        if match is None:
            edge = next((p for p in _EDGE_TENSORS if name.startswith(p)), None)
            if edge is not None and edge not in self.edges_held:
                self.other_stages += 1  # another pipeline stage holds this module
                return False
            return True
        layer = int(match.group(1))
        if layer >= self.num_layers + self.num_mtp_layers:
            raise CheckpointError(
                f"checkpoint tensor {name!r} belongs to layer {layer}, but the config has "
                f"num_hidden_layers = {self.num_layers} and num_nextn_predict_layers = "
                f"{self.num_mtp_layers}; use the config.json that came with these weights"
            )
        if layer >= self.num_layers:
            self.skipped_mtp += 1  # the MTP draft model loads these
            return False
        if layer not in self.stage:
            self.other_stages += 1
            return False
        if ".self_attn.indexer." in name and not self.plan.is_full(layer):
            self.skipped_indexer["tensors"] += 1
            self.skipped_indexer["bytes"] += tensor.numel() * tensor.element_size()
            self.skipped_indexer["layers"].add(layer)
            return False
        self.experts.see(name)
        return True

    def finish(self, params: dict, loader: TensorLoader) -> None:
        unloaded = loader.unloaded(params)
        missing = [name for name in unloaded if ".self_attn.indexer." in name]
        if missing:
            layers = sorted({int(_LAYER.match(n).group(1)) for n in missing})
            raise CheckpointError(
                f"full layers {layers} need indexer tensors the checkpoint lacks: {missing}. "
                f"The plan in use is {self.plan.pattern}; a checkpoint carries indexer weights "
                f"only for the layers it was trained to run the indexer on, so serve it with a "
                f"plan that marks layers {layers} shared (--json-model-override-args "
                f"'{{\"index_topk_pattern\": ...}}') or use a checkpoint that has them"
            )
        # any other parameter left at its initial values would serve garbage (an unloaded FP8 block
        # scale stays at float32's minimum)
        other = [name for name in unloaded if not name.endswith(_OPTIONAL)] + self.experts.missing()
        if other:
            layers = sorted({int(m.group(1)) for m in map(_LAYER.match, other) if m})
            raise CheckpointError(
                f"the checkpoint lacks {len(other)} tensors this model needs (layers {layers}), e.g. "
                f"{other[:8]}; use the complete checkpoint, and the config.json that came with it"
            )
        skipped = self.skipped_indexer
        logger.info(
            "IndexCache: skipped %d indexer tensors (%d bytes, FP8 scales included) of %d shared "
            "layers %s; %d MTP-layer tensors left to the draft model; %d tensors of other "
            "pipeline stages",
            skipped["tensors"],
            skipped["bytes"],
            len(skipped["layers"]),
            sorted(skipped["layers"]),
            self.skipped_mtp,
            self.other_stages,
        )
