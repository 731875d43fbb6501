"""The plugin's GLM-DSA model run in-process by SGLang's `ModelRunner`, a layer plan per forward.

Set-up follows `sglang.benchmark.one_batch` (load_model / extend): SGLang builds the
`ModelRunner` (weights, KV pool, the plugin's attention backend) and a `ForwardBatch` per group of
calibration sequences, with no server, scheduler or tokenizer process. The forward itself runs
the plugin's own modules - `GlmDsaModel.forward(..., plan=...)` for whole forwards, and the
model's own layer loop `GlmDsaModel.run_layers` started at any layer for candidate plans - so a
candidate needs no restart and no second copy of the model.

Caching (what a candidate does not change): a candidate plan differs from the current plan only
from the layer it makes shared, so the residual stream entering that layer, and the top-k rows the
buffer holds there, are cached per batch for every full layer of the current plan; a candidate
runs only the layers from there on. Every layer writes its own KV (and index-K) rows before it
reads them, so re-running a suffix of the layers over the same slots is exact.
"""

from __future__ import annotations

import contextlib
import json
import logging
from array import array
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from sglang_glm_tools.calibration import CalibrationError
from sglang_glm_tools.calibration.inputs import ModelInfo, Sequences
from sglang_glm.layer_plan import LayerPlan

logger = logging.getLogger(__name__)


def _prepare_sglang() -> None:
    """CPU stand-ins before SGLang is imported (CPU machines only), then the plugin."""
    if not torch.cuda.is_available():
        from sglang_glm.cpu_compat import activate

        activate()
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError as exc:
        raise CalibrationError(
            "sglang-glm-calibrate runs the plugin's model inside SGLang's in-process model runner "
            "and needs SGLang 0.5.23 (pip install 'sglang-glm[sglang]'); this environment has "
            f"none ({exc})"
        ) from exc
    load_plugins()


@dataclass
class LayerState:
    """What enters layer `layer` of one batch: the residual stream and the top-k buffer."""

    hidden: torch.Tensor
    residual: Optional[torch.Tensor]
    topk: torch.Tensor
    topk_source: int


@dataclass
class Batch:
    """A group of sequences with their KV slots and a `ForwardBatch` that stays valid."""

    forward_batch: object
    schedule_batch: object
    reqs: list
    targets: torch.Tensor  # next token per position, -1 at each sequence's last token
    positions: torch.Tensor
    states: dict[int, LayerState] = field(default_factory=dict)
    reference_logprobs: Optional[torch.Tensor] = None  # [tokens, vocab] for the KL objective

    @property
    def num_tokens(self) -> int:
        return int(self.targets.shape[0])


class InProcessModel:
    """The plugin's model in SGLang's `ModelRunner`, built with every indexer layer full."""

    def __init__(
        self,
        info: ModelInfo,
        *,
        max_total_tokens: int,
        max_requests: int,
        dtype: str = "float32",
        log_level: str = "warning",
    ):
        _prepare_sglang()
        from sglang.benchmark.one_batch import _init_process_global_configs, load_model
        from sglang.srt.entrypoints.engine import _set_envs_and_config
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
        from sglang.srt.server_args import PortArgs, ServerArgs

        from sglang_glm.attention.backends import TORCH_BACKEND, on_cpu_engine

        self.info = info
        self.built_plan = info.start_plan
        page = 64  # SGLang's DSA page size: every request rounds its slots up to it
        server_args = ServerArgs(
            model_path=str(info.path),
            device="cpu" if on_cpu_engine() else "cuda",
            dtype=dtype,
            disable_cuda_graph=True,
            max_total_tokens=max_total_tokens + page * (max_requests + 1),
            max_running_requests=max_requests + 1,
            log_level=log_level,
            skip_tokenizer_init=True,
            json_model_override_args=json.dumps({"index_topk_pattern": self.built_plan.pattern}),
            **({"attention_backend": TORCH_BACKEND} if on_cpu_engine() else {}),
        )
        server_args.resolve_once()
        _set_envs_and_config(server_args)
        port_args = PortArgs.init_new(server_args)
        publish(
            server_args,
            role="scheduler",
            ranks=SpawnRanks(
                world_rank=spawn_world_rank(server_args, tp_rank=0, pp_rank=0), gpu_id=0
            ),
        )
        _init_process_global_configs()
        bench_runner, _ = load_model(server_args, port_args, 0, 0)
        self.model_runner = bench_runner.torch_runner
        self.model = self.model_runner.model
        if self.model.plan.pattern != self.built_plan.pattern:
            raise RuntimeError(
                f"the model was built with plan {self.model.plan.pattern}, expected "
                f"{self.built_plan.pattern}"
            )
        self.device = self.model_runner.device

    # ---- batches ----------------------------------------------------------------------------

    def make_batches(self, sequences: Sequences, batch_seqs: int) -> list[Batch]:
        seqs = sequences.token_ids
        return [self._make_batch(seqs[i : i + batch_seqs]) for i in range(0, len(seqs), batch_seqs)]

    def _make_batch(self, token_ids) -> Batch:
        """SGLang's prefill batch for these sequences (as `one_batch.extend`, without the forward)."""
        from sglang.benchmark.one_batch import TreeCacheNamespace, _maybe_prepare_mlp_sync_batch
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
        from sglang.srt.runtime_context import get_schedule
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        mr = self.model_runner
        reqs = []
        for ids in token_ids:
            req = Req(
                rid=f"calib-{id(ids)}-{len(reqs)}",
                origin_input_text="",
                origin_input_ids=array("q", ids),
                sampling_params=SamplingParams(temperature=0, max_new_tokens=1),
            )
            req.full_untruncated_fill_ids = req.origin_input_ids
            req.logprob_start_len = -1
            req.extend_end = len(ids)
            reqs.append(req)
        tree_cache = TreeCacheNamespace(
            page_size=get_schedule().page_size,
            device=mr.device,
            token_to_kv_pool_allocator=mr.token_to_kv_pool_allocator,
        )
        batch = ScheduleBatch.init_new(
            reqs=reqs,
            req_to_token_pool=mr.req_to_token_pool,
            token_to_kv_pool_allocator=mr.token_to_kv_pool_allocator,
            tree_cache=tree_cache,
            model_config=mr.model_config,
            enable_overlap=False,
            spec_algorithm=SpeculativeAlgorithm.NONE,
        )
        batch.prepare_for_extend()
        _maybe_prepare_mlp_sync_batch(batch, mr)
        if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
            batch.prefill_input_ids_cpu = None
        fb = ForwardBatch.init_new(batch, mr, return_hidden_states_before_norm=False)
        targets = torch.cat(
            [torch.tensor(list(ids[1:]) + [-1], dtype=torch.int64) for ids in token_ids]
        ).to(mr.device)
        return Batch(fb, batch, reqs, targets, fb.positions)

    # ---- forward ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _context(self, batch: Batch):
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
        from sglang.srt.runtime_context import get_model

        fb = batch.forward_batch
        backend = self.model_runner.attn_backend
        backend.init_forward_metadata(fb)
        with (
            torch.no_grad(),
            get_model().override(shared_experts=self.model.shared_experts_config),
            forward_context(ForwardContext(attn_backend=backend), forward_batch=fb),
        ):
            yield

    def forward_whole(self, batch: Batch, plan: LayerPlan) -> torch.Tensor:
        """Final (normed) hidden states from the plugin's `GlmDsaModel.forward` with `plan`."""
        fb = batch.forward_batch
        with self._context(batch):
            return self.model.model(fb.input_ids, fb.positions, fb, plan=plan)

    def forward_layers(
        self,
        batch: Batch,
        plan: LayerPlan,
        *,
        start: int = 0,
        capture: Callable[[int], bool] = lambda layer: False,
        on_topk: Optional[Callable[[int, torch.Tensor], None]] = None,
    ) -> torch.Tensor:
        """Final (normed) hidden states of `GlmDsaModel.run_layers` from layer `start` (its entering
        state from the cache).

        `capture(i)` says which entering states to cache into `batch.states`; `on_topk(i, rows)`
        sees the top-k rows each layer that runs its indexer writes.
        """
        inner = self.model.model
        fb = batch.forward_batch
        buffer = inner.topk_buffer

        def after_layer(i: int, hidden: torch.Tensor, residual: Optional[torch.Tensor]) -> None:
            if on_topk is not None and plan.is_full(i):
                on_topk(i, buffer.read(i))
            if i + 1 < inner.end_layer and capture(i + 1):
                batch.states[i + 1] = LayerState(
                    hidden.clone(),
                    None if residual is None else residual.clone(),
                    buffer.read(i).clone(),
                    buffer.source_layer,
                )

        with self._context(batch):
            buffer.begin_forward(batch.num_tokens)
            if start == 0:
                hidden, residual = inner.embed_tokens(fb.input_ids), None
            else:
                state = batch.states[start]
                hidden, residual = state.hidden, state.residual
                buffer.write(state.topk_source, state.topk)
            hidden, residual = inner.run_layers(
                fb.positions, fb, plan, hidden, residual, start, inner.end_layer, after_layer
            )
            hidden, _ = inner.norm(hidden, residual)
        return hidden

    # ---- loss -------------------------------------------------------------------------------

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the checkpoint's vocabulary: SGLang pads the lm head's rows to a multiple
        of 64 (300 -> 320), and, as its `LogitsProcessor` does, the padded columns are dropped."""
        weight = self.model.lm_head.weight[: self.model.config.vocab_size]
        return hidden @ weight.T

    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits(hidden).float(), dim=-1)

    def nll(self, batch: Batch, hidden: torch.Tensor, chunk: int = 4096) -> tuple[float, int]:
        """Sum of next-token negative log-likelihoods over the batch, and their count."""
        total, count = 0.0, 0
        for s in range(0, batch.num_tokens, chunk):
            targets = batch.targets[s : s + chunk]
            keep = targets >= 0
            lp = self.logprobs(hidden[s : s + chunk][keep])
            total += -lp.gather(1, targets[keep, None]).sum().item()
            count += int(keep.sum())
        return total, count

    def kl(self, batch: Batch, hidden: torch.Tensor, chunk: int = 4096) -> tuple[float, int]:
        """Sum over predicted positions of KL(reference || plan), and their count."""
        total, count = 0.0, 0
        for s in range(0, batch.num_tokens, chunk):
            keep = batch.targets[s : s + chunk] >= 0
            lp = self.logprobs(hidden[s : s + chunk][keep])
            ref = batch.reference_logprobs[s : s + chunk][keep]
            total += (ref.exp() * (ref - lp)).sum().item()
            count += int(keep.sum())
        return total, count

    def self_check(self, batch: Batch) -> float:
        """SGLang's own `ModelRunner.forward` vs `forward_layers`: max |logit difference|."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        mr = self.model_runner
        fb = ForwardBatch.init_new(batch.schedule_batch, mr, return_hidden_states_before_norm=False)
        with torch.no_grad():
            served = mr.forward(fb).logits_output.next_token_logits
        hidden = self.forward_layers(batch, self.built_plan)
        ends = torch.cumsum(torch.tensor([len(r.origin_input_ids) for r in batch.reqs]), 0) - 1
        ours = self.logits(hidden[ends.to(hidden.device)])
        return float((ours.float() - served.float()).abs().max())


class CachedPlanLoss:
    """The search's evaluator: mean loss of a plan over the calibration batches, with caching.

    objective "lm": mean next-token negative log-likelihood (nats/token) of the calibration text.
    objective "kl": mean KL(start plan || plan) of the next-token distributions; 0 for the start
    plan, never negative (useful when the model is untrained and LM loss changes are noise).
    """

    def __init__(self, model: InProcessModel, batches: list[Batch], objective: str = "lm"):
        if objective not in ("lm", "kl"):
            raise ValueError(f"objective {objective!r}: use 'lm' or 'kl'")
        self.model = model
        self.batches = batches
        self.objective = objective
        self.plan: Optional[LayerPlan] = None
        if objective == "kl":
            for b in batches:
                b.reference_logprobs = model.logprobs(model.forward_whole(b, model.built_plan))

    def _run(self, plan: LayerPlan, start: int, capture: Callable[[int], bool]) -> float:
        total, count = 0.0, 0
        for b in self.batches:
            hidden = self.model.forward_layers(b, plan, start=start, capture=capture)
            t, c = (self.model.nll if self.objective == "lm" else self.model.kl)(b, hidden)
            total, count = total + t, count + c
        return total / count

    def set_base(self, plan: LayerPlan) -> float:
        for b in self.batches:
            b.states.clear()
        self.plan = plan
        return self._run(plan, 0, capture=plan.is_full)

    def _shared(self, layer: int) -> LayerPlan:
        from sglang_glm_tools.calibration.search import share

        return share(self.plan, layer)

    def candidate(self, layer: int) -> float:
        return self._run(self._shared(layer), layer, capture=lambda i: False)

    def commit(self, layer: int) -> float:
        new = self._shared(layer)
        for b in self.batches:  # entering states after `layer` change with the new plan
            for i in [i for i in b.states if i > layer]:
                del b.states[i]
        loss = self._run(new, layer, capture=lambda i: i > layer and new.is_full(i))
        for b in self.batches:
            b.states.pop(layer, None)  # no longer a full layer: never a candidate again
        self.plan = new
        return loss


def mean_nll(model: InProcessModel, batches: list[Batch], plan: LayerPlan) -> float:
    """Mean next-token NLL of `plan` from the plugin's whole-model forward (no cache)."""
    total, count = 0.0, 0
    for b in batches:
        t, c = model.nll(b, model.forward_whole(b, plan))
        total, count = total + t, count + c
    return total / count
