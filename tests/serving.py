"""Shared helpers for tests that run real SGLang (Engine or HTTP server) and the transformers oracle."""

from __future__ import annotations

import contextlib
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


@torch.no_grad()
def reference_steps(model_path, prompt: list[int], output: list[int]) -> list[tuple[int, float]]:
    """(greedy token, top-2 logit margin) of the float64 reference at each step of `output`,
    teacher-forced on prompt + output."""
    from sglang_glm_tools.reference import load_reference_model

    model = load_reference_model(model_path, dtype=torch.float64)
    logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    top2 = logits.topk(2, dim=-1)
    return [(int(t), float(v[0] - v[1])) for t, v in zip(top2.indices[:, 0], top2.values)]


def assert_same_up_to_near_tie(model_path, prompt, got: list[int], want: list[int], what: str) -> bool:
    """`got` equals `want`, or first differs at a float64 near-tie of `want` and from there on is
    the float64 reference's greedy continuation (near-ties allowed). True if a near-tie was taken."""
    if got == want:
        return False
    assert len(got) == len(want), f"{what}: {len(got)} tokens, expected {len(want)}"
    j = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
    _, margin = reference_steps(model_path, prompt, want)[j]
    assert margin <= NEAR_TIE, (
        f"{what}: token {j} is {got[j]}, expected {want[j]}, and the float64 reference's top-2 margin "
        f"there is {margin:.2e} (> {NEAR_TIE:g}): not a rounding flip"
    )
    for k, (token, margin) in enumerate(reference_steps(model_path, prompt, got)[j:], start=j):
        assert got[k] == token or margin <= NEAR_TIE, (
            f"{what}: after the near-tie at token {j}, token {k} is {got[k]}, the float64 reference "
            f"gives {token} by a margin of {margin:.2e}"
        )
    return True


# One way to run a server, shared with the demo and the benchmarks.
http_server = cpu_server
