"""The plugin's prefill under SGLang's breakable CUDA graphs, as far as CPU can check it.

SGLang's breakable prefill graph captures `GlmDsaModel.forward` on a batch padded to a token bucket
and runs RadixAttention (and the plugin's indexer break, `GlmDsaIndexer.select_into`) eagerly on the
real rows between captured segments. With no capture running, SGLang's `eager_on_graph` calls the
break directly, so the same forward under SGLang's own graph contexts (breakable scope, prefill graph
scope, the static batch the runner sets) is what a replay computes. It must equal the eager prefill on
the real rows, with the top-k buffer's padded rows -1. The GPU suite runs the captured version.

The check runs in its own process: the in-process model runner publishes SGLang's process-wide
runtime context (a one-rank topology), which later Engine tests in the same pytest process would
inherit (the tensor-parallel engine test then fails its topology check).
"""

import copy
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


def test_prefill_under_a_simulated_breakable_graph_matches_eager():
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def simulated_breakable_prefill_matches_eager():
    model = in_process_model()
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        enable_breakable_cuda_graph,
    )
    from sglang.srt.model_executor.runner_utils.forward_batch import set_forward_batch
    from sglang.srt.model_executor.runner_utils.prefill_graph import prefill_graph_scope
    from sglang.srt.runtime_context import get_model

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
        torch.no_grad(),
        get_model().override(shared_experts=model.model.shared_experts_config),
        enable_breakable_cuda_graph(),
        prefill_graph_scope(full_graph=False, raw_num_tokens=n),
        set_forward_batch(static),
        forward_context(ForwardContext(attn_backend=backend), forward_batch=static),
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


if __name__ == "__main__":
    simulated_breakable_prefill_matches_eager()
