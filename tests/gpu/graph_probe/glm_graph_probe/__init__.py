"""Test-only SGLang plugin (tests/gpu): which phase of each speculative round replayed a CUDA graph.

Put this folder on the server's PYTHONPATH and set GLM_GRAPH_PROBE_LOG; SGLang finds the plugin
through its entry point. One JSON line per forward pass: {"phase", "batch_size", "graph"}, where
phase is target_decode, target_verify, draft_extend (after a verify), draft_extend_prefill or
draft_steps (EAGLE's draft steps 1+: one record per round when its multi-step graph replays, one per
step when they run eagerly). Graph passes are seen at the graph runners' execute(); eager ones at
ModelRunner.forward, which a graph replay of the draft steps or of draft-extend never reaches.
"""

import json
import os


def _write(phase, batch_size, graph):
    with open(os.environ["GLM_GRAPH_PROBE_LOG"], "a") as f:
        f.write(json.dumps({"phase": phase, "batch_size": int(batch_size), "graph": bool(graph)}) + "\n")


def _runner_forward(original, runner, forward_batch, *args, **kwargs):
    out = original(runner, forward_batch, *args, **kwargs)
    mode = forward_batch.forward_mode
    if runner.is_draft_worker:
        phase = ("draft_steps" if mode.is_decode() else "draft_extend" if mode.is_draft_extend_v2()
                 else "draft_extend_prefill" if mode.is_extend() else None)
    else:
        phase = "target_verify" if mode.is_target_verify() else "target_decode" if mode.is_decode() else None
    if phase is not None:
        _write(phase, forward_batch.batch_size, out.can_run_graph)
    return out


def _draft_steps_replay(original, graph_runner, forward_batch, *args, **kwargs):
    _write("draft_steps", forward_batch.batch_size, True)
    return original(graph_runner, forward_batch, *args, **kwargs)


def _draft_extend_replay(original, graph_runner, forward_batch, *args, **kwargs):
    _write("draft_extend", forward_batch.batch_size, True)
    return original(graph_runner, forward_batch, *args, **kwargs)


def register():
    if not os.environ.get("GLM_GRAPH_PROBE_LOG"):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn in (
        ("sglang.srt.model_executor.model_runner.ModelRunner.forward", _runner_forward),
        ("sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.execute",
         _draft_steps_replay),
        ("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner.execute",
         _draft_extend_replay),
    ):
        HookRegistry.register(target, fn, HookType.AROUND)
