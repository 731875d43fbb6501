"""No kernel compiles inside a request (issue 31): a fresh server's first 32K prompt, after start-up.

A test-only SGLang plugin (tests/gpu/compile_probe) logs every Triton kernel variant a server
process builds. After the server answers /health (start-up, the plugin's kernel warm-up in its
backend and its prefill warm-up requests, SGLang's own warm-up request), one 32K-token prompt is
served; every variant built while it runs is a compile inside a user's request.
"""

import json
import os
import time
from pathlib import Path

import pytest

from gpu_serving import generate, gpu_server, make_model, record, results_dir

pytestmark = pytest.mark.gpu

PROBE = Path(__file__).parent / "compile_probe"
LONG = 32768


def test_first_long_prompt_compiles_nothing(models):
    path = make_model(models["glm52"].parent, "glm52_long_context", seed=3,
                      overrides={"max_position_embeddings": 2 * LONG})
    log = results_dir() / "compile_probe_long_prompt.jsonl"
    log.unlink(missing_ok=True)
    env = {"GLM_COMPILE_PROBE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(PROBE), os.environ.get("PYTHONPATH", "")])}
    prompt = [(7 * i + 3) % 500 + 2 for i in range(LONG)]
    with gpu_server(path, "cold_long_prompt", "--max-total-tokens", str(2 * LONG), env=env) as url:
        ready = time.time()
        t0 = time.perf_counter()
        generate(url, [prompt], max_new_tokens=8)
        first_s = time.perf_counter() - t0
    assert log.exists(), "the compile probe logged nothing: it did not load in the server, so it proves nothing"
    builds = [json.loads(line) for line in log.read_text().splitlines()]
    in_request = [b for b in builds if b["time"] > ready]
    record("cold_long_prompt", first_request_s=round(first_s, 3), builds_at_start_up=len(builds) - len(in_request),
           builds_in_request=len(in_request), kernels=sorted({b["kernel"] for b in in_request}))
    assert len(builds) > len(in_request), "no build at start-up: the probe saw no process's kernels"
    assert not in_request, f"{len(in_request)} kernel variants compiled inside the request: {in_request[:5]}"
