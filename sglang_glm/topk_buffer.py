"""The top-k buffer: one object that carries indexer results from full layers to every layer.

A full layer's indexer writes the top-k key positions of each query token of the batch; every
layer (full or shared) passes the buffer into its sparse-MLA attention call, which reads the rows
the most recent full layer wrote. Positions are per request (0 = the request's first token),
-1 marks an unused slot (fewer visible keys than top-k).
"""

from __future__ import annotations

import torch


class TopkBuffer:
    def __init__(self, topk: int, device: torch.device | str = "cpu"):
        self.topk = topk
        self.device = torch.device(device)
        self._storage = torch.empty((0, topk), dtype=torch.int32, device=self.device)
        self.num_tokens = 0
        # Layer id of the full layer whose rows the buffer holds; None before the first write.
        self.source_layer: int | None = None

    def begin_forward(self, num_tokens: int) -> None:
        """Size the buffer for a batch; the rows become unreadable until a full layer writes."""
        if num_tokens > self._storage.shape[0]:
            self._storage = torch.empty(
                (max(num_tokens, 2 * self._storage.shape[0]), self.topk),
                dtype=torch.int32,
                device=self.device,
            )
        self.num_tokens = num_tokens
        self.source_layer = None

    def write(self, layer_id: int, indices: torch.Tensor) -> None:
        if indices.shape != (self.num_tokens, self.topk):
            raise ValueError(
                f"layer {layer_id} wrote top-k of shape {tuple(indices.shape)}; the buffer holds "
                f"({self.num_tokens}, {self.topk}) for this batch"
            )
        self._storage[: self.num_tokens].copy_(indices)
        self.source_layer = layer_id

    def read(self, layer_id: int) -> torch.Tensor:
        if self.source_layer is None or self.source_layer > layer_id:
            raise RuntimeError(
                f"layer {layer_id} reads top-k before any full layer at or before it wrote them"
            )
        return self._storage[: self.num_tokens]
