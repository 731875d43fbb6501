"""DSA attention through the plugin's Triton kernels on CUDA (`--attention-backend glm_dsa_triton`).

Same metadata and KV pool as the plain-PyTorch backend; the indexer top-k and the sparse MLA run
as one launch each over the whole batch instead of a loop over requests. GLM-5.2 shapes only
(576-dim latent+rope rows, 512-dim values). Written, not run inside SGLang (SGLang cannot be
installed on this project's GPU machine); the kernels themselves are checked and timed on an H200
through `benchmarks/kernels/bench_kernels.py`.
"""

from __future__ import annotations

import torch

from glm_dsa_kernels.indexer import indexer_topk
from glm_dsa_kernels.pool_rows import positions_to_pool_rows
from glm_dsa_kernels.sparse_mla import sparse_mla_fwd
from sglang_glm.attention.torch_dsa_backend import TorchDSABackend
from sglang_glm.plugin import TRITON_BACKEND_NAME as BACKEND_NAME
PAGE_SIZE = 64  # the index-K cache is read as [pages, 64, dim]


class TritonDSABackend(TorchDSABackend):
    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        meta = self.forward_metadata
        if meta.tree_mask is not None or meta.key_locs is not None:
            raise NotImplementedError(
                f"{BACKEND_NAME} serves chain drafts only; use --speculative-eagle-topk 1 or "
                "--attention-backend glm_dsa_torch for tree drafts"
            )
        counts = torch.tensor(meta.query_counts, device=self.device)
        batch_index = torch.arange(len(meta.query_counts), device=self.device)
        self.query_batch = torch.repeat_interleave(batch_index, counts).to(torch.int32)
        req_rows = forward_batch.req_pool_indices.long()
        self.query_req = req_rows[self.query_batch.long()].to(torch.int32)
        # Page ids of each request's keys, read through the request-to-token table.
        width = -(-max(meta.seq_lens) // PAGE_SIZE) * PAGE_SIZE
        self.page_table = (self.req_to_token[req_rows, :width:PAGE_SIZE] // PAGE_SIZE).to(torch.int32)
        self.key_limit = (meta.key_limits + 1).to(torch.int32)

    def index_topk(self, layer_id, q, weights, sm_scale, topk):
        index_k = self.token_to_kv_pool.index_k(layer_id)
        k_cache = index_k.view(-1, PAGE_SIZE, index_k.shape[-1])
        # relu(s * x) = s * relu(x) for s > 0: the softmax scale folds into the head weights.
        return indexer_topk(
            q, (weights * sm_scale).float(), k_cache, self.page_table, self.query_batch,
            self.key_limit, topk,
        )

    def _forward(self, q, k, layer, forward_batch, save_kv_cache, k_rope=None, topk_indices=None, **unused):
        if save_kv_cache and k is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)
        rows = positions_to_pool_rows(topk_indices, self.req_to_token, self.query_req)
        kv = self.token_to_kv_pool.get_key_buffer(layer.layer_id).squeeze(1)
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)
        out, _ = sparse_mla_fwd(q, kv, rows, layer.scaling, d_v=layer.v_head_dim)
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)
