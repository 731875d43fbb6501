"""GLM-DSA attention of one layer: absorbed MLA over the top-k keys the DSA indexer picks.

Reads top to bottom: the lightning indexer of a full layer (`GlmDsaIndexer`, which asks the
attention backend through its `DsaIndexBackend` contract), `build_indexer` (it, or SGLang's own
indexer under SGLang's `dsa` backend), the absorbed-MLA projections around attention
(`absorbed_query_and_key`, `heads_output`), and `GlmDsaAttention`, which runs the indexer
when the layer is full, writes its top-k into the `TopkBuffer` and attends over the rows the buffer
holds.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from sglang.srt.layers.quantization.base_config import QuantizationConfig
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope
from sglang.srt.layers.rotary_embedding.rope_variant import DeepseekScalingRotaryEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.layers.attention.graph_utils import attention_query_tokens
from sglang.srt.model_executor.forward_context import get_attn_backend
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (
    eager_on_graph,
    is_in_breakable_cuda_graph,
)
from sglang.srt.model_executor.runner_utils.capture_mode import get_is_capture_mode
from sglang.srt.model_executor.runner_utils.forward_batch import get_forward_batch
from sglang.srt.model_executor.runner_utils.prefill_graph import is_in_prefill_graph_scope
from sglang.srt.runtime_context import get_parallel
from sglang.srt.utils import add_prefix, is_cuda

from glm_dsa_kernels.rope import rope, rope_ref
from sglang_glm.attention.backends import DsaIndexBackend
from sglang_glm.settings import SGLANG_INDEXER, GlmDsaSettings
from sglang_glm.topk_buffer import TopkBuffer


def in_breakable_prefill_graph(forward_batch: ForwardBatch) -> bool:
    """A prefill forward SGLang captures or replays as a breakable CUDA graph (its RadixAttention
    then runs eagerly between segments, on the real rows of a padded batch)."""
    return is_in_breakable_cuda_graph() and is_in_prefill_graph_scope() and forward_batch.forward_mode.is_extend()


def side_stream() -> Optional[torch.cuda.Stream]:
    """A model's second CUDA stream, for work that overlaps within a captured graph (None off CUDA)."""
    return torch.cuda.Stream() if is_cuda() else None


def overlapped(side: Optional[torch.cuda.Stream], main_work, side_work):
    """(main_work(), side_work()): side_work on stream `side` while main_work runs on the current stream,
    both after everything already queued, the current stream then waiting for both; side None: one after
    the other. The side work is issued second, so a captured graph joins back on the main stream's lane."""
    if side is None:
        return main_work(), side_work()
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    first = main_work()
    with torch.cuda.stream(side):
        second = side_work()
    main.wait_stream(side)
    return first, second


# SGLang's rotary classes whose rotation is its cos/sin cache alone (YaRN's scale is baked into the cache)
_CACHE_ROTARIES = (RotaryEmbedding, DeepseekScalingRotaryEmbedding)


def _rope(config, rotary_dim: int, interleave: bool) -> RotaryEmbedding:
    """SGLang's rotary module for this config: the plugin reads its cos/sin cache and pair layout (`rotate`)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    scaling = params if params.get("rope_type", "default") != "default" else None
    rotary = get_rope(
        rotary_dim,
        rotary_dim=rotary_dim,
        max_position=config.max_position_embeddings,
        base=theta,
        rope_scaling=scaling,
        is_neox_style=not interleave,
    )
    if type(rotary) not in _CACHE_ROTARIES:
        raise ValueError(
            f"rope_parameters {params or None}: SGLang builds {type(rotary).__name__} for it, and the plugin "
            f"rotates with the cos/sin cache of {' or '.join(c.__name__ for c in _CACHE_ROTARIES)} only; "
            "serve a GLM-DSA config whose rope_type is default or deepseek_yarn"
        )
    return rotary


def rotate(
    rotary: RotaryEmbedding, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_out: torch.Tensor,
    k_out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] and k [T, HK, D] with their first rotary_dim columns rotated at `positions` and the rest
    copied, written into q_out and k_out: one launch on CUDA (`glm_dsa_kernels.rope`: no contiguous copy,
    no cat, never in place), the same formula in torch elsewhere."""
    kernel = rope if q.is_cuda else rope_ref
    return kernel(q, k, positions, rotary.cos_sin_cache, q_out, k_out, interleaved=not rotary.is_neox_style)


class GlmDsaIndexer(nn.Module):
    """Lightning indexer of a full layer: scores every cached key, keeps the top-k per query."""

    def __init__(self, config, topk: int, layer_id: int, quant_config: Optional[QuantizationConfig], prefix: str):
        super().__init__()
        self.layer_id = layer_id
        self.n_heads = config.index_n_heads
        self.head_dim = config.index_head_dim
        self.rope_dim = config.qk_rope_head_dim
        self.topk = topk  # settings.index_topk: the launch override included
        self.wq_b = ReplicatedLinear(
            config.q_lora_rank, self.n_heads * self.head_dim, bias=False,
            quant_config=quant_config, prefix=add_prefix("wq_b", prefix),
        )
        self.wk = ReplicatedLinear(
            config.hidden_size, self.head_dim, bias=False,
            quant_config=quant_config, prefix=add_prefix("wk", prefix),
        )
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        # GLM keeps the head weights unquantized (modules_to_not_convert).
        self.weights_proj = ReplicatedLinear(
            config.hidden_size, self.n_heads, bias=False, quant_config=None,
            prefix=add_prefix("weights_proj", prefix),
        )
        self.rotary_emb = _rope(config, self.rope_dim, getattr(config, "indexer_rope_interleave", True))

    def forward(
        self, hidden_states, q_lora, positions, forward_batch, backend: DsaIndexBackend
    ) -> torch.Tensor:
        q, weights, k = self.project(hidden_states, q_lora, positions)
        return self._store_and_select(backend, q, weights, k, forward_batch.out_cache_loc)

    def project(self, hidden_states, q_lora, positions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Index queries [T, heads, dim], head weights [T, heads] and keys [T, dim]: fixed-shape work
        that a prefill graph captures."""
        q, _ = self.wq_b(q_lora)
        q = q.view(-1, self.n_heads, self.head_dim)
        k, _ = self.wk(hidden_states)
        k = self.k_norm(k).unsqueeze(1)
        # RoPE covers the first rope_dim dims of each index head (transformers' layout).
        q, k = rotate(self.rotary_emb, positions, q, k, torch.empty_like(q), torch.empty_like(k))
        k = k.squeeze(1)
        weights, _ = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype))
        weights = weights.float() * self.n_heads**-0.5
        return q, weights, k

    @eager_on_graph
    def select_into(self, q, weights, k, out) -> None:
        """Under a breakable prefill graph, between captured segments: store the real rows' index
        keys and write their top-k into `out` (the top-k buffer's rows for the padded batch), -1 past
        them. Reads the live batch and backend at run time, as RadixAttention's eager attention does."""
        forward_batch = get_forward_batch()
        n = attention_query_tokens(forward_batch, forward_batch.global_num_token_non_padded_cpu)
        if n:
            out[:n].copy_(self._store_and_select(get_attn_backend(), q[:n], weights[:n], k[:n],
                                                 forward_batch.out_cache_loc[:n]))
        out[n:].fill_(-1)

    def _store_and_select(self, backend: DsaIndexBackend, q, weights, k, loc) -> torch.Tensor:
        """The keys into the index-K cache at KV slots `loc`, then each query's top-k positions."""
        backend.store_index_k(self.layer_id, k, loc)
        return backend.index_topk(self.layer_id, q, weights, self.head_dim**-0.5, self.topk)


def build_indexer(config, settings: GlmDsaSettings, layer_id: int, quant_config, prefix: str) -> nn.Module:
    """The indexer of a full layer, matching the attention backend that consumes its top-k.

    SGLang's `dsa` backend reads index keys from its FP8 index-K pool, which only SGLang's own
    indexer writes, so with it the layer owns SGLang's `Indexer` (not run with the plugin: the DeepGEMM
    it calls does not load on this project's GPU machine). Every plugin backend uses `GlmDsaIndexer`.
    """
    if settings.indexer == SGLANG_INDEXER:
        from sglang_glm.attention.sglang_dsa import SGLangDsaIndexer

        return SGLangDsaIndexer.for_glm(config, settings.index_topk, layer_id, quant_config, prefix)
    return GlmDsaIndexer(config, settings.index_topk, layer_id, quant_config, prefix)


def check_fusable_a_proj(q_lora_rank: int, quant_config: Optional[QuantizationConfig]) -> None:
    """q_a_proj's rows sit above kv_a's in one weight, loaded by stacking the two checkpoint tensors' rows:
    right for plain weights, and for block FP8 when q_a's rows fill whole blocks (one scale per 128 rows);
    a per-tensor scale of each would not stack."""
    if quant_config is None:
        return
    block = getattr(quant_config, "weight_block_size", None)
    if quant_config.get_name() == "fp8" and not quant_config.is_checkpoint_fp8_serialized:
        return  # --quantization fp8 on plain weights: quantized after loading
    if quant_config.get_name() != "fp8" or not block:
        raise ValueError(
            f"quantization {quant_config.get_name()!r}{'' if block else ' without weight_block_size'}: sglang-glm "
            "runs q_a_proj and kv_a_proj_with_mqa as one GEMM, which it loads from unquantized and block-FP8 "
            "checkpoints (GLM-5's FP8 release): serve one of those (--quantization fp8 quantizes plain weights)"
        )
    if q_lora_rank % block[0]:
        raise ValueError(
            f"q_lora_rank = {q_lora_rank} with weight_block_size {list(block)}: q_a_proj and "
            f"kv_a_proj_with_mqa run as one block-quantized GEMM, which needs q_lora_rank to be a multiple of "
            f"{block[0]} (GLM-5's is 2048); quantize the checkpoint with a block size that divides it"
        )


def absorbed_query_and_key(
    q_nope: torch.Tensor, q_pe: torch.Tensor, k_pe: torch.Tensor, w_kc: torch.Tensor, rotary: RotaryEmbedding,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The query sparse MLA reads, [T, H, kv_lora + rope]: q_nope [T, H, nope] times w_kc [H, nope,
    kv_lora] beside q_pe [T, H, rope] rotated at `positions`; and the key's rope columns, [T, 1, rope]:
    k_pe (a strided view of kv_a's output) rotated into a fresh tensor. The bmm writes straight into the
    rows' latent columns and one rotation into their rope columns and the key: no permute copy, no cat."""
    kv_lora = w_kc.shape[2]
    q = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], kv_lora + q_pe.shape[2])
    torch.bmm(q_nope.transpose(0, 1), w_kc, out=q[..., :kv_lora].transpose(0, 1))
    _, k = rotate(rotary, positions, q_pe, k_pe, q[..., kv_lora:],
                  torch.empty_like(k_pe, memory_format=torch.contiguous_format))
    return q, k


def heads_output(out: torch.Tensor, w_vc: torch.Tensor) -> torch.Tensor:
    """o_proj's input [T, H * v]: the attention output [T, H, kv_lora] times w_vc [H, kv_lora, v],
    written head-major by the bmm itself (no permute copy)."""
    heads = out.new_empty(out.shape[0], out.shape[1], w_vc.shape[2])
    torch.bmm(out.transpose(0, 1), w_vc, out=heads.transpose(0, 1))
    return heads.view(out.shape[0], -1)


class GlmDsaAttention(nn.Module):
    """MLA in its absorbed form (latent KV cache) with DSA sparse attention over top-k keys."""

    def __init__(
        self, config, settings: GlmDsaSettings, layer_id: int, has_indexer: bool, quant_config, prefix: str,
        alt_stream: Optional[torch.cuda.Stream] = None,
    ):
        super().__init__()
        tp_size = get_parallel().attn_tp_size
        self.layer_id = layer_id
        # small launches of one layer overlap on it inside captured graphs, as in SGLang's own MLA
        self.alt_stream = alt_stream
        self.num_heads = config.num_attention_heads // tp_size
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.v_head_dim = config.v_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        # q_a_proj and kv_a_proj_with_mqa read the same hidden state: one GEMM and one input quantization
        # for both, as in SGLang's own DeepSeek/GLM classes (load_weights concatenates their rows)
        check_fusable_a_proj(config.q_lora_rank, quant_config)
        self.fused_qkv_a_proj_with_mqa = ReplicatedLinear(
            config.hidden_size, config.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim, bias=False,
            quant_config=quant_config, prefix=add_prefix("fused_qkv_a_proj_with_mqa", prefix),
        )
        self.q_a_layernorm = RMSNorm(config.q_lora_rank, eps=config.rms_norm_eps)
        self.q_b_proj = ColumnParallelLinear(
            config.q_lora_rank, config.num_attention_heads * qk_head_dim, bias=False,
            quant_config=quant_config, prefix=add_prefix("q_b_proj", prefix),
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps=config.rms_norm_eps)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank, config.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim),
            bias=False, quant_config=quant_config, prefix=add_prefix("kv_b_proj", prefix),
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.v_head_dim, config.hidden_size, bias=False,
            quant_config=quant_config, prefix=add_prefix("o_proj", prefix),
        )
        self.rotary_emb = _rope(config, self.qk_rope_head_dim, getattr(config, "rope_interleave", True))
        if has_indexer:
            self.indexer = build_indexer(
                config, settings, layer_id, quant_config, add_prefix("indexer", prefix)
            )
        # Absorbed MLA: attention runs on [latent | rope] rows of width kv_lora_rank + rope.
        self.attn = RadixAttention(
            self.num_heads,
            self.kv_lora_rank + self.qk_rope_head_dim,
            qk_head_dim**-0.5,
            num_kv_heads=1,
            layer_id=layer_id,
            v_head_dim=self.kv_lora_rank,
            quant_config=quant_config,
            prefix=add_prefix("attn", prefix),
        )
        # Filled from kv_b_proj after loading (`absorb_kv_b_proj`).
        self.w_kc: Optional[torch.Tensor] = None  # [heads, nope, kv_lora]
        self.w_vc: Optional[torch.Tensor] = None  # [heads, kv_lora, v]

    @property
    def has_indexer(self) -> bool:
        return hasattr(self, "indexer")

    def absorb_kv_b_proj(self, weight: torch.Tensor) -> None:
        w = weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        w_k, w_v = w.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)
        self.w_kc = w_k.contiguous()
        self.w_vc = w_v.transpose(1, 2).contiguous()

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        forward_batch: ForwardBatch,
        topk_buffer: TopkBuffer,
        run_indexer: bool,
    ) -> torch.Tensor:
        qkv_a, _ = self.fused_qkv_a_proj_with_mqa(hidden_states)
        q_lora, kv_a, k_pe = qkv_a.split([self.q_lora_rank, self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        # inside a captured graph (not a breakable one, whose eager breaks a fork may not span) the two norms,
        # and a full layer's indexer and q_b_proj, run side by side: at small batches each is a few
        # latency-bound launches
        side = self.alt_stream if get_is_capture_mode() and not is_in_breakable_cuda_graph() else None
        # strided views, as SGLang's own MLA passes them (no copy)
        q_lora, kv_a = overlapped(side, lambda: self.q_a_layernorm(q_lora), lambda: self.kv_a_layernorm(kv_a))
        if run_indexer and isinstance(self.indexer, GlmDsaIndexer) and in_breakable_prefill_graph(forward_batch):
            q, _ = self.q_b_proj(q_lora)
            q_idx, weights, k_idx = self.indexer.project(hidden_states, q_lora, positions)
            self.indexer.select_into(q_idx, weights, k_idx, topk_buffer.claim(self.layer_id))
        elif run_indexer:
            topk, (q, _) = overlapped(
                side,
                lambda: self.indexer(hidden_states, q_lora, positions, forward_batch, get_attn_backend()),
                lambda: self.q_b_proj(q_lora),
            )
            topk_buffer.write(self.layer_id, topk)
        else:
            q, _ = self.q_b_proj(q_lora)
        q = q.view(-1, self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        # after the indexer, so its temporaries and the [T, H, 576] query are not alive together
        query, k_rope = absorbed_query_and_key(q_nope, q_pe, k_pe.unsqueeze(1), self.w_kc, self.rotary_emb, positions)
        out = self.attn(
            query,
            kv_a.unsqueeze(1),
            kv_a.unsqueeze(1),
            forward_batch,
            k_rope=k_rope,
            topk_indices=topk_buffer.read(self.layer_id),
        )
        out, _ = self.o_proj(heads_output(out.view(-1, self.num_heads, self.kv_lora_rank), self.w_vc))
        return out
