"""MTP rounds on the GPU: every speculative phase replays a CUDA graph, at every batch size served.

A test-only SGLang plugin (tests/gpu/graph_probe) records, for each forward pass, its phase and
whether it replayed a graph: target verify, the draft steps and draft-extend (the MTP layer over the
verified window) must all replay, with SGLang's overlap scheduler on (its default), for chains and
trees, at batch sizes from 1 to the largest captured one. A silent fall-back to eager fails here.
The draft-extend after a prefill (ragged prompt lengths) is eager by SGLang's design, unless the
launch asks for the draft's prefill graphs (`mtp_draft_prefill_graphs`, last test); passes before
the server is up (graph capture runs the draft steps eagerly) are not counted.
"""

import json
import os
from pathlib import Path

import pytest

from gpu_serving import PROMPTS, agreement, generate, gpu_server, record, results_dir, serve_and_judge

pytestmark = pytest.mark.gpu

PROBE = Path(__file__).parent / "graph_probe"
CHAIN = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")
TREE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6")
BATCHES = (1, 3, 8, 16)  # 16: the suite's --cuda-graph-max-bs-decode
ROUND_PHASES = ("target_verify", "draft_steps", "draft_extend")


def probe_env(log: Path) -> dict:
    log.unlink(missing_ok=True)
    return {"GLM_GRAPH_PROBE_LOG": str(log),
            "PYTHONPATH": os.pathsep.join([str(PROBE), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("name, args", [("graph_phases_chain", CHAIN), ("graph_phases_tree", TREE)])
def test_every_speculative_phase_replays_a_graph(models, name, args):
    log = results_dir() / f"{name}.jsonl"
    env = probe_env(log)
    prompts = [PROMPTS[i % len(PROMPTS)][: 40 + 13 * i] for i in range(max(BATCHES))]
    outs = []
    with gpu_server(models["glm52"], name, *args, env=env) as url:
        # passes before the server is up are graph capture and warm-up (they run the model eagerly)
        start = len(log.read_text().splitlines()) if log.exists() else 0
        for batch in BATCHES:
            outs += generate(url, prompts[:batch], max_new_tokens=16)
    passes = [json.loads(line) for line in log.read_text().splitlines()[start:]]
    seen = {phase: sorted({p["batch_size"] for p in passes if p["phase"] == phase}) for phase in ROUND_PHASES}
    eager = [p for p in passes if p["phase"] in ROUND_PHASES and not p["graph"]]
    result = agreement(models["glm52"], [p for b in BATCHES for p in prompts[:b]], outs)
    record(name, passes=len(passes), batch_sizes=seen, eager=eager[:5], **result.as_dict())
    assert not eager, f"{len(eager)} round passes ran eagerly: {eager[:5]}"
    for phase in ROUND_PHASES:  # batch 1 and some batch past 8 (prefills and finishes interleave)
        assert seen[phase] and seen[phase][0] == 1 and seen[phase][-1] > 8, (phase, seen[phase])
    result.assert_agrees()


def test_draft_prefill_under_breakable_cuda_graphs(models):
    """`mtp_draft_prefill_graphs: true` with `--cuda-graph-backend-prefill breakable` (EAGLE 3/4): SGLang
    captures the MTP draft's prefill pass as well (its indexer's store + top-k an eager break, as in the
    target's full layers), the draft's prefills replay it, and the tokens agree with the reference
    (ragged batch, chunked long prompt, radix-cache repeat)."""
    name = "draft_prefill_graphs"
    log = results_dir() / f"{name}.jsonl"
    args = ("--cuda-graph-backend-prefill", "breakable", "--cuda-graph-max-bs-prefill", "1024", *CHAIN,
            "--json-model-override-args", json.dumps({"mtp_draft_prefill_graphs": True}))
    with gpu_server(models["glm52"], name, *args, env=probe_env(log)) as url:
        start = len(log.read_text().splitlines()) if log.exists() else 0
        _, result, _ = serve_and_judge(url, models["glm52"], name)
    server_log = (results_dir() / f"server_{name}.log").read_text()
    passes = [json.loads(line) for line in log.read_text().splitlines()[start:]]
    prefills = [p for p in passes if p["phase"] == "draft_extend_prefill"]
    replays = sum(p["graph"] for p in prefills)
    record(name + "_draft_prefills", draft_prefills=len(prefills), graph_replays=replays)
    assert "Capture draft prefill CUDA graph end" in server_log, server_log[-3000:]
    assert "GLM-DSA MTP draft prefill: captured" in server_log
    assert replays > 0, prefills[-5:]
    result.assert_agrees()
