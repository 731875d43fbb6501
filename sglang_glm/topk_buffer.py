"""The top-k buffer: one object that carries indexer results from full layers to every layer.

A full layer's indexer writes the top-k key positions of each query token of the batch; every
layer (full or shared) passes the buffer into its sparse-MLA attention call, which reads the rows
the most recent full layer wrote. Positions are per request (0 = the request's first token),
-1 marks an unused slot (fewer visible keys than top-k).

The storage is allocated once, on the model's device, for the most tokens SGLang can put in one
forward (`max_forward_tokens`), so CUDA-graph capture and replay read and write fixed addresses
and a forward never allocates or copies to the host.
"""

from __future__ import annotations

import torch


class TopkBuffer:
    def __init__(self, topk: int):
        self.topk = topk
        self._storage: torch.Tensor | None = None
        self.num_tokens = 0
        # Layer id of the full layer whose rows the buffer holds; None before the first write.
        self.source_layer: int | None = None

    @property
    def capacity(self) -> int:
        return 0 if self._storage is None else self._storage.shape[0]

    def allocate(self, max_tokens: int, device: torch.device | str) -> None:
        """Once, before the first forward (the plugin does it when SGLang builds the runner's backends)."""
        self._storage = torch.full((max_tokens, self.topk), -1, dtype=torch.int32, device=device)

    def begin_forward(self, num_tokens: int) -> None:
        """Start a batch of num_tokens query tokens; the rows become unreadable until a full layer writes."""
        if num_tokens > self.capacity:
            raise RuntimeError(
                f"a forward of {num_tokens} tokens does not fit the top-k buffer "
                f"({self.capacity} rows{'' if self._storage is not None else ', never allocated'}); "
                "it is sized when SGLang initialises the model runner's attention backends "
                "(sglang_glm.hooks.memory) from the prefill budget and the request slots"
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

    def claim(self, layer_id: int) -> torch.Tensor:
        """The batch's rows for a full layer to fill in place (a prefill graph's indexer break writes
        them between captured segments), from then on the rows every later layer reads."""
        self.source_layer = layer_id
        return self._storage[: self.num_tokens]

    def read(self, layer_id: int) -> torch.Tensor:
        if self.source_layer is None or self.source_layer > layer_id:
            raise RuntimeError(
                f"layer {layer_id} reads top-k before any full layer at or before it wrote them"
            )
        return self._storage[: self.num_tokens]

    def rows(self, num_tokens: int) -> torch.Tensor:
        """The first num_tokens rows as the last forward left them, for a caller around a replayed
        prefill graph (a replay runs none of the Python that sets num_tokens and source_layer)."""
        return self._storage[:num_tokens]


def max_forward_tokens(model_runner) -> int:
    """Most query tokens SGLang 0.5.23 puts into one forward of this model runner.

    A prefill batch holds at most the prefill token budget, or one chunk, or (chunking off) one
    whole context, or under prefill CUDA graphs the largest captured token bucket; a mixed batch adds one decode token per request slot; decode, target-verify
    and EAGLE draft passes hold at most (draft tokens | eagle top-k) tokens per request slot.
    """
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec, get_schedule, get_server_args

    schedule, args = get_schedule(), get_server_args()
    chunk = schedule.chunked_prefill_size or 0
    prefill = max(schedule.max_prefill_tokens or 0, chunk if chunk > 0 else model_runner.model_config.context_len)
    graphs = get_exec().graph.cuda_graph_config.prefill
    if graphs.backend != Backend.DISABLED:  # a captured prefill bucket may exceed the prefill budget
        prefill = max(prefill, graphs.max_bs or 0, *(graphs.bs or [0]))
    per_request = max(args.speculative_num_draft_tokens or 1, args.speculative_eagle_topk or 1)
    return prefill + model_runner.req_to_token_pool.size * per_request
