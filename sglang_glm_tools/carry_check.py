"""Which MTP carry does this checkpoint want? Serve it both ways and compare acceptance.

A draft layer trained with the post-norm carry and served with the pre-norm one (or the reverse) is
still lossless, only slower: nothing fails, acceptance just drops. This tool serves a few hundred
tokens of the checkpoint with each carry (`mtp_recycle_hidden`), greedy, with SGLang's EAGLE drafting,
checks that both give the same tokens, and prints acceptance for each and the override to use:

    python -m sglang_glm_tools.carry_check --model PATH --data FILE [--steps 5]

On a machine without CUDA it serves on the CPU (float32, the plugin's CPU compatibility layer), where
the two carries' tokens must be identical. On a GPU it serves the checkpoint's bfloat16 with SGLang's
defaults (CUDA graphs); bfloat16 is not token-exact across the different verify batches the two
carries make, so there the share of identical tokens is reported instead of required.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sglang_glm.mtp.acceptance import AcceptanceStats
from sglang_glm.mtp.recycle import FIELD, POST_NORM, PRE_NORM, resolve_recycle_policy

CARRIES = (POST_NORM, PRE_NORM)
# Accept-length differences below this are noise at a few hundred tokens: no recommendation to switch.
CLEAR_GAIN = 0.1


@dataclass
class CarryResult:
    accept_length: float
    accept_rate: float
    per_position: list[float]
    rounds: int
    tokens: list[list[int]] = field(repr=False)

    def as_dict(self) -> dict:
        return {"accept_length": self.accept_length, "accept_rate": self.accept_rate,
                "per_position": self.per_position, "rounds": self.rounds}


def prompts_from(text: str, tokenizer, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens, spread evenly over the text."""
    stride = max(len(text) // max(n, 1), 1)
    prompts = [tokenizer(text[i * stride: i * stride + 8 * length])["input_ids"][:length] for i in range(n)]
    if any(len(p) < length for p in prompts):
        raise ValueError(f"--data has too little text for {n} prompts of {length} tokens; give a longer file")
    return prompts


def engine_args(on_gpu: bool) -> dict:
    if on_gpu:
        # graphs for the check's own batch sizes only: capturing SGLang's default list costs more than the check
        return {"log_level": "warning", "cuda_graph_max_bs_decode": 8}
    from sglang_glm.cpu_compat import CPU_ENGINE_ARGS

    return {**CPU_ENGINE_ARGS, "log_level": "warning"}


def serve(model: Path, prompts, new_tokens: int, steps: int, carry: str, base: dict) -> CarryResult:
    import sglang as sgl

    llm = sgl.Engine(
        model_path=str(model), speculative_algorithm="EAGLE", speculative_num_steps=steps,
        speculative_eagle_topk=1, speculative_num_draft_tokens=steps + 1,
        json_model_override_args=json.dumps({FIELD: carry}), **base,
    )
    try:
        outs = llm.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": new_tokens})
    finally:
        llm.shutdown()
    stats = AcceptanceStats()
    for o in outs:
        stats.add_meta_info(o["meta_info"])
    return CarryResult(stats.mean_accept_length, stats.accept_rate(steps), stats.per_position(steps),
                       stats.rounds, [o["output_ids"] for o in outs])


def check(model: Path, prompts, new_tokens: int = 48, steps: int = 5, on_gpu: bool | None = None) -> dict:
    """Both carries served; {"results": {carry: CarryResult}, "default": ..., "recommended": ...}."""
    import torch
    from transformers import AutoConfig

    if on_gpu is None:
        on_gpu = torch.cuda.is_available()
    if not on_gpu:
        from sglang_glm.cpu_compat import activate

        activate()
    base = engine_args(on_gpu)
    results = {carry: serve(model, prompts, new_tokens, steps, carry, base) for carry in CARRIES}
    same = token_agreement(results[POST_NORM].tokens, results[PRE_NORM].tokens)
    if same < 1 and not on_gpu:
        raise RuntimeError("the two carries served different greedy tokens in float32: speculative decoding "
                           "is not lossless here; report this as a bug, the acceptance figures are meaningless")
    result = recommend(results, resolve_recycle_policy(AutoConfig.from_pretrained(str(model))))
    return {**result, "identical_tokens": same}


def token_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions where two greedy generations of the same prompts hold the same token."""
    pairs = [(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb)]
    total = max(sum(max(len(sa), len(sb)) for sa, sb in zip(a, b)), 1)
    return sum(x == y for x, y in pairs) / total


def recommend(results: dict, default: str) -> dict:
    """The carry to serve with: the one that accepts clearly more, else the checkpoint's default."""
    best = max(CARRIES, key=lambda c: results[c].accept_length)
    gain = results[best].accept_length - results[default].accept_length
    return {"results": results, "default": default, "recommended": best if gain >= CLEAR_GAIN else default,
            "gain": gain}


def report(check_result: dict, steps: int) -> str:
    results, default, rec = check_result["results"], check_result["default"], check_result["recommended"]
    lines = [f"{'carry':<10} {'accept length':>13} {'accept rate':>11}   per-position acceptance (1..{steps})"]
    for carry, r in results.items():
        mark = " (default)" if carry == default else ""
        lines.append(f"{carry:<10} {r.accept_length:>13.3f} {r.accept_rate:>11.3f}   "
                     + " ".join(f"{p:.2f}" for p in r.per_position) + mark)
    if rec != default:
        lines.append(f"WARNING: this checkpoint's default carry ({default}) accepts "
                     f"{check_result['gain']:.2f} tokens per round less than {rec}.")
    if check_result.get("identical_tokens", 1) < 1:
        lines.append(f"the carries' greedy tokens agree at {check_result['identical_tokens']:.1%} of positions "
                     "(bfloat16 on a GPU is not token-exact across batch shapes)")
    lines.append(f"use: --json-model-override-args '{json.dumps({FIELD: rec})}'"
                  + ("" if rec != default else " (the default; no override needed)"))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="checkpoint directory with an MTP layer")
    ap.add_argument("--data", type=Path, required=True, help="text file to take prompts from")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=5, help="draft steps (speculative-num-steps)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    prompts = prompts_from(a.data.read_text(), AutoTokenizer.from_pretrained(str(a.model)), a.prompts, a.prompt_len)
    result = check(a.model, prompts, a.new_tokens, a.steps)
    print(report(result, a.steps))
    if a.json:
        a.json.write_text(json.dumps({"default": result["default"], "recommended": result["recommended"],
                                      "identical_tokens": result["identical_tokens"],
                                      **{c: r.as_dict() for c, r in result["results"].items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
