"""DSA attention in plain PyTorch for SGLang's paged KV: indexer top-k and sparse MLA.

Registered as the attention backend `glm_dsa_torch`. It serves every forward mode SGLang runs on
the CPU path: prefill with and without a cached prefix, chunked prefill, decode, mixed batches,
and EAGLE's draft-extend / multi-step draft / target-verify passes.

Positions are per request: the indexer returns, for each query token, the positions of the keys
it selected; sparse MLA maps them to KV-pool rows through SGLang's `req_to_token` table.
Tie rule of the top-k: higher score first, equal scores -> lower position first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from sglang_glm.attention.backends import TORCH_BACKEND
from sglang_glm.attention.base import DSABackend, MultiStepDraftBackend
from sglang_glm.attention.verify_mask import tree_mask_rows

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

# Upper bound on elements of one gathered [queries, top-k, dim] block, to bound CPU memory.
_MAX_BLOCK_ELEMS = 1 << 25


@dataclass
class DSAForwardMetadata:
    """Per-request layout of the batch's query tokens and visible keys."""

    req_pool_indices: list[int]
    seq_lens: list[int]  # keys each request has after this forward's tokens are written
    query_starts: list[int]  # first query token of each request in the flattened batch
    query_counts: list[int]
    # Largest key position each query token may see (its own position; tree-masked verify
    # tokens additionally use `tree_mask`).
    key_limits: torch.Tensor
    # Target-verify with a draft tree: [num_tokens, draft_tokens] bool, True = visible draft.
    tree_mask: Optional[torch.Tensor] = None
    # KV-pool rows of each request's keys (index = key position). None: the request's
    # req_to_token row. EAGLE's tree draft steps give each (request, branch) its own row: the
    # request's prefix followed by that branch's draft slots.
    key_locs: Optional[list[torch.Tensor]] = None

    def keys_of(self, req_to_token: torch.Tensor, group: int) -> torch.Tensor:
        if self.key_locs is not None:
            return self.key_locs[group]
        return req_to_token[self.req_pool_indices[group], : self.seq_lens[group]]

    def visible(self, group: int, s: int, e: int, key_pos: torch.Tensor) -> torch.Tensor:
        """[e - s, keys] bool: which keys query tokens s..e-1 of `group` may attend to."""
        visible = key_pos[None, :] <= self.key_limits[s:e, None]
        if self.tree_mask is not None:
            # Verify tokens: the whole prefix, then only their tree ancestors and themselves.
            prefix = self.seq_lens[group] - self.query_counts[group]
            visible[:, prefix:] = self.tree_mask[s:e]
        return visible


class TorchDSABackend(DSABackend):
    name = TORCH_BACKEND

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError(
            f"{TORCH_BACKEND} lays out every batch on the host and runs eagerly: start the server "
            "with --disable-cuda-graph, or use --attention-backend glm_dsa_triton (CUDA graphs)"
        )

    # ---- metadata -------------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        mode = forward_batch.forward_mode
        bs = forward_batch.batch_size
        seq_lens = forward_batch.seq_lens.tolist()
        if mode.is_decode_or_idle():
            counts = [1] * bs
        elif mode.is_target_verify():
            counts = [forward_batch.spec_info.draft_token_num] * bs
        else:
            counts = list(forward_batch.extend_seq_lens_cpu)
        if mode.is_target_verify():
            # Verify tokens are written after the prefix: seq_lens counts the prefix only.
            seq_lens = [s + c for s, c in zip(seq_lens, counts)]
        starts = [0]
        for c in counts[:-1]:
            starts.append(starts[-1] + c)
        self.forward_metadata = DSAForwardMetadata(
            req_pool_indices=forward_batch.req_pool_indices.tolist(),
            seq_lens=seq_lens,
            query_starts=starts,
            query_counts=counts,
            key_limits=forward_batch.positions.to(torch.int64),
            tree_mask=_verify_tree_mask(forward_batch) if mode.is_target_verify() else None,
        )

    # ---- indexer --------------------------------------------------------------------------

    def index_topk(
        self,
        layer_id: int,
        q: torch.Tensor,  # [T, index_heads, index_dim]
        weights: torch.Tensor,  # [T, index_heads], already scaled by index_heads ** -0.5
        sm_scale: float,
        topk: int,
    ) -> torch.Tensor:
        """Top-k key positions per query token, -1 past the visible keys: [T, topk] int32."""
        meta = self.forward_metadata
        out = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=q.device)
        for group, (seq_len, start, count) in enumerate(
            zip(meta.seq_lens, meta.query_starts, meta.query_counts)
        ):
            keys = self.token_to_kv_pool.index_k_rows(layer_id, meta.keys_of(self.req_to_token, group))  # [L, D]
            key_pos = torch.arange(seq_len, device=q.device)
            step = max(1, _MAX_BLOCK_ELEMS // max(1, seq_len * q.shape[1]))
            for s in range(start, start + count, step):
                e = min(s + step, start + count)
                scores = torch.relu(torch.matmul(q[s:e].float(), keys.T) * sm_scale)  # [n,H,L]
                logits = torch.matmul(weights[s:e].float().unsqueeze(-2), scores).squeeze(-2)
                visible = meta.visible(group, s, e, key_pos)
                logits = logits.masked_fill(~visible, float("-inf"))
                k = min(topk, seq_len)
                # Stable descending sort: among equal scores the lower position comes first.
                order = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
                chosen_visible = torch.gather(visible, 1, order)
                out[s:e, :k] = torch.where(chosen_visible, order, -1).to(torch.int32)
        return out

    # ---- sparse MLA -----------------------------------------------------------------------

    def _attend(self, q: torch.Tensor, layer: "RadixAttention", topk_indices: torch.Tensor) -> torch.Tensor:
        pool = self.token_to_kv_pool
        num_heads, dim, v_dim = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        q = q.view(-1, num_heads, dim)
        out = q.new_empty((q.shape[0], num_heads, v_dim))
        meta = self.forward_metadata
        for group, (start, count) in enumerate(zip(meta.query_starts, meta.query_counts)):
            # The cache may be narrower than the model (bfloat16 on GPUs, FP8 rows dequantized).
            req_kv = pool.latent_rows(layer.layer_id, meta.keys_of(self.req_to_token, group), q.dtype)  # [L, dim]
            step = max(1, _MAX_BLOCK_ELEMS // (topk_indices.shape[1] * dim))
            for s in range(start, start + count, step):
                e = min(s + step, start + count)
                idx = topk_indices[s:e].long()
                valid = idx >= 0
                rows = req_kv[idx.clamp(min=0)]  # [n, topk, dim]
                scores = torch.einsum("nhd,nkd->nhk", q[s:e], rows) * layer.scaling
                scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
                probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
                out[s:e] = torch.einsum("nhk,nkd->nhd", probs, rows[..., :v_dim])
        return out.view(-1, num_heads * v_dim)


def _verify_tree_mask(forward_batch: "ForwardBatch") -> Optional[torch.Tensor]:
    """[num_tokens, draft_tokens] bool from EAGLE's verify mask, None for a chain (topk 1)."""
    spec = forward_batch.spec_info
    mask = getattr(spec, "custom_mask", None)
    if getattr(spec, "topk", 1) == 1 or mask is None or mask.numel() == 0:
        return None  # a chain: causal order over the draft slots is exactly the tree
    return tree_mask_rows(mask, forward_batch.seq_lens, spec.draft_token_num)


class TorchDSAMultiStepDraftBackend(MultiStepDraftBackend):
    """EAGLE's multi-step draft decode: one backend per draft step (steps 1 .. num_steps - 1).

    Draft step i (0-based within this loop) of request b, branch j sits at position
    seq_len_b + i and sees the request's prefix plus its branch's draft slots 0..i, which SGLang
    allocated at req_to_token[b, seq_len_b + j * num_steps + (0..i)]. For a chain (topk 1) that is
    simply the request's req_to_token row; tree branches get their own key rows.
    """

    step_backend = TorchDSABackend

    def __init__(self, model_runner: "ModelRunner", topk: int, speculative_num_steps: int):
        super().__init__(model_runner, topk, speculative_num_steps)
        self.req_to_token = model_runner.req_to_token_pool.req_to_token

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        topk, num_steps = self.topk, self.speculative_num_steps
        rpis = forward_batch.req_pool_indices.tolist()
        prefix_lens = forward_batch.seq_lens.tolist()
        rows = len(rpis) * topk
        for i, backend in enumerate(self.attn_backends):
            key_locs = []
            for rpi, prefix in zip(rpis, prefix_lens):
                row = self.req_to_token[rpi]
                for j in range(topk):
                    if topk == 1:
                        key_locs.append(row[: prefix + i + 1])
                    else:
                        first = prefix + j * num_steps
                        key_locs.append(torch.cat([row[:prefix], row[first : first + i + 1]]))
            limits = [p + i for p in prefix_lens for _ in range(topk)]
            backend.forward_metadata = DSAForwardMetadata(
                req_pool_indices=[r for r in rpis for _ in range(topk)],
                seq_lens=[len(k) for k in key_locs],
                query_starts=list(range(rows)),
                query_counts=[1] * rows,
                key_limits=torch.tensor(limits, dtype=torch.int64, device=self.req_to_token.device),
                key_locs=key_locs,
            )
