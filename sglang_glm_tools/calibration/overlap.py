"""Cross-layer top-k overlap: Jaccard of the key positions two indexer layers select.

Every layer with indexer weights runs its own indexer (the start plan) over the calibration
batches; for each query token whose visible keys outnumber index_topk (below that every layer
selects every key and the overlap is trivially 1), J(a, b) = |S_a ∩ S_b| / |S_a ∪ S_b| of the two
layers' selected sets, averaged over those tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_glm_tools.calibration.runner import Batch, InProcessModel


@dataclass
class Overlap:
    layers: list[int]
    jaccard: list[list[float]]  # [len(layers)][len(layers)], mean over counted tokens
    tokens: int  # query tokens counted (visible keys > index_topk)
    topk: int

    def adjacent(self) -> list[tuple[int, int, float]]:
        return [
            (self.layers[i], self.layers[i + 1], self.jaccard[i][i + 1])
            for i in range(len(self.layers) - 1)
        ]

    def as_dict(self) -> dict:
        return {
            "layers": self.layers,
            "jaccard": self.jaccard,
            "tokens_counted": self.tokens,
            "index_topk": self.topk,
            "adjacent": [{"a": a, "b": b, "jaccard": j} for a, b, j in self.adjacent()],
        }


def topk_overlap(model: InProcessModel, batches: list[Batch], chunk: int = 1024) -> Overlap:
    plan = model.built_plan
    layers = list(plan.full_layers)
    topk = model.info.index_topk
    n = len(layers)
    jac_sum = torch.zeros(n, n, dtype=torch.float64)
    counted = 0
    for b in batches:
        rows: dict[int, torch.Tensor] = {}
        model.forward_layers(b, plan, on_topk=lambda i, r: rows.__setitem__(i, r.clone()))
        sparse = b.positions >= topk  # position p sees p + 1 keys
        idx = torch.stack([rows[layer][sparse] for layer in layers]).long()  # [n, T, k]
        if idx.shape[1] == 0:
            continue
        width = int(idx.max()) + 1
        for s in range(0, idx.shape[1], chunk):
            part = idx[:, s : s + chunk]
            onehot = torch.zeros(n, part.shape[1], width, dtype=torch.float32)
            onehot.scatter_(2, part.clamp(min=0), (part >= 0).float())
            inter = torch.einsum("atw,btw->abt", onehot, onehot)
            sizes = onehot.sum(-1)  # [n, T]
            union = sizes[:, None, :] + sizes[None, :, :] - inter
            jac_sum += (inter / union.clamp(min=1)).sum(-1).double()
        counted += idx.shape[1]
    jaccard = (jac_sum / max(counted, 1)).tolist()
    return Overlap(layers, [[round(v, 6) for v in row] for row in jaccard], counted, topk)
