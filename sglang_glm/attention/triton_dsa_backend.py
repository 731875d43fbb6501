"""DSA attention through the plugin's Triton kernels on CUDA (`--attention-backend glm_dsa_triton`).

The CUDA default for GLM-DSA. Per forward it lays the batch out for the kernels as four small
int32 tensors (`TritonDSAMetadata`), built from SGLang's device tensors only: no host sync, no
host-to-device copy. With CUDA graphs SGLang asks for them in static buffers
(`init_cuda_graph_state`, `init_forward_metadata_out_graph`), refilled in place before each replay
of decode, target-verify, draft-extend and the EAGLE draft steps; eager forwards build fresh ones.

The indexer reads the index-K cache a 64-token page at a time through a page table derived from
SGLang's `req_to_token` (so pages must be SGLang's 64-token pages); sparse MLA gathers the KV rows
the top-k positions name. The KV pool (`kv_pool.TorchDSAKVPool`) holds BF16 rows, or with
`--kv-cache-dtype fp8_e4m3` FlashMLA's 656-byte FP8 rows and FP8 index keys with per-token scales.
GLM-5.2 shapes only: 576-dim latent+rope rows, 512-dim values, 32 x 128 indexer heads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from glm_dsa_kernels.batch_layout import BatchLayout, batch_layout, batch_layout_ref
from glm_dsa_kernels.indexer import indexer_logits, indexer_topk
from glm_dsa_kernels.layout import INDEX_PAGE
from glm_dsa_kernels.pool_rows import positions_to_pool_rows
from glm_dsa_kernels.sparse_mla import default_config, sparse_mla_fwd, warp_specialized_available
from glm_dsa_kernels.topk_select import topk_positions
from glm_dsa_kernels.warmup import WarmUpShapes, warm_up
from sglang_glm.attention.backends import TRITON_BACKEND
from sglang_glm.attention.base import DSABackend, MultiStepDraftBackend
from sglang_glm.attention.verify_mask import tree_mask_rows

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Launch shapes whose kernel variants this process has built (Triton keeps them per process):
# the target and draft models and each draft step's backend need them once.
_WARMED_UP: set = set()


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


class TritonDSABackend(DSABackend):
    name = TRITON_BACKEND
    # Layouts come from device tensors only: speculative rounds need no host copy of seq_lens, so
    # SGLang's overlap scheduler skips publishing one (a wait on the last verify) every round.
    needs_cpu_seq_lens = False

    def __init__(self, model_runner: "ModelRunner"):
        self.page = model_runner.page_size
        if self.page not in (1, INDEX_PAGE):
            raise ValueError(
                f"{TRITON_BACKEND} reads the index-K cache in SGLang's {INDEX_PAGE}-token pages (or token "
                f"slots with --page-size 1); the server runs with --page-size {self.page}"
            )
        super().__init__(model_runner)
        self.max_pages = -(-self.req_to_token.shape[1] // self.page)
        # SGLang sizes a speculative round's verify mask by it when no host seq_lens are published
        self.max_context_len = model_runner.model_config.context_len
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        # Hopper runs 64-head sparse MLA on BF16 KV in the warp-specialized Gluon kernel
        self.warp_specialized = warp_specialized_available(self.device)
        self.graph_metadata: Optional[TritonDSAMetadata] = None
        if self.device.type == "cuda":  # the CPU plumbing tests build it with no kernel to run
            self._warm_up_kernels(model_runner)

    def _warm_up_kernels(self, model_runner: "ModelRunner") -> None:
        """Every kernel variant a served batch can select, built before the first request
        (`glm_dsa_kernels.warmup`): eager prefill batches would otherwise build them in a request."""
        from sglang.srt.runtime_context import get_parallel, get_spec

        from sglang_glm.settings import GlmDsaSettings

        pool, hf_config = self.token_to_kv_pool, model_runner.model_config.hf_config
        shapes = WarmUpShapes(
            heads=hf_config.num_attention_heads // get_parallel().attn_tp_size,
            topk=GlmDsaSettings.for_this_process(hf_config).index_topk,
            page=self.page, max_keys=self.max_pages * self.page, num_sms=self.num_sms,
            warp_specialized=self.warp_specialized,
            draft_tokens=(get_spec().speculative_num_draft_tokens or 0) if get_spec().speculative_algorithm else 0,
        )
        full_layer = pool.start_layer + next(i for i, b in enumerate(pool.index_k_buffer) if b is not None)
        key = (shapes, pool.fp8, str(self.device))
        if key in _WARMED_UP:
            return
        t0 = time.perf_counter()
        launches = warm_up(shapes, pool.index_k_pages(full_layer, self.page), pool.mla_rows(full_layer),
                           self.req_to_token)
        torch.cuda.synchronize(self.device)
        _WARMED_UP.add(key)
        logger.info("%s: %d kernel launch configurations built or loaded in %.1f s (%s KV, contexts up to %d keys)",
                    TRITON_BACKEND, launches, time.perf_counter() - t0, "FP8" if pool.fp8 else "BF16",
                    shapes.max_keys)

    # ---- metadata -------------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        self.forward_metadata = self.build_metadata(forward_batch, self._eager_pages(forward_batch))

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, rows: int = 0):
        """Static buffers for CUDA graphs; rows: per-branch slot rows of a tree draft step."""
        def buffer(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=self.device)

        per_request = max(max_num_tokens // max(max_bs, 1), 1)
        self.graph_metadata = TritonDSAMetadata(
            buffer(max_num_tokens), buffer(max_num_tokens), buffer(max_num_tokens),
            buffer(max(max_bs, rows), self.max_pages),
            buffer(rows, self.req_to_token.shape[1]) if rows else self.req_to_token,
            buffer(max_num_tokens, per_request, dtype=torch.bool), buffer(max_num_tokens),
        )

    def init_forward_metadata_out_graph(self, forward_batch: "ForwardBatch", in_capture: bool = False):
        # Capture and replay alike: refill the static buffers the captured kernels read.
        self.forward_metadata = self.build_metadata(forward_batch, self.max_pages, out=self.graph_metadata)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

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

    # ---- indexer --------------------------------------------------------------------------

    def index_topk(self, layer_id, q, weights, sm_scale, topk) -> torch.Tensor:
        meta = self.forward_metadata
        q = q.to(torch.bfloat16)
        # relu(s * x) = s * relu(x) for s > 0: the softmax scale folds into the head weights.
        weights = (weights * sm_scale).float()
        k_cache = self.token_to_kv_pool.index_k_pages(layer_id, self.page)
        if meta.tree_mask is None:
            return indexer_topk(q, weights, k_cache, meta.page_table, meta.query_batch, meta.key_limit, topk)
        # A draft tree: draft slots outside a verify token's ancestry score -inf and never count.
        logits = torch.empty(q.shape[0], meta.page_table.shape[1] * self.page, dtype=torch.float32, device=q.device)
        indexer_logits(q, weights, k_cache, meta.page_table, meta.query_batch, meta.key_limit, logits)
        draft = meta.draft_start[:, None].long() + torch.arange(meta.tree_mask.shape[1], device=q.device)
        draft = draft.clamp(max=logits.shape[1] - 1)
        logits.scatter_(1, draft, logits.gather(1, draft).masked_fill(~meta.tree_mask, float("-inf")))
        positions = topk_positions(logits, meta.key_limit, topk)
        slot = (positions.long() - meta.draft_start[:, None]).clamp(0, meta.tree_mask.shape[1] - 1)
        hidden = (positions >= meta.draft_start[:, None]) & ~meta.tree_mask.gather(1, slot)
        return positions.masked_fill(hidden, -1)

    # ---- sparse MLA -----------------------------------------------------------------------

    def _attend(self, q, layer, topk_indices):
        pool = self.token_to_kv_pool
        meta = self.forward_metadata
        rows = positions_to_pool_rows(topk_indices, meta.slot_table, meta.query_req)
        kv = pool.mla_rows(layer.layer_id)
        heads, dtype = layer.tp_q_head_num, q.dtype
        q = q.view(-1, heads, layer.qk_head_dim).to(torch.bfloat16)
        config = default_config(q.shape[0], heads, rows.shape[1], kv.dtype == torch.uint8, self.num_sms,
                                self.warp_specialized)
        out, _ = sparse_mla_fwd(q, kv, rows, layer.scaling, d_v=layer.v_head_dim, config=config)
        return out.view(-1, heads * layer.v_head_dim).to(dtype)


class TritonDSAMultiStepDraftBackend(MultiStepDraftBackend):
    """EAGLE's draft steps 1 .. num_steps - 1: one backend, and buffers, per step.

    Draft step i (0-based in this loop) of request b, branch j sits after b's prefix and i earlier
    drafts of its branch. A chain reads the request's req_to_token row; a tree (topk > 1, page
    size 1) gives each (request, branch) its own row of KV slots (`TritonDSABackend._branch_slots`).
    """

    step_backend = TritonDSABackend
    needs_cpu_seq_lens = False  # as TritonDSABackend

    def __init__(self, model_runner: "ModelRunner", topk: int, speculative_num_steps: int):
        if topk > 1 and model_runner.page_size != 1:
            raise ValueError(
                f"{TRITON_BACKEND} serves tree drafts (--speculative-eagle-topk {topk}) with page size 1; "
                f"the server runs with --page-size {model_runner.page_size}"
            )
        super().__init__(model_runner, topk, speculative_num_steps)

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        for i, backend in enumerate(self.attn_backends):
            pages = backend._eager_pages(forward_batch, extra_keys=self.speculative_num_steps)
            backend.forward_metadata = backend.build_metadata(
                forward_batch, pages, draft_step=i, branches=self.topk, num_steps=self.speculative_num_steps
            )

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        for backend in self.attn_backends:
            backend.init_cuda_graph_state(max_bs, max_num_tokens, rows=max_num_tokens if self.topk > 1 else 0)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        for i, backend in enumerate(self.attn_backends):
            backend.forward_metadata = backend.build_metadata(
                forward_batch, backend.max_pages, out=backend.graph_metadata, draft_step=i,
                branches=self.topk, num_steps=self.speculative_num_steps,
            )

    def init_forward_metadata_in_graph(self, forward_batch):
        pass  # everything is refilled before replay


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
