"""DSA attention through the plugin's Triton kernels on CUDA (`--attention-backend glm_dsa_triton`).

The CUDA default for GLM-DSA. Per forward it lays the batch out for the kernels as four small
int32 tensors (`TritonDSAMetadata`, built in `triton_metadata.py`) from SGLang's device tensors
only: no host sync, no host-to-device copy. With CUDA graphs they live in static buffers
(`init_cuda_graph_state`) and the layout launch is recorded into the graphs of decode,
target-verify, draft-extend and the EAGLE draft steps (`init_forward_metadata_in_graph`, SGLang's
hook for graph-recordable metadata): a replay lays its batch out on the GPU, with no host work
from the plugin. Eager forwards build fresh ones.

The indexer reads the index-K cache a 64-token page at a time through a page table derived from
SGLang's `req_to_token` (so pages must be SGLang's 64-token pages); sparse MLA gathers the KV rows
the top-k positions name. The KV pool (`kv_pool.TorchDSAKVPool`) holds BF16 rows, or with
`--kv-cache-dtype fp8_e4m3` FlashMLA's 656-byte FP8 rows and FP8 index keys with per-token scales.
Where sgl-flash-mla is installed on an SM90 GPU (SGLANG_GLM_FLASHMLA=0 turns it off), sparse MLA runs
FlashMLA's kernels for the shapes they were measured faster on (`flashmla.py`: FP8 KV at 65-512 query rows with
64 heads and 1-512 with 128, BF16 KV from 256), the Triton kernel otherwise; a line at start-up says which.
GLM-5.2 shapes only: 576-dim latent+rope rows, 512-dim values, 32 x 128 indexer heads.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Optional

import torch

from glm_dsa_kernels.indexer import indexer_logits, indexer_topk
from glm_dsa_kernels.layout import INDEX_PAGE
from glm_dsa_kernels.pool_rows import positions_to_pool_rows
from glm_dsa_kernels.sparse_mla import default_config, sparse_mla_fwd, warp_specialized_available
from glm_dsa_kernels.topk_select import topk_positions
from glm_dsa_kernels.warmup import WarmUpShapes, warm_up
from sglang_glm.attention.backends import TRITON_BACKEND
from sglang_glm.attention.base import DSABackend, MultiStepDraftBackend
from sglang_glm.attention.flashmla import asked_for, flashmla_on
from sglang_glm.attention.triton_metadata import TritonDSAMetadata, TritonDSAMetadataBuilder, laid_out_in_graph

if TYPE_CHECKING:
    from sglang.srt.layers.attention.verify_mask import VerifyMask
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# Launch shapes whose kernel variants this process has built (Triton keeps them per process):
# the target and draft models and each draft step's backend need them once.
_WARMED_UP: set = set()
# Start-up lines already logged: every backend of the process would repeat them.
_LOGGED: set = set()


class TritonDSABackend(TritonDSAMetadataBuilder, DSABackend):
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
        self.is_draft_runner = model_runner.is_draft_worker
        spec = model_runner.server_args
        # a tree's verify reads the mask SGLang fills (tree_mask_rows), a chain's reads none
        chain = bool(spec.speculative_algorithm) and spec.speculative_eagle_topk == 1
        self.chain_draft_tokens = spec.speculative_num_draft_tokens if chain else None
        self._verify_mask: Optional[VerifyMask] = None
        self.flashmla = flashmla_on(self.device)
        if self.device.type == "cuda":  # the CPU plumbing tests build it with no kernel to run
            shapes = self._served_shapes(model_runner)
            self._warm_up_kernels(shapes)
            self._prepare_flashmla(shapes)

    def _served_shapes(self, model_runner: "ModelRunner") -> WarmUpShapes:
        """The launch shapes of this server's batches (heads per rank, top-k, contexts, draft tokens)."""
        from sglang.srt.runtime_context import get_parallel, get_spec

        from sglang_glm.settings import GlmDsaSettings

        hf_config = model_runner.model_config.hf_config
        return WarmUpShapes(
            heads=hf_config.num_attention_heads // get_parallel().attn_tp_size,
            topk=GlmDsaSettings.for_this_process(hf_config).index_topk,
            page=self.page, max_keys=self.max_pages * self.page, num_sms=self.num_sms,
            warp_specialized=self.warp_specialized,
            draft_tokens=(get_spec().speculative_num_draft_tokens or 0) if get_spec().speculative_algorithm else 0,
            rope_interleave=getattr(hf_config, "rope_interleave", True),
            index_rope_interleave=getattr(hf_config, "indexer_rope_interleave", True),
            dtype=model_runner.dtype,
        )

    def _warm_up_kernels(self, shapes: WarmUpShapes) -> None:
        """Every kernel variant a served batch can select, built before the first request
        (`glm_dsa_kernels.warmup`): eager prefill batches would otherwise build them in a request."""
        pool = self.token_to_kv_pool
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

    def _prepare_flashmla(self, shapes: WarmUpShapes) -> None:
        """Says once which kernel serves sparse MLA, and makes FlashMLA's FP8 plans before any capture."""
        fp8 = self.token_to_kv_pool.fp8
        line = self.flashmla.describe(shapes.heads, fp8)
        if line not in _LOGGED:
            _LOGGED.add(line)
            # asked for and not served is worth a warning: the user expects FlashMLA's speed
            (logger.warning if asked_for() and not self.flashmla.available else logger.info)("%s", line)
        if self.flashmla.available and fp8:
            self.flashmla.plan_decode(shapes.heads, shapes.topk)

    # ---- metadata -------------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        self.forward_metadata = self.build_metadata(forward_batch, self._eager_pages(forward_batch))

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, rows: int = 0):
        """Static buffers for CUDA graphs; rows: per-branch slot rows of a tree draft step."""
        from sglang.srt.layers.attention.verify_mask import maybe_create_verify_mask

        def buffer(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=self.device)

        per_request = max(max_num_tokens // max(max_bs, 1), 1)
        self.graph_metadata = TritonDSAMetadata(
            buffer(max_num_tokens), buffer(max_num_tokens), buffer(max_num_tokens),
            buffer(max(max_bs, rows), self.max_pages),
            buffer(rows, self.req_to_token.shape[1]) if rows else self.req_to_token,
            buffer(max_num_tokens, per_request, dtype=torch.bool), buffer(max_num_tokens),
        )
        # unread (QLEN_ONLY), it spares SGLang a full custom mask each round and opens its chain-tree path
        self._verify_mask = maybe_create_verify_mask(
            is_draft_runner=self.is_draft_runner, skip_prefill=False, max_bs=max_bs,
            max_context_len=self.max_context_len, num_draft_tokens=self.chain_draft_tokens, device=self.device,
            is_read=False,
        )

    @property
    def verify_mask(self) -> Optional[VerifyMask]:
        return self._verify_mask

    def init_forward_metadata_out_graph(self, forward_batch: "ForwardBatch", in_capture: bool = False):
        # Before a graph's capture and each of its replays, on the host. The graph-served modes are
        # laid out inside their graphs instead (below), so a replay costs the host nothing here.
        if not laid_out_in_graph(forward_batch.forward_mode):
            self.forward_metadata = self.build_metadata(forward_batch, self.max_pages, out=self.graph_metadata)

    def init_forward_metadata_in_graph(self, forward_batch: "ForwardBatch"):
        # Recorded into the captured graph: the layout kernel reads the runner's static
        # req_pool_indices / seq_lens and refills the static buffers at every replay.
        if laid_out_in_graph(forward_batch.forward_mode):
            self.forward_metadata = self.build_metadata(forward_batch, self.max_pages, out=self.graph_metadata)

    def draft_extend_metadata_captured_in_graph(self) -> bool:
        return True

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

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
        kv_fp8 = kv.dtype == torch.uint8
        if self.flashmla.available and self.flashmla.serves(q.shape[0], heads, kv_fp8):
            out = self.flashmla.attend(q, kv, rows, layer.scaling, layer.v_head_dim)
        else:
            config = default_config(q.shape[0], heads, rows.shape[1], kv_fp8, self.num_sms, self.warp_specialized)
            out, _ = sparse_mla_fwd(q, kv, rows, layer.scaling, d_v=layer.v_head_dim, config=config)
        return out.view(-1, heads * layer.v_head_dim).to(dtype)


class TritonDSAMultiStepDraftBackend(MultiStepDraftBackend):
    """EAGLE's draft steps 1 .. num_steps - 1: one backend, and buffers, per step.

    Draft step i (0-based in this loop) of request b, branch j sits after b's prefix and i earlier
    drafts of its branch. A chain reads the request's req_to_token row; a tree (topk > 1, page
    size 1) gives each (request, branch) its own row of KV slots (`TritonDSAMetadataBuilder._branch_slots`).
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
        pass  # the draft steps are laid out inside their graph

    def init_forward_metadata_in_graph(self, forward_batch):
        for i, backend in enumerate(self.attn_backends):
            backend.forward_metadata = backend.build_metadata(
                forward_batch, backend.max_pages, out=backend.graph_metadata, draft_step=i,
                branches=self.topk, num_steps=self.speculative_num_steps,
            )
