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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from glm_dsa_kernels.indexer import indexer_topk
from glm_dsa_kernels.pool_rows import positions_to_pool_rows
from glm_dsa_kernels.sparse_mla import default_config, sparse_mla_fwd
from sglang_glm.plugin import TRITON_BACKEND_NAME as BACKEND_NAME

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

PAGE_SIZE = 64  # the indexer reads the index-K cache as [pages, 64, dim]


@dataclass
class TritonDSAMetadata:
    query_req: torch.Tensor  # [T] req_to_token row of each query token
    query_batch: torch.Tensor  # [T] page-table row of each query token
    key_limit: torch.Tensor  # [T] query t sees its request's key positions [0, key_limit[t])
    page_table: torch.Tensor  # [B, pages] index-K page of each 64 key positions of request b


class TritonDSABackend(AttentionBackend):
    def __init__(self, model_runner: "ModelRunner"):
        super().__init__()
        if model_runner.page_size != PAGE_SIZE:
            raise ValueError(
                f"{BACKEND_NAME} reads the index-K cache in SGLang's {PAGE_SIZE}-token pages; the "
                f"server runs with --page-size {model_runner.page_size}. Start it with --page-size "
                f"{PAGE_SIZE} (SGLang's default for DSA models)."
            )
        self.device = model_runner.device
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.max_pages = -(-self.req_to_token.shape[1] // PAGE_SIZE)
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.forward_metadata: Optional[TritonDSAMetadata] = None
        self.graph_metadata: Optional[TritonDSAMetadata] = None

    # ---- metadata -------------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        self.forward_metadata = self.build_metadata(forward_batch, self._eager_pages(forward_batch))

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        def buffer(*shape):
            return torch.zeros(shape, dtype=torch.int32, device=self.device)

        self.graph_metadata = TritonDSAMetadata(
            buffer(max_num_tokens), buffer(max_num_tokens), buffer(max_num_tokens),
            buffer(max_bs, self.max_pages),
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
    ) -> TritonDSAMetadata:
        """The batch's layout for the kernels, in `out`'s buffers when given.

        draft_step i: EAGLE draft step i + 1 (steps share one batch); its queries sit after the
        request's seq_lens keys and i earlier draft tokens.
        """
        num_tokens, bs = forward_batch.positions.shape[0], forward_batch.batch_size
        req = forward_batch.req_pool_indices
        mode = forward_batch.forward_mode
        if num_tokens == 0:
            query_batch = torch.zeros(0, dtype=torch.int32, device=self.device)
        elif mode.is_decode_or_idle() or mode.is_target_verify() or mode.is_draft_extend_v2():
            # A fixed number of query tokens per request (1, eagle top-k, or the draft tokens).
            query_batch = torch.arange(num_tokens, dtype=torch.int32, device=self.device) // (num_tokens // bs)
        else:
            query_batch = torch.repeat_interleave(
                torch.arange(bs, dtype=torch.int32, device=self.device),
                forward_batch.extend_seq_lens, output_size=num_tokens,
            )
        rows = query_batch.long()
        if draft_step is None:
            key_limit = forward_batch.positions + 1
        else:
            key_limit = forward_batch.seq_lens[rows] + draft_step + 1
        meta = TritonDSAMetadata(
            query_req=req[rows].to(torch.int32),
            query_batch=query_batch,
            key_limit=key_limit.to(torch.int32),
            page_table=self.req_to_token[req.long(), ::PAGE_SIZE][:, :pages] // PAGE_SIZE,
        )
        if out is None:
            return meta
        views = TritonDSAMetadata(
            out.query_req[:num_tokens], out.query_batch[:num_tokens], out.key_limit[:num_tokens],
            out.page_table[:bs, :pages],
        )
        for dst, src in zip(vars(views).values(), vars(meta).values()):
            dst.copy_(src)
        return views

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
        return min(self.max_pages, -(-keys // PAGE_SIZE))

    # ---- indexer --------------------------------------------------------------------------

    def store_index_k(self, layer_id: int, index_k: torch.Tensor, forward_batch: "ForwardBatch"):
        self.token_to_kv_pool.set_index_k(layer_id, forward_batch.out_cache_loc, index_k)

    def index_topk(self, layer_id, q, weights, sm_scale, topk) -> torch.Tensor:
        meta = self.forward_metadata
        # relu(s * x) = s * relu(x) for s > 0: the softmax scale folds into the head weights.
        return indexer_topk(
            q.to(torch.bfloat16), (weights * sm_scale).float(), self.token_to_kv_pool.index_k_pages(layer_id),
            meta.page_table, meta.query_batch, meta.key_limit, topk,
        )

    # ---- sparse MLA -----------------------------------------------------------------------

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._forward(q, k, layer, forward_batch, save_kv_cache, **kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._forward(q, k, layer, forward_batch, save_kv_cache, **kwargs)

    def _forward(self, q, k, layer, forward_batch, save_kv_cache, k_rope=None, topk_indices=None, **unused):
        if topk_indices is None:
            raise ValueError(
                f"{BACKEND_NAME} is a sparse-attention backend: layer {layer.layer_id} must pass "
                "topk_indices from the top-k buffer"
            )
        pool = self.token_to_kv_pool
        if save_kv_cache and k is not None:
            pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k.to(pool.dtype_for_writes),
                                   k_rope.to(pool.dtype_for_writes))
        rows = positions_to_pool_rows(topk_indices, self.req_to_token, self.forward_metadata.query_req)
        kv = pool.mla_rows(layer.layer_id)
        heads, dtype = layer.tp_q_head_num, q.dtype
        q = q.view(-1, heads, layer.qk_head_dim).to(torch.bfloat16)
        config = default_config(q.shape[0], heads, rows.shape[1], kv.dtype == torch.uint8, self.num_sms)
        out, _ = sparse_mla_fwd(q, kv, rows, layer.scaling, d_v=layer.v_head_dim, config=config)
        return out.view(-1, heads * layer.v_head_dim).to(dtype)


class TritonDSAMultiStepDraftBackend:
    """EAGLE's draft steps 1 .. num_steps - 1 (chain drafts): one backend, and buffers, per step."""

    def __init__(self, model_runner: "ModelRunner", topk: int, speculative_num_steps: int):
        if topk != 1:
            raise ValueError(
                f"{BACKEND_NAME} drafts chains (--speculative-eagle-topk 1); got "
                f"--speculative-eagle-topk {topk}"
            )
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = [TritonDSABackend(model_runner) for _ in range(max(speculative_num_steps - 1, 0))]

    def init_forward_metadata(self, forward_batch: "ForwardBatch"):
        for i, backend in enumerate(self.attn_backends):
            pages = backend._eager_pages(forward_batch, extra_keys=self.speculative_num_steps)
            backend.forward_metadata = backend.build_metadata(forward_batch, pages, draft_step=i)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        for backend in self.attn_backends:
            backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        for i, backend in enumerate(self.attn_backends):
            backend.forward_metadata = backend.build_metadata(
                forward_batch, backend.max_pages, out=backend.graph_metadata, draft_step=i
            )

    def init_forward_metadata_in_graph(self, forward_batch):
        pass  # everything is refilled before replay
