"""Checkpoint accounting for GLM-DSA loading: what is skipped, what must be there.

Shared (IndexCache) layers own no indexer, so their indexer tensors are skipped and reported in one
log line; a full layer missing indexer tensors, or tensors for layers the model does not have,
stop loading with an error that names them.
"""

from __future__ import annotations

import logging
import re

import torch

from sglang_glm.layer_plan import LayerPlan

logger = logging.getLogger(__name__)

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class CheckpointError(ValueError):
    pass


class CheckpointAccounting:
    def __init__(self, config, plan: LayerPlan):
        self.num_layers = config.num_hidden_layers
        # The MTP layer sits at index num_hidden_layers, one per num_nextn_predict_layers.
        self.num_mtp_layers = getattr(config, "num_nextn_predict_layers", 0) or 0
        self.plan = plan
        self.loaded: set[str] = set()
        self.skipped_indexer = {"tensors": 0, "bytes": 0, "layers": set()}
        self.skipped_mtp = 0

    def admit(self, name: str, tensor: torch.Tensor) -> bool:
        """Whether the target model loads `name`; skipped tensors are counted."""
        if "rotary_emb.inv_freq" in name:
            return False
        match = _LAYER.match(name)
        if match is None:
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
        if ".self_attn.indexer." in name and not self.plan.is_full(layer):
            self.skipped_indexer["tensors"] += 1
            self.skipped_indexer["bytes"] += tensor.numel() * tensor.element_size()
            self.skipped_indexer["layers"].add(layer)
            return False
        return True

    def finish(self, params: dict) -> None:
        missing = sorted(
            name
            for name in params
            if ".self_attn.indexer." in name and name not in self.loaded
        )
        if missing:
            layers = sorted({int(_LAYER.match(n).group(1)) for n in missing})
            raise CheckpointError(
                f"full layers {layers} need indexer tensors the checkpoint lacks: {missing}. "
                f"The plan in use is {self.plan.pattern}; a checkpoint carries indexer weights "
                f"only for the layers it was trained to run the indexer on, so serve it with a "
                f"plan that marks layers {layers} shared (--json-model-override-args "
                f"'{{\"index_topk_pattern\": ...}}') or use a checkpoint that has them"
            )
        skipped = self.skipped_indexer
        logger.info(
            "IndexCache: skipped %d indexer tensors (%d bytes, FP8 scales included) of %d shared "
            "layers %s; %d MTP-layer tensors left to the draft model",
            skipped["tensors"],
            skipped["bytes"],
            len(skipped["layers"]),
            sorted(skipped["layers"]),
            self.skipped_mtp,
        )
