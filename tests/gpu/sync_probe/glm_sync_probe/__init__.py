"""Test-only SGLang plugin (tests/gpu): counts host synchronisations inside served decode steps.

Put this folder on the server's PYTHONPATH and set GLM_SYNC_PROBE_LOG; SGLang finds the plugin
through its entry point. Every target-model DECODE forward of `ModelRunner.forward` (CUDA-graph
replay or eager) runs under `torch.cuda.set_sync_debug_mode("warn")`; each synchronising CUDA call
is recorded with the Python stack that made it, one JSON line per decode step.
"""

import json
import os
import traceback
import warnings


def _probe(original, runner, forward_batch, *args, **kwargs):
    import torch

    mode = forward_batch.forward_mode
    if not mode.is_decode() or runner.is_draft_worker:
        return original(runner, forward_batch, *args, **kwargs)
    syncs = []

    def show(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing" in str(message):
            stack = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-1]]
            syncs.append({"message": str(message)[:200], "stack": stack[-12:]})

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            return original(runner, forward_batch, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            with open(os.environ["GLM_SYNC_PROBE_LOG"], "a") as f:
                f.write(json.dumps({"batch_size": forward_batch.batch_size, "syncs": syncs}) + "\n")


def register():
    if not os.environ.get("GLM_SYNC_PROBE_LOG"):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.model_executor.model_runner.ModelRunner.forward", _probe, HookType.AROUND
    )
