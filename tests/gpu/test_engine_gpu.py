"""The plugin in `sglang.Engine` on a CUDA GPU, graphs against eager, and no host sync in decode.

`sgl.Engine` with CUDA graphs (SGLang's default) gives the same tokens as the eager server; a
served decode step of the Triton backend (graph replay and eager) makes no synchronising CUDA
call, checked by a test-only SGLang plugin (tests/gpu/sync_probe) that runs every target decode
forward under `torch.cuda.set_sync_debug_mode("warn")`.
"""

import json
import os
from pathlib import Path

import pytest

from gpu_serving import PROMPTS, NEW_TOKENS, agreement, generate, gpu_server, record, results_dir, tokens

pytestmark = pytest.mark.gpu

PROBE = Path(__file__).parent / "sync_probe"


def test_engine_with_cuda_graphs_matches_eager_server(models):
    import sglang as sgl

    glm52 = models["glm52"]
    llm = sgl.Engine(model_path=str(glm52), dtype="bfloat16", mem_fraction_static=0.06, max_total_tokens=32768,
                     max_running_requests=16, cuda_graph_max_bs_decode=16, chunked_prefill_size=512, sampling_backend="pytorch",
                     grammar_backend="none", log_level="warning")
    try:
        outs = llm.generate(input_ids=PROMPTS, sampling_params={"temperature": 0, "max_new_tokens": NEW_TOKENS,
                                                                 "ignore_eos": True}, return_logprob=True)
    finally:
        llm.shutdown()
    with gpu_server(glm52, "engine_eager_twin", "--disable-cuda-graph") as url:
        eager = generate(url, PROMPTS)
    result = agreement(glm52, PROMPTS, outs)
    record("engine_graphs", identical_to_eager=tokens(outs) == tokens(eager), **result.as_dict())
    assert tokens(outs) == tokens(eager)
    result.assert_agrees()


@pytest.mark.parametrize("graphs", [True, False])
def test_decode_step_makes_no_host_sync(models, graphs):
    glm52 = models["glm52"]
    name = f"sync_probe_{'graphs' if graphs else 'eager'}"
    log = results_dir() / f"{name}.jsonl"
    log.unlink(missing_ok=True)
    env = {"GLM_SYNC_PROBE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(PROBE), os.environ.get("PYTHONPATH", "")])}
    args = () if graphs else ("--disable-cuda-graph",)
    with gpu_server(glm52, name, *args, env=env) as url:
        generate(url, PROMPTS, max_new_tokens=8)
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    syncs = [s for step in steps for s in step["syncs"]]
    record(name, decode_steps=len(steps), syncs=len(syncs), first=syncs[:3])
    assert steps, "the probe saw no decode step"
    assert not syncs, syncs[:3]
