"""Shared helpers for tests that run real SGLang (Engine or HTTP server) and the transformers oracle."""

from __future__ import annotations

import contextlib
import json

import torch

from sglang_glm.cpu_compat.server import cpu_server, failed_launch, free_port  # noqa: F401

# Small pools keep several engines within the CPU machine's memory; float32 for exact tokens.
ENGINE_DEFAULTS = dict(
    dtype="float32",
    device="cpu",
    disable_cuda_graph=True,
    max_total_tokens=8192,
    max_running_requests=16,
    log_level="warning",
)


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


# One way to run a server, shared with the demo and the benchmarks.
http_server = cpu_server
