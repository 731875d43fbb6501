"""How the Triton DSA backend lays a batch out for its kernels (`TritonDSAMetadata`).

Four small int32 tensors per forward (plus the slot table, and a tree's verify mask), built from
SGLang's device tensors only: no host sync, no host-to-device copy. `TritonDSAMetadataBuilder`
(mixed into `TritonDSABackend`) builds them for decode, target verify, draft-extend and the EAGLE
draft steps (fixed-width layouts, one `glm_dsa_kernels.batch_layout` launch) and for prefill, mixed
and tree-draft batches (ragged layouts, plain tensor ops); with CUDA graphs it writes them into the
backend's static buffers (`_into`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from glm_dsa_kernels.batch_layout import BatchLayout, batch_layout, batch_layout_ref
from sglang_glm.attention.backends import TRITON_BACKEND
from sglang_glm.attention.verify_mask import tree_mask_rows

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclass
class TritonDSAMetadata:
    query_req: torch.Tensor  # [T] row of slot_table holding query t's keys
    query_batch: torch.Tensor  # [T] row of page_table
    key_limit: torch.Tensor  # [T] query t sees key positions [0, key_limit[t]) of its row
    page_table: torch.Tensor  # [B, pages] index-K page of each page of key positions
    slot_table: torch.Tensor  # [R, W] KV slot of each key position: SGLang's req_to_token, or one
    # row per (request, branch) in a tree draft step
    tree_mask: Optional[torch.Tensor] = None  # [T, n] target-verify of a draft tree: visible draft slots
    draft_start: Optional[torch.Tensor] = None  # [T] position of the request's first draft slot


class TritonDSAMetadataBuilder:
    """The layout half of `TritonDSABackend`: the backend supplies SGLang's page size, the
    page-table width of a context and the device, and holds SGLang's `req_to_token`."""

    req_to_token: torch.Tensor  # [R, W] SGLang's KV slot of each key position of each request
    page: int  # SGLang's page size: index-K pages are read this many key positions at a time
    max_pages: int  # pages of a whole req_to_token row
    device: torch.device

    def build_metadata(
        self,
        forward_batch: "ForwardBatch",
        pages: int,
        out: Optional[TritonDSAMetadata] = None,
        draft_step: Optional[int] = None,
        branches: int = 1,
        num_steps: int = 1,
    ) -> TritonDSAMetadata:
        """The batch's layout for the kernels, in `out`'s buffers when given.

        draft_step i: EAGLE draft step i + 1 (steps share one batch): each query sits after its
        request's seq_lens keys and i earlier draft tokens of its branch; with branches > 1 (a
        tree) branch j's drafts live at req_to_token[b, seq_len + j * num_steps + (0..i)].

        A draft-extend graph replay passes SGLang's view of its static buffers: whole-capacity
        req_pool_indices / seq_lens (the first batch_size rows count) and no positions.
        """
        bs, mode = forward_batch.batch_size, forward_batch.forward_mode
        req, seq_lens = forward_batch.req_pool_indices[:bs], forward_batch.seq_lens[:bs]
        window = self._draft_extend_window(forward_batch) if mode.is_draft_extend_v2() else None
        num_tokens = bs * window if window is not None else forward_batch.positions.shape[0]
        if num_tokens and branches == 1 and (mode.is_decode_or_idle() or mode.is_target_verify() or window):
            meta = self._fixed_width_layout(forward_batch, req, seq_lens, num_tokens // bs, pages, out, draft_step, window)
        else:
            meta = self._ragged_layout(forward_batch, req, seq_lens, num_tokens, pages, draft_step, branches, num_steps)
        return meta if out is None else _into(out, meta)

    def _fixed_width_layout(self, forward_batch, req, seq_lens, per_request, pages, out, draft_step, window):
        """A fixed number of query tokens per request (decode, target verify, chain draft steps,
        draft-extend): `glm_dsa_kernels.batch_layout`, one launch straight into `out`'s buffers."""
        tree_mask = None
        if draft_step is not None:
            layout_args = dict(offset=draft_step + 1)
        elif forward_batch.forward_mode.is_target_verify():
            # Verify token j of a request sees the prefix and draft slots 0..j (a tree: its ancestors).
            layout_args = dict(offset=1, ramp=True, draft_start=True)
            if getattr(forward_batch.spec_info, "topk", 1) > 1:
                tree_mask = tree_mask_rows(forward_batch.spec_info.custom_mask, seq_lens, per_request)
        elif window is not None:
            # seq_lens counts the window, so window token j sits at seq_lens - window + j. Rows a graph
            # replay pads (seq_lens = the fill value) see at least key 0, as padded decode rows do.
            layout_args = dict(offset=1 - window, ramp=True)
        else:
            layout_args = dict(positions=forward_batch.positions)
        if self.req_to_token.is_cuda:
            target = out and BatchLayout(out.query_req, out.query_batch, out.key_limit, out.page_table, out.draft_start)
            layout = batch_layout(req, seq_lens, self.req_to_token, per_request, pages, self.page, out=target,
                                  **layout_args)
        else:  # the CPU plumbing tests
            layout = batch_layout_ref(req, seq_lens, self.req_to_token, per_request, pages, self.page, **layout_args)
        return TritonDSAMetadata(layout.query_req, layout.query_batch, layout.key_limit, layout.page_table,
                                 self.req_to_token, tree_mask, layout.draft_start)

    def _ragged_layout(self, forward_batch, req, seq_lens, num_tokens, pages, draft_step, branches, num_steps):
        """Prefill and mixed batches (ragged extend lengths), idle batches and tree draft steps (a slot
        row per branch), in plain tensor ops."""
        bs = forward_batch.batch_size
        token = torch.arange(num_tokens, dtype=torch.int32, device=self.device)
        if num_tokens == 0:
            query_batch = token
        elif draft_step is not None:
            query_batch = token // branches
        else:
            query_batch = torch.repeat_interleave(
                torch.arange(bs, dtype=torch.int32, device=self.device),
                forward_batch.extend_seq_lens, output_size=num_tokens,
            )
        rows = query_batch.long()
        slot_table, query_req = self.req_to_token, req[rows].to(torch.int32)
        if draft_step is not None:
            key_limit = seq_lens[rows] + draft_step + 1
            slot_table = self._branch_slots(seq_lens[rows], req[rows], token % branches, num_steps)
            query_req = query_batch = token
        else:
            key_limit = forward_batch.positions + 1
        # Each page's first slot: gather only those columns (whole req_to_token rows are the context length).
        first_slots = slot_table[:, :: self.page]
        first_slots = first_slots[req.long(), :pages] if slot_table is self.req_to_token else first_slots[:, :pages]
        return TritonDSAMetadata(query_req, query_batch, key_limit.to(torch.int32), first_slots // self.page, slot_table)

    @staticmethod
    def _draft_extend_window(forward_batch) -> int:
        """Tokens per request of a draft-extend pass (the verified window), checked against positions."""
        window = forward_batch.spec_info.num_tokens_per_req
        positions = getattr(forward_batch, "positions", None)  # absent from a graph replay's view
        if positions is not None and positions.shape[0] != forward_batch.batch_size * window:
            raise ValueError(
                f"{TRITON_BACKEND}: draft-extend batch of {positions.shape[0]} tokens for "
                f"{forward_batch.batch_size} requests x {window} draft tokens; the backend lays out "
                "fixed windows only (SGLang's draft-extend front widening is not supported)"
            )
        return window

    def _branch_slots(self, prefix, req, branch, num_steps) -> torch.Tensor:
        """[rows, W] KV slots of each (request, branch) row: the prefix, then that branch's drafts."""
        width = self.req_to_token.shape[1]
        pos = torch.arange(width, device=self.device)
        src = torch.where(pos[None, :] < prefix[:, None], pos[None, :], pos[None, :] + branch[:, None].long() * num_steps)
        return self.req_to_token[req.long()[:, None], src.clamp(max=width - 1)]

    def _eager_pages(self, forward_batch, extra_keys: int = 0) -> int:
        """Page-table width that covers every key of the batch, from the host copy of seq_lens."""
        seq_lens_cpu = forward_batch.seq_lens_cpu
        if seq_lens_cpu is None or seq_lens_cpu.numel() == 0:
            return self.max_pages
        mode = forward_batch.forward_mode
        if mode.is_decode_or_idle() or mode.is_target_verify() or mode.is_draft_extend_v2():
            # Verify and draft tokens may sit after seq_lens: one key per query token covers them.
            extra_keys += forward_batch.positions.shape[0] // max(forward_batch.batch_size, 1)
        keys = int(seq_lens_cpu.max()) + extra_keys
        return min(self.max_pages, -(-keys // self.page))


def laid_out_in_graph(mode) -> bool:
    """The forward modes whose graph runners (decode, target verify, draft-extend, EAGLE draft steps)
    call `init_forward_metadata_in_graph` inside the capture: fixed-shape layouts of static inputs."""
    return mode.is_decode_or_idle() or mode.is_target_verify() or mode.is_draft_extend_v2()


def _into(out: TritonDSAMetadata, meta: TritonDSAMetadata) -> TritonDSAMetadata:
    """meta copied into the static buffers of out (CUDA graphs read fixed addresses)."""
    def put(buffer, value):
        if value is None:
            return None
        if buffer is value or value.data_ptr() == buffer.data_ptr():  # req_to_token, or written in place
            return value
        view = buffer[tuple(slice(0, n) for n in value.shape)]
        view.copy_(value)
        return view

    return TritonDSAMetadata(
        query_req=put(out.query_req, meta.query_req),
        query_batch=put(out.query_batch, meta.query_batch),
        key_limit=put(out.key_limit, meta.key_limit),
        page_table=put(out.page_table, meta.page_table),
        slot_table=put(out.slot_table, meta.slot_table),
        tree_mask=put(out.tree_mask, meta.tree_mask),
        draft_start=put(out.draft_start, meta.draft_start),
    )
