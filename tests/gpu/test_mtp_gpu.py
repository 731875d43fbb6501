"""MTP rounds on the GPU: every speculative phase replays a CUDA graph, at every batch size served.

A test-only SGLang plugin (tests/gpu/graph_probe) records, for each forward pass, its phase and
whether it replayed a graph: target verify, the draft steps and draft-extend (the MTP layer over the
verified window) must all replay, with SGLang's overlap scheduler on (its default), for chains and
trees, at batch sizes from 1 to the largest captured one. A silent fall-back to eager fails here.
The draft-extend after a prefill (ragged prompt lengths) is eager by SGLang's design, unless the
launch asks for the draft's prefill graphs (`mtp_draft_prefill_graphs`, last test); passes before
the server is up (graph capture runs the draft steps eagerly) are not counted. The last test serves
the draft's FP8 LM head (`mtp_draft_head_fp8`).
"""

import json
import os
from pathlib import Path

import pytest

from gpu_serving import CHAIN, PROMPTS, TREE, agreement, generate, gpu_server, record, results_dir, serve_and_judge

pytestmark = pytest.mark.gpu

PROBE = Path(__file__).parent / "graph_probe"
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


def test_fp8_draft_head(models):
    """`mtp_draft_head_fp8: true` (EAGLE 3/4, graphs on): SGLang's block-FP8 GEMM on the draft head's copy
    matches the plugin's reference of the same rounded operands, the server drafts through it (its
    start-up line), and the tokens agree with the reference: the verify keeps the BF16 head."""
    import torch

    from sglang_glm.mtp.draft_head import Fp8DraftHead, fp8_head_logits_ref

    torch.manual_seed(0)
    head = Fp8DraftHead((torch.randn(1000, 512, device="cuda") * 0.02).bfloat16())
    for tokens in (1, 4, 37):
        x = torch.randn(tokens, 512, device="cuda").bfloat16()
        got = head.quant_method.apply(head, x).float()
        want = fp8_head_logits_ref(x.float(), head.weight, head.weight_scale_inv)
        assert ((got - want).norm() / want.norm()).item() < 1e-2, tokens

    name = "fp8_draft_head"
    args = (*CHAIN, "--json-model-override-args", json.dumps({"mtp_draft_head_fp8": True}))
    with gpu_server(models["glm52"], name, *args) as url:
        _, result, _ = serve_and_judge(url, models["glm52"], name)
    server_log = (results_dir() / f"server_{name}.log").read_text()
    assert "GLM-DSA MTP draft head: block-FP8 copy of the LM head" in server_log, server_log[-3000:]
    result.assert_agrees()
