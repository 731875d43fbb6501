"""Shared helpers for tests that run real SGLang (Engine or HTTP server) and the transformers oracle."""

from __future__ import annotations

import contextlib
import itertools
import json

import torch

from sglang_glm.cpu_compat import CPU_ENGINE_ARGS
from sglang_glm_tools.server import cpu_server, failed_launch  # noqa: F401

ENGINE_DEFAULTS = dict(**CPU_ENGINE_ARGS, max_running_requests=16, log_level="warning")


@contextlib.contextmanager
def engine(model_path, **kwargs):
    import sglang as sgl

    args = {**ENGINE_DEFAULTS, **kwargs}
    if "json_model_override_args" in args and not isinstance(args["json_model_override_args"], str):
        args["json_model_override_args"] = json.dumps(args["json_model_override_args"])
    llm = sgl.Engine(model_path=str(model_path), **args)
    try:
        yield llm
    finally:
        llm.shutdown()


def greedy(llm, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    out = llm.generate(
        input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": max_new_tokens}
    )
    return [o["output_ids"] for o in out]


def hf_greedy(model_path, prompts, max_new_tokens: int, **config_overrides) -> list[list[int]]:
    """transformers' GlmMoeDsaForCausalLM, float32, greedy: the oracle."""
    from transformers import GlmMoeDsaForCausalLM

    model = GlmMoeDsaForCausalLM.from_pretrained(
        str(model_path), dtype=torch.float32, **config_overrides
    ).eval()
    outs = []
    for p in prompts:
        ids = model.generate(
            torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )
        outs.append(ids[0, len(p):].tolist())
    return outs


# Batched and single-request float32 forwards round differently; a greedy step whose float64 top-2
# logits are this close may flip between them, anything wider may not.
NEAR_TIE = 1e-3
# The same holds for the indexer: a query row whose k-th and (k+1)-th float64 index scores are this
# close (relative to its top score; float32 rounds them ~1e-7) may pick the other key at the top-k
# boundary, and that swap can move a later logit by more than NEAR_TIE.
INDEX_NEAR_TIE = 1e-5


@contextlib.contextmanager
def _topk_selection(record=None, swap=None):
    """The float64 reference's top-k select, watched: `record` gets (call, row, relative boundary gap)
    for every near-tie at the top-k boundary; `swap` = (call, row) takes that row's (k+1)-th key in
    place of its k-th. Calls count the indexer runs of one forward, full layer by full layer."""
    import sglang_glm_tools.reference.layers as layers

    select, calls = layers.select_topk, itertools.count()

    def watched(scores, causal, k):
        call, chosen = next(calls), select(scores, causal, k)
        swapped = swap is not None and swap[0] == call
        if scores.shape[-1] <= k or not (record is not None or swapped):
            return chosen
        top = scores.masked_fill(~causal, float("-inf"))[0].topk(k + 1, dim=-1)
        gap = (top.values[:, k - 1] - top.values[:, k]) / top.values[:, 0].abs().clamp_min(1e-30)
        if record is not None:
            record.extend((call, row, float(gap[row])) for row in (gap <= INDEX_NEAR_TIE).nonzero().flatten().tolist())
        if swapped:
            row = swap[1]
            chosen = chosen.clone()
            chosen[0, row, top.indices[row, k - 1]] = False
            chosen[0, row, top.indices[row, k]] = True
        return chosen

    layers.select_topk = watched
    try:
        yield
    finally:
        layers.select_topk = select


@torch.no_grad()
def reference_steps(model_path, prompt: list[int], output: list[int], swap=None) -> list[tuple[int, float]]:
    """(greedy token, top-2 logit margin) of the float64 reference at each step of `output`,
    teacher-forced on prompt + output (with one top-k boundary key swapped, see _topk_selection)."""
    from sglang_glm_tools.reference import load_reference_model

    model = load_reference_model(model_path, dtype=torch.float64)
    with _topk_selection(swap=swap):
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    top2 = logits.topk(2, dim=-1)
    return [(int(t), float(v[0] - v[1])) for t, v in zip(top2.indices[:, 0], top2.values)]


@torch.no_grad()
def _boundary_near_ties(model_path, ids: list[int], rows: int) -> list[tuple[int, int, float]]:
    """(call, row, gap) of the float64 reference's top-k boundary near-ties in the first `rows` rows,
    closest first."""
    from sglang_glm_tools.reference import load_reference_model

    found: list = []
    with _topk_selection(record=found):
        load_reference_model(model_path, dtype=torch.float64)(torch.tensor([ids]))
    return sorted((t for t in found if t[1] < rows), key=lambda t: t[2])


def _follows(steps, got, start) -> bool:
    return all(got[k] == token or margin <= NEAR_TIE for k, (token, margin) in enumerate(steps[start:], start=start))


def assert_same_up_to_near_tie(model_path, prompt, got: list[int], want: list[int], what: str) -> bool:
    """`got` equals `want`, or first differs where the float64 reference nearly ties (its top-2 logits,
    or a top-k boundary of the indexer before that token) and from there on is that reference's greedy
    continuation (near-ties allowed). True if a near-tie was taken."""
    if got == want:
        return False
    assert len(got) == len(want), f"{what}: {len(got)} tokens, expected {len(want)}"
    j = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
    _, margin = reference_steps(model_path, prompt, want)[j]
    if margin <= NEAR_TIE:
        steps = reference_steps(model_path, prompt, got)
        assert _follows(steps, got, j), (
            f"{what}: after the near-tie at token {j}, {got[j:]} is not the float64 reference's greedy "
            f"continuation {[t for t, _ in steps[j:]]}"
        )
        return True
    # token j is read off row len(prompt) + j - 1: a swap in any row up to it can change it
    ties = _boundary_near_ties(model_path, prompt + got, len(prompt) + j)
    for call, row, _ in ties:
        if _follows(reference_steps(model_path, prompt, got, swap=(call, row)), got, j):
            return True
    raise AssertionError(
        f"{what}: token {j} is {got[j]}, expected {want[j]}, and the float64 reference's top-2 margin there "
        f"is {margin:.2e} (> {NEAR_TIE:g}): not a rounding flip, nor explained by swapping the top-k "
        f"boundary key of any of its {len(ties)} index-score near-ties (<= {INDEX_NEAR_TIE:g}) before it"
    )


# One way to run a server, shared with the demo and the benchmarks.
http_server = cpu_server
