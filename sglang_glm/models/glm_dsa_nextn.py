"""GLM-DSA MTP (NextN) draft model for SGLang's EAGLE / NEXTN speculative decoding.

SGLang loads the draft from the target's checkpoint and renames its architecture to
`GlmMoeDsaForCausalLMNextN`; this class serves that name. It is built from the target's own layer
classes (glm_dsa.py): x = eh_proj(cat(enorm(embed(token)), hnorm(carry))), then ONE decoder layer
whose indexer always exists (the MTP layer is always "full", whatever the target's IndexCache plan
says), then shared_head.norm; logits come from the normed hidden through the target's lm head
(shared, as is the embedding, through `set_embed_and_head`).

Two policies (sglang_glm.mtp):
- recycling: the hidden handed to the next draft step is the post-`shared_head.norm` one
  ("post_norm", GLM's default) or the pre-norm residual ("pre_norm"), per `mtp_recycle_hidden`;
- index share (`index_share_for_mtp_iteration`): the MTP indexer runs only in the draft-extend pass
  (draft step 0, over the tokens the target verified); draft steps 1+ run no indexer and reuse each
  request's top-k row at its last accepted token.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable, Optional

import torch
from torch import nn
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.quantization.base_config import QuantizationConfig
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.utils import add_prefix

from sglang_glm.models.attention import side_stream
from sglang_glm.models.glm_dsa import GlmDsaDecoderLayer
from sglang_glm.models.weights import (
    PACKED_MODULES,
    ExpertInventory,
    SharedExpertFusion,
    dequantized_weight,
    expert_params_mapping,
    fused_shared_expert_name,
    fused_shared_experts,
    TensorLoader,
)
from sglang_glm.mtp.draft_head import Fp8DraftHead
from sglang_glm.mtp.index_share import SharedTopkTable, compact_last_accepted
from sglang_glm.mtp.recycle import carried_hidden
from sglang_glm.settings import GlmDsaSettings, module_config
from sglang_glm.topk_buffer import TopkBuffer

logger = logging.getLogger(__name__)

# The draft layer's id inside the draft model (its own one-layer KV pool), as SGLang's NextN does.
DRAFT_LAYER_ID = 0
_MTP_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
# Tensors of the MTP layer that live outside its decoder layer.
_MTP_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.norm.")
# Copies of the target's embedding / lm head inside the MTP layer: the draft shares the target's.
_MTP_COPIES = ("embed_tokens.", "shared_head.head.")


def _mtp_layer_config(config):
    """Config for the draft's decoder layer: layer 0 of a one-layer model, MoE like GLM's MTP."""
    cfg = module_config(config)
    cfg.mlp_layer_types = ["sparse" if getattr(config, "n_routed_experts", 0) else "dense"]
    cfg.first_k_dense_replace = 0 if cfg.mlp_layer_types[0] == "sparse" else 1
    return cfg


class GlmDsaModelNextN(nn.Module):
    def __init__(
        self, config, settings: GlmDsaSettings, quant_config: Optional[QuantizationConfig], prefix: str = ""
    ):
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, prefix=add_prefix("embed_tokens", prefix)
        )
        self.enorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hnorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # GLM keeps eh_proj unquantized (modules_to_not_convert).
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        # The MTP layer always owns an indexer (always full), even when the target's plan
        # marks its last layers shared.
        self.decoder = GlmDsaDecoderLayer(
            _mtp_layer_config(config), settings, DRAFT_LAYER_ID, True, quant_config,
            add_prefix("decoder", prefix), side_stream(),
        )
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.topk_buffer = TopkBuffer(settings.index_topk)
        if settings.draft_prefill_graphs:
            # SGLang's prefill graph runner captures a model that has `layers`; a plain list, so the
            # decoder's parameters keep their `model.decoder.*` names.
            self.layers = [self.decoder]

    def forward(self, input_ids, positions, forward_batch, topk_rows: Optional[torch.Tensor] = None):
        """Returns (pre-norm hidden x, post-norm hidden shared_head.norm(x)).

        The body SGLang's breakable prefill graph captures for the draft's prefill pass: fixed-shape
        tensor work, the MTP indexer's store + top-k an eager break (`GlmDsaIndexer.select_into`).
        topk_rows: None runs the MTP indexer; else the shared top-k rows of this batch's queries.
        """
        embeds = self.embed_tokens(input_ids)
        carry = forward_batch.spec_info.hidden_states
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(carry.to(embeds.dtype))], dim=-1))
        self.topk_buffer.begin_forward(x.shape[0])
        run_indexer = topk_rows is None
        if not run_indexer:
            self.topk_buffer.write(DRAFT_LAYER_ID, topk_rows)
        h, residual = self.decoder(
            positions, x, None, forward_batch, self.topk_buffer, run_indexer
        )
        post, pre = self.shared_head.norm(h, residual)
        return pre, post


class GlmMoeDsaForCausalLMNextN(SharedExpertFusion, nn.Module):
    fused_shared_experts_architecture = "GlmMoeDsaForCausalLMNextN"  # the name SGLang gives a GLM draft
    packed_modules_mapping = PACKED_MODULES  # read by SGLang's quantization configs

    def __init__(self, config, quant_config: Optional[QuantizationConfig] = None, prefix: str = "",
                 settings: Optional[GlmDsaSettings] = None):
        super().__init__()
        mtp_layers = getattr(config, "num_nextn_predict_layers", 1)
        if mtp_layers != 1:  # a second MTP layer's tensors would be loaded by nobody
            raise ValueError(f"num_nextn_predict_layers = {mtp_layers!r}: the MTP draft serves GLM-5's one MTP "
                             f"layer, applied recursively; use a checkpoint with one, or serve without "
                             f"--speculative-algorithm")
        # The target's settings, resolved from the same config and launch.
        self.settings = settings = settings or GlmDsaSettings.for_this_process(config)
        self.config = config = module_config(config)
        self.fused_shared_experts = fused_shared_experts(type(self).__name__, config)
        self.model = GlmDsaModelNextN(config, settings, quant_config, add_prefix("model", prefix))
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, prefix=add_prefix("model.shared_head.head", prefix)
        )
        self.logits_processor = LogitsProcessor(config)
        self.draft_head: Optional[Fp8DraftHead] = None  # set_embed_and_head, with mtp_draft_head_fp8
        self._shared: Optional[SharedTopkTable] = None  # allocate_forward_buffers
        logger.info(
            "GLM-DSA MTP draft: carry=%s, index_share_for_mtp_iteration=%s (MTP indexer %s)",
            self.settings.recycle, self.settings.index_share,
            "runs once per round, draft steps 1+ reuse the last accepted token's top-k"
            if self.settings.index_share else "runs in every draft step",
        )
        logger.info(
            "GLM-DSA MTP draft prefill: %s", "captured by SGLang's breakable prefill graphs "
            "(mtp_draft_prefill_graphs)" if settings.draft_prefill_graphs
            else "eager (mtp_draft_prefill_graphs off)",
        )

    # ---- embedding / head shared with the target ----------------------------------------------

    def get_embed_and_head(self):
        return self.model.embed_tokens.weight, self.lm_head.weight

    def set_embed_and_head(self, embed, head):
        del self.model.embed_tokens.weight
        del self.lm_head.weight
        self.model.embed_tokens.weight = embed
        self.lm_head.weight = head
        if self.settings.draft_head_fp8:  # before SGLang captures the draft's graphs (EAGLE's init_lm_head)
            self.draft_head = Fp8DraftHead(head)
            logger.info("GLM-DSA MTP draft head: block-FP8 copy of the LM head (%d x %d, %.2f GB) for the "
                        "draft's logits; the verify keeps the BF16 head (mtp_draft_head_fp8)",
                        *head.shape, self.draft_head.nbytes() / 1e9)

    # ---- forward --------------------------------------------------------------------------------

    def allocate_forward_buffers(self, max_tokens: int, max_requests: int, device) -> None:
        """Once, when SGLang builds this runner's attention backends: fixed addresses for CUDA graphs."""
        self.model.topk_buffer.allocate(max_tokens, device)
        if self.settings.index_share:
            self._shared = SharedTopkTable(max_requests, self.settings.index_topk, device=device)

    @torch.no_grad()
    def forward(self, input_ids, positions, forward_batch: ForwardBatch, **unused):
        mode = forward_batch.forward_mode
        is_draft_step = mode.is_decode()  # EAGLE's multi-step draft forwards (draft steps 1+)
        topk_rows = None
        if is_draft_step and self.settings.index_share:
            per_request = input_ids.shape[0] // forward_batch.batch_size
            topk_rows = self._shared.rows_for_draft(
                forward_batch.req_pool_indices, per_request
            )
        # Under a breakable prefill graph self.model is the replay and this forward runs eagerly
        # around it, on the batch padded to a token bucket.
        pre, post = self.model(input_ids, positions, forward_batch, topk_rows)
        if not is_draft_step and self.settings.index_share and not mode.is_idle():
            self._store_last_accepted(forward_batch, input_ids.shape[0])
        return self.logits_processor(input_ids, post, self._head(), forward_batch,
                                     aux_hidden_states=carried_hidden(self.settings.recycle, pre))

    def _head(self):
        if not self.settings.draft_head_fp8:
            return self.lm_head
        if self.draft_head is None:  # SGLang shares the target's head through set_embed_and_head
            raise RuntimeError("mtp_draft_head_fp8 is on but SGLang never handed the draft the target's LM head "
                               "(set_embed_and_head); drop the key")
        return self.draft_head

    def _store_last_accepted(self, forward_batch: ForwardBatch, num_tokens: int) -> None:
        """Compact this draft-extend's top-k rows to each request's last accepted token."""
        buffer = self.model.topk_buffer
        # a replayed prefill graph leaves the buffer's Python state as its capture did: read by count
        rows = buffer.rows(num_tokens) if self.settings.draft_prefill_graphs else buffer.read(DRAFT_LAYER_ID)
        if forward_batch.forward_mode.is_draft_extend_v2():
            # After verify: a fixed window of draft tokens per request, the accepted ones first.
            per_request = forward_batch.spec_info.num_tokens_per_req
            start = torch.arange(forward_batch.batch_size, device=rows.device) * per_request
            accept = forward_batch.spec_info.num_accept_tokens
        else:  # after prefill: the request's last prompt token
            start, accept = forward_batch.extend_start_loc, forward_batch.extend_seq_lens
        self._shared.store(forward_batch.req_pool_indices, compact_last_accepted(rows, start, accept))

    # ---- weights --------------------------------------------------------------------------------

    def _draft_name(self, name: str) -> Optional[str]:
        """Checkpoint name -> draft parameter name, None for tensors the draft does not load."""
        match = _MTP_LAYER.match(name)
        if match is None or int(match.group(1)) != self.config.num_hidden_layers:
            return None  # target tensors
        rest = match.group(2)
        if rest.startswith(_MTP_COPIES) or "rotary_emb.inv_freq" in rest:
            return None
        if rest.startswith(_MTP_OWN):
            return f"model.{rest}"
        return f"model.decoder.{rest}"

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        params = dict(self.named_parameters())
        loader = TensorLoader(params, expert_params_mapping(self.config, self.fused_shared_experts), type(self).__name__)
        experts = ExpertInventory(self.config)
        for name, tensor in weights:
            draft_name = self._draft_name(name)
            if draft_name is None:
                continue
            experts.see(name)
            if self.fused_shared_experts:
                draft_name = fused_shared_expert_name(draft_name, self.config.n_routed_experts)
            loader.load(draft_name, tensor)
        # the embedding and lm head are the target's (set_embed_and_head)
        need = {n for n in params if not n.startswith(("model.embed_tokens.", "lm_head."))}
        missing = loader.unloaded(need) + experts.missing()
        if not loader.loaded and not loader.waiting:
            raise ValueError(
                f"the checkpoint has no MTP layer (no tensors under model.layers.{self.config.num_hidden_layers}.*, "
                "although its config.json says num_nextn_predict_layers: 1); speculative decoding with EAGLE/NEXTN "
                "needs a checkpoint with its MTP layer: use one, or serve without --speculative-algorithm"
            )
        if missing:
            raise ValueError(
                f"the checkpoint's MTP layer (model.layers.{self.config.num_hidden_layers}.*) lacks {len(missing)} "
                f"tensors the draft needs, e.g. {missing[:8]}; use the complete checkpoint"
            )
        self.post_load_weights()

    def post_load_weights(self) -> None:
        """Absorb kv_b_proj; SGLang calls this itself for loaders that skip load_weights (dummy)."""
        attn = self.model.decoder.self_attn
        attn.absorb_kv_b_proj(dequantized_weight(attn.kv_b_proj))


EntryClass = [GlmMoeDsaForCausalLMNextN]
