"""FP8 KV cache vs float32 cache on the bundled model, served by SGLang on CPU (glm_dsa_torch).

Teacher-forced: held-out windows (benchmarks/train/data/heldout.txt, never trained on) go in as
prompts; at every position, next-token agreement of the two caches' top-1 and the mean |delta
logprob| of the true next token; also the float32 top-1/top-2 margin at each position where the
top-1 tokens differ. Greedy: 64 new tokens from each window's first 128 tokens; agreement per
position up to the first divergence and whole-sequence agreement.
Writes results.json and results.md next to this script (results-<model>.* for another --model).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fp8_kv/quality.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fp8_kv/quality.py --model assets/glm-dsa-mini-chat
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
MODEL = ROOT / "assets/glm-dsa-mini"
HELDOUT = ROOT / "benchmarks/train/data/heldout.txt"


def windows(tokenizer, n: int, length: int) -> list[list[int]]:
    ids = tokenizer(HELDOUT.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    return [ids[i * length:(i + 1) * length] for i in range(n)]


def serve(model: Path, kv_cache_dtype: str, prompts: list[list[int]], greedy_prompt: int, new_tokens: int) -> dict:
    import sglang as sgl

    llm = sgl.Engine(model_path=str(model), dtype="float32", device="cpu", disable_cuda_graph=True,
                     kv_cache_dtype=kv_cache_dtype, max_total_tokens=16384, log_level="warning")
    try:
        forced = llm.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 1},
                              return_logprob=True, logprob_start_len=0, top_logprobs_num=2)
        gen = llm.generate(input_ids=[p[:greedy_prompt] for p in prompts],
                           sampling_params={"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True},
                           return_logprob=True, top_logprobs_num=2)
    finally:
        llm.shutdown()
    # input_top_logprobs[i]: the model's top-2 for token i given tokens < i (entry 0 is None).
    return {
        "true_logprob": [[lp for lp, _, _ in o["meta_info"]["input_token_logprobs"][1:]] for o in forced],
        "top2": [[[(lp, tok) for lp, tok, _ in t] for t in o["meta_info"]["input_top_logprobs"][1:]] for o in forced],
        "greedy": [o["output_ids"] for o in gen],
        "greedy_top2": [[[(lp, tok) for lp, tok, _ in t] for t in o["meta_info"]["output_top_logprobs"]] for o in gen],
    }


def compare(ref: dict, fp8: dict, new_tokens: int) -> dict:
    agree = total = 0
    deltas, flip_margins, margins = [], [], []
    for r_lp, f_lp, r_top, f_top in zip(ref["true_logprob"], fp8["true_logprob"], ref["top2"], fp8["top2"]):
        deltas += [abs(a - b) for a, b in zip(r_lp, f_lp)]
        for rt, ft in zip(r_top, f_top):
            total += 1
            margin = rt[0][0] - rt[1][0]
            margins.append(margin)
            if rt[0][1] == ft[0][1]:
                agree += 1
            else:
                flip_margins.append(margin)
    prefix, same, greedy_flip_margins = [], 0, []
    for r, f, r_top in zip(ref["greedy"], fp8["greedy"], ref["greedy_top2"]):
        n = next((i for i, (a, b) in enumerate(zip(r, f)) if a != b), len(r))
        prefix.append(n)
        same += n == len(r)
        if n < len(r):
            greedy_flip_margins.append(r_top[n][0][0] - r_top[n][1][0])
    deltas.sort()
    return {
        "teacher_forced": {
            "positions": total, "top1_agreement": agree / total,
            "mean_abs_delta_logprob": sum(deltas) / len(deltas),
            "p99_abs_delta_logprob": deltas[int(0.99 * (len(deltas) - 1))],
            "max_abs_delta_logprob": deltas[-1],
            "float32_margin_at_disagreements": sorted(flip_margins),
            "share_of_positions_with_float32_margin_below_0.1": sum(m < 0.1 for m in margins) / len(margins),
        },
        "greedy": {
            "sequences": len(prefix), "new_tokens": new_tokens, "identical_sequences": same,
            "tokens_agreeing_before_first_divergence": sum(prefix), "of_tokens": len(prefix) * new_tokens,
            "float32_margin_at_first_divergence": sorted(greedy_flip_margins),
        },
    }


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--greedy-prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    a = ap.parse_args(argv)

    from transformers import AutoTokenizer

    model = a.model.resolve()
    prompts = windows(AutoTokenizer.from_pretrained(model), a.windows, a.length)
    ref = serve(model, "auto", prompts, a.greedy_prompt, a.new_tokens)  # the CPU default: float32 cache
    fp8 = serve(model, "fp8_e4m3", prompts, a.greedy_prompt, a.new_tokens)
    name = "results" if model == MODEL.resolve() else f"results-{model.name}"
    result = {"model": str(model.relative_to(ROOT)), "backend": "glm_dsa_torch (CPU), model dtype float32",
              "data": f"benchmarks/train/data/heldout.txt, {a.windows} windows x {a.length} tokens",
              "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fp8_kv/quality.py " + " ".join(argv),
              **compare(ref, fp8, a.new_tokens)}
    (HERE / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    t, g = result["teacher_forced"], result["greedy"]
    md = [
        f"# FP8 KV cache vs float32 cache ({model.name}, CPU, `glm_dsa_torch`)", "",
        f"Written by `benchmarks/fp8_kv/quality.py` ({result['data']}).", "",
        "| metric | value |", "|---|---|",
        f"| teacher-forced next-token agreement (top-1) | {t['top1_agreement']:.4f} ({t['positions']} positions) |",
        f"| mean / p99 / max abs delta logprob of the true next token | {t['mean_abs_delta_logprob']:.4f} / "
        f"{t['p99_abs_delta_logprob']:.4f} / {t['max_abs_delta_logprob']:.4f} |",
        f"| float32 top-2 margin where top-1 differs (teacher-forced) | "
        f"{', '.join(f'{m:.3f}' for m in t['float32_margin_at_disagreements']) or 'none'} |",
        f"| greedy, {g['new_tokens']} tokens: identical sequences | {g['identical_sequences']} of {g['sequences']} |",
        f"| greedy: tokens before the first divergence | {g['tokens_agreeing_before_first_divergence']} of {g['of_tokens']} |",
        f"| float32 top-2 margin at each first divergence | "
        f"{', '.join(f'{m:.3f}' for m in g['float32_margin_at_first_divergence']) or 'none'} |",
    ]
    (HERE / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    from sglang_glm.cpu_compat import activate

    activate()
    main(sys.argv[1:])
