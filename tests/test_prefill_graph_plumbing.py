"""The plugin's prefill under SGLang's breakable CUDA graphs, as far as CPU can check it.

SGLang's breakable prefill graph captures `GlmDsaModel.forward` on a batch padded to a token bucket
and runs RadixAttention (and the plugin's indexer break, `GlmDsaIndexer.select_into`) eagerly on the
real rows between captured segments. With no capture running, SGLang's `eager_on_graph` calls the
break directly, so the same forward under SGLang's own graph contexts (breakable scope, prefill graph
scope, the static batch the runner sets) is what a replay computes. It must equal the eager prefill on
the real rows, with the top-k buffer's padded rows -1. The same for the MTP draft's prefill pass
(`mtp_draft_prefill_graphs`): its body under the graph contexts, its outer forward (logits, the
shared top-k compaction) eagerly around it. The GPU suite runs the captured versions.

The check runs in its own process: the in-process model runner publishes SGLang's process-wide
runtime context (a one-rank topology), which later Engine tests in the same pytest process would
inherit (the tensor-parallel engine test then fails its topology check).
"""

import contextlib
import copy
import dataclasses
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

pytestmark = pytest.mark.slow

MINI = Path(__file__).resolve().parents[1] / "assets" / "glm-dsa-mini"


def in_process_model():
    from sglang_glm_tools.calibration.inputs import inspect_model
    from sglang_glm_tools.calibration.runner import InProcessModel

    return InProcessModel(inspect_model(MINI), max_total_tokens=1024, max_requests=2)


def padded(forward_batch, bucket: int):
    """The prefill runner's static batch: input ids, positions and KV slots padded to the bucket
    (slot 0 and position 0, as SGLang's buffer registry zeroes the tail), the live request state."""
    n = forward_batch.input_ids.shape[0]
    static = copy.copy(forward_batch)
    for name in ("input_ids", "positions", "out_cache_loc"):
        live = getattr(forward_batch, name)
        pad = torch.zeros(bucket, dtype=live.dtype, device=live.device)
        pad[:n] = live
        setattr(static, name, pad)
    static.global_num_token_non_padded_cpu = n
    return static


def run_in_subprocess(check: str):
    proc = subprocess.run([sys.executable, __file__, check], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_prefill_under_a_simulated_breakable_graph_matches_eager():
    run_in_subprocess("target")


def test_draft_prefill_under_a_simulated_breakable_graph_matches_eager():
    run_in_subprocess("draft")


@contextlib.contextmanager
def graph_scope(model, static, num_tokens: int):
    """SGLang's contexts around a breakable prefill replay (`PrefillCudaGraphRunner._prefill_forward_context`)."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        enable_breakable_cuda_graph,
    )
    from sglang.srt.model_executor.runner_utils.forward_batch import set_forward_batch
    from sglang.srt.model_executor.runner_utils.prefill_graph import prefill_graph_scope
    from sglang.srt.runtime_context import get_model

    with (
        torch.no_grad(),
        get_model().override(shared_experts=model.model.shared_experts_config),
        enable_breakable_cuda_graph(),
        prefill_graph_scope(full_graph=False, raw_num_tokens=num_tokens),
        set_forward_batch(static),
        forward_context(ForwardContext(attn_backend=model.model_runner.attn_backend), forward_batch=static),
    ):
        yield


def simulated_breakable_prefill_matches_eager():
    model = in_process_model()
    from sglang_glm.layer_plan import LayerPlan

    plan = LayerPlan.from_pattern("FSSFSFSS", "test")
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(2, 250, (n,), generator=gen).tolist() for n in (100, 37)]
    batch = model._make_batch(seqs)
    inner = model.model.model
    n = batch.num_tokens
    want = model.forward_whole(batch, plan)
    want_topk = inner.topk_buffer.read(7).clone()  # rows of full layer 5, the last full one

    backend = model.model_runner.attn_backend
    rows = []  # rows each indexer call to the backend sees: only the real ones, under the graph

    def recording(method):
        def call(layer_id, tensor, *args):
            rows.append((method.__name__, layer_id, tensor.shape[0], *(a.shape[0] for a in args[:1])))
            return method(layer_id, tensor, *args)
        return call

    static = padded(batch.forward_batch, bucket=144)
    backend.init_forward_metadata(batch.forward_batch)  # on the live batch, before the replay
    with (
        graph_scope(model, static, n),
        mock.patch.object(backend, "store_index_k", recording(backend.store_index_k)),
        mock.patch.object(backend, "index_topk", recording(backend.index_topk)),
    ):
        got = inner(static.input_ids, static.positions, static, plan=plan)
        got_topk = inner.topk_buffer._storage[:144].clone()
    # the full layers' index keys and top-k, on the real rows only (captured, padded rows would
    # freeze the capture batch's layout and write keys at the padding's KV slot)
    assert [(name, layer) for name, layer, *_ in rows] == [
        (name, layer) for layer in (0, 3, 5) for name in ("store_index_k", "index_topk")]
    assert all(shape == [n, n] if name == "store_index_k" else shape[0] == n
               for name, _, *shape in rows), rows
    assert inner.topk_buffer.source_layer == 5
    torch.testing.assert_close(got[:n], want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_topk[:n], want_topk)
    assert (got_topk[n:] == -1).all()


def mtp_draft(model):
    """The plugin's MTP draft on the target's runner, from the mini checkpoint's MTP layer, with the
    launch key on. Its one layer (id 0) uses the target's layer-0 KV slots: both passes below
    write the same rows there."""
    from safetensors.torch import load_file
    from sglang.srt.runtime_context import get_model

    from sglang_glm.models.glm_dsa_nextn import GlmMoeDsaForCausalLMNextN

    target, runner = model.model, model.model_runner
    settings = dataclasses.replace(target.settings, draft_prefill_graphs=True)
    with get_model().override(shared_experts=target.shared_experts_config):
        draft = GlmMoeDsaForCausalLMNextN(runner.model_config.hf_config, settings=settings)
        eager_only = GlmMoeDsaForCausalLMNextN(
            runner.model_config.hf_config, settings=dataclasses.replace(settings, draft_prefill_graphs=False))
    # the `layers` view is there only when asked and registers nothing: parameter names (and the
    # checkpoint mapping) as without it
    assert draft.model.layers == [draft.model.decoder] and not hasattr(eager_only.model, "layers")
    assert [n for n, _ in draft.named_parameters()] == [n for n, _ in eager_only.named_parameters()]
    draft.load_weights(load_file(MINI / "model.safetensors").items())
    draft.set_embed_and_head(*target.get_embed_and_head())
    draft.allocate_forward_buffers(1024, runner.req_to_token_pool.req_to_token.shape[0], model.device)
    return draft


def draft_extend_batch(live, hidden, tail_tokens):
    """The draft's prefill pass as SGLang's EAGLE worker builds it (`_draft_extend_for_prefill`):
    each prompt shifted left by one plus its sampled token, the target's hidden, LAST capture."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

    fb = copy.copy(live)
    ids, start = [], 0
    for length, tail in zip(live.extend_seq_lens_cpu, tail_tokens):
        ids += [*live.input_ids[start + 1 : start + length].tolist(), tail]
        start += length
    fb.input_ids = torch.tensor(ids, dtype=live.input_ids.dtype, device=live.input_ids.device)
    fb.spec_info = EagleDraftExtendInput(hidden_states=hidden, num_tokens_per_req=1,
                                         num_tokens_for_logprob_per_req=1)
    fb.capture_hidden_mode = CaptureHiddenMode.LAST
    return fb


def simulated_breakable_draft_prefill_matches_eager():
    """The draft's prefill pass as `PrefillCudaGraphRunner._execute_body_capture` runs it: the outer
    `GlmMoeDsaForCausalLMNextN.forward` eagerly on the static batch, its body (`layer_model.forward`,
    called as the runner calls it) under the graph contexts, `spec_info.hidden_states` the runner's
    static buffer padded to the bucket (stale rows past the real ones)."""
    from sglang.srt.model_executor.model_runner_components.layer_setup import compute_attention_and_moe_layers
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
        _build_layer_model_forward_kwargs, _resolve_transformer_layer_model,
    )

    from sglang_glm.models.glm_dsa_nextn import DRAFT_LAYER_ID

    model = in_process_model()
    draft = mtp_draft(model)
    body = _resolve_transformer_layer_model(draft)  # what SGLang's runner captures
    assert body is draft.model
    assert compute_attention_and_moe_layers(body).attention_layers == [draft.model.decoder.self_attn.attn]

    gen = torch.Generator().manual_seed(1)
    batch = model._make_batch([torch.randint(2, 250, (n,), generator=gen).tolist() for n in (100, 37)])
    n, bucket = batch.num_tokens, 144
    hidden = model.forward_whole(batch, model.built_plan)  # the target's prefill, then the draft's
    live = draft_extend_batch(batch.forward_batch, hidden, tail_tokens=[5, 9])
    slots = live.req_pool_indices
    backend = model.model_runner.attn_backend

    backend.init_forward_metadata(live)
    with model._context(batch):
        want = draft(live.input_ids, live.positions, live)
        want_pre, want_post = draft.model(live.input_ids, live.positions, live)
    want_rows = draft.model.topk_buffer.read(DRAFT_LAYER_ID).clone()
    want_shared = draft._shared.rows[slots].clone()
    draft._shared.rows.fill_(-1)
    draft.model.topk_buffer._storage.fill_(7)  # stale rows from an earlier forward

    static = padded(live, bucket)
    stale = torch.randn(bucket, hidden.shape[1], generator=gen)
    stale[:n] = hidden  # the runner refreshes only the live prefix of its static buffer
    static.spec_info = dataclasses.replace(live.spec_info, hidden_states=stale)
    body_out = []

    def replay(*unused_args, **unused_kwargs):
        """What a replay leaves: the body's tensors, none of its Python state (the top-k buffer as
        the last capture, a 4-token bucket, left it)."""
        out = body_forward(static.input_ids, static.positions, static,
                           **_build_layer_model_forward_kwargs(body, static, None))
        draft.model.topk_buffer.begin_forward(4)
        draft.model.topk_buffer.claim(DRAFT_LAYER_ID)
        body_out.append(out)
        return out

    body_forward = body.forward
    backend.init_forward_metadata(live)  # the runner's metadata: the live batch, before the replay
    with graph_scope(model, static, n), mock.patch.object(body, "forward", replay):
        got = draft(static.input_ids, static.positions, static)
    (got_pre, got_post), = body_out
    torch.testing.assert_close(got_pre[:n], want_pre, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_post[:n], want_post, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.next_token_logits, want.next_token_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.hidden_states, want.hidden_states, rtol=1e-5, atol=1e-5)
    rows = draft.model.topk_buffer.rows(bucket)
    assert torch.equal(rows[:n], want_rows) and (rows[n:] == -1).all()
    assert torch.equal(draft._shared.rows[slots], want_shared)  # each request's last prompt token


if __name__ == "__main__":
    {"target": simulated_breakable_prefill_matches_eager,
     "draft": simulated_breakable_draft_prefill_matches_eager}[sys.argv[1]]()
