"""MTP acceptance on the trained GLM-DSA mini model, served by real SGLang (EAGLE, CPU, float32).

For each configuration (hidden carried between draft steps: post-norm vs pre-norm; index share
on vs off) the model serves the same held-out prompts greedily with 5 draft steps (eagle topk 1,
6 draft tokens), and SGLang's per-request `spec_correct_drafts_histogram` gives
  - per-position acceptance: P(draft k accepted in a round) = P(>= k drafts accepted),
  - mean acceptance length (accepted drafts + the bonus token per verify round).
1..4 draft steps: the default configuration (post-norm, share on) is also served with 1..4 steps
("measured"), and every configuration's 5-step rounds are truncated to k steps ("from 5-step
rounds": 1 + E[min(accepted, k)]); a greedy chain's first k drafts do not depend on later steps,
so the two differ only by where rounds start. Output tokens are checked identical across all
configurations (speculative decoding must be lossless).

    python benchmarks/mtp/bench_acceptance.py            # writes results.json / results.md / acceptance.png here
    python benchmarks/mtp/bench_acceptance.py --quick    # 2 prompts, fewer tokens (smoke)
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from sglang_glm.cpu_compat import CPU_ENGINE_ARGS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_MODEL = ROOT / "assets" / "glm-dsa-mini"
DEFAULT_TEXT = ROOT / "benchmarks" / "train" / "data" / "heldout.txt"

CONFIGS = [
    # name, mtp_recycle_hidden, index_share_for_mtp_iteration
    ("post-norm, share on", "post_norm", True),
    ("post-norm, share off", "post_norm", False),
    ("pre-norm, share on", "pre_norm", True),
    ("pre-norm, share off", "pre_norm", False),
]
MAX_STEPS = 5


def hardware() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    import os

    return f"{model}, {os.cpu_count()} CPU cores, no GPU (SGLang CPU path, float32)"


def serve(model, prompts, new_tokens, steps, recycle, share) -> tuple[list, list, float]:
    import sglang as sgl

    override = {"mtp_recycle_hidden": recycle, "index_share_for_mtp_iteration": share}
    llm = sgl.Engine(
        model_path=str(model), **CPU_ENGINE_ARGS, max_running_requests=16, log_level="warning",
        speculative_algorithm="EAGLE", speculative_num_steps=steps, speculative_eagle_topk=1,
        speculative_num_draft_tokens=steps + 1, json_model_override_args=json.dumps(override),
    )
    try:
        t0 = time.time()
        out = llm.generate(
            input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": new_tokens}
        )
        seconds = time.time() - t0
    finally:
        llm.shutdown()
    return [o["output_ids"] for o in out], [o["meta_info"] for o in out], seconds


def truncated_accept_length(histogram: list[int], k: int) -> float:
    rounds = sum(histogram)
    return 1.0 + sum(min(j, k) * n for j, n in enumerate(histogram)) / rounds if rounds else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="held-out text for prompts")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--quick", action="store_true", help="2 prompts x 24 tokens, no 1..4-step runs")
    a = ap.parse_args(argv)
    if a.quick:
        a.prompts, a.new_tokens = 2, 24

    from sglang_glm.cpu_compat import activate

    activate()
    from transformers import AutoTokenizer

    from sglang_glm.mtp.acceptance import AcceptanceStats
    from sglang_glm_tools.carry_check import prompts_from

    tok = AutoTokenizer.from_pretrained(str(a.model))
    prompts = prompts_from(a.text.read_text(), tok, a.prompts, a.prompt_len)
    results = {
        "model": str(a.model.relative_to(ROOT) if a.model.is_relative_to(ROOT) else a.model),
        "hardware": hardware(),
        "prompts": len(prompts), "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "flags": "--speculative-algorithm EAGLE --speculative-eagle-topk 1 "
                 "--speculative-num-steps S --speculative-num-draft-tokens S+1 "
                 "--json-model-override-args '{\"mtp_recycle_hidden\": ..., "
                 "\"index_share_for_mtp_iteration\": ...}'",
        "configs": [], "measured_steps": [],
    }
    reference_tokens = None
    lossless = True
    for name, recycle, share in CONFIGS:
        tokens, metas, seconds = serve(a.model, prompts, a.new_tokens, MAX_STEPS, recycle, share)
        stats = AcceptanceStats()
        for m in metas:
            stats.add_meta_info(m)
        reference_tokens = reference_tokens or tokens
        lossless &= tokens == reference_tokens
        row = {
            "name": name, "recycle": recycle, "index_share": share, "steps": MAX_STEPS,
            **stats.as_dict(MAX_STEPS),
            "accept_length_truncated": {
                k: truncated_accept_length(stats.histogram, k) for k in range(1, MAX_STEPS + 1)
            },
            "generate_seconds": seconds,
        }
        results["configs"].append(row)
        print(f"{name}: accept_len={row['mean_accept_length']:.3f} per position "
              f"{[round(r, 3) for r in row['per_position_acceptance']]}", flush=True)
        results["lossless_all_configs_same_tokens"] = lossless
        write(results, a.out)
    if not a.quick:
        for steps in range(1, MAX_STEPS):
            tokens, metas, seconds = serve(a.model, prompts, a.new_tokens, steps, "post_norm", True)
            stats = AcceptanceStats()
            for m in metas:
                stats.add_meta_info(m)
            lossless &= tokens == reference_tokens
            results["measured_steps"].append(
                {"steps": steps, **stats.as_dict(steps), "generate_seconds": seconds}
            )
            print(f"post-norm, share on, {steps} steps: accept_len={stats.mean_accept_length:.3f}", flush=True)
            results["lossless_all_configs_same_tokens"] = lossless
            write(results, a.out)
        results["measured_steps"].append(
            {"steps": MAX_STEPS, **{k: results["configs"][0][k] for k in
                                    ("rounds", "mean_accept_length", "per_position_acceptance",
                                     "correct_drafts_histogram", "generate_seconds")}}
        )
    results["lossless_all_configs_same_tokens"] = lossless
    write(results, a.out)
    print((a.out / "results.md").read_text())


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(render_markdown(results))
    plot(results, out / "acceptance.png")


def render_markdown(r: dict) -> str:
    lines = [
        "# MTP acceptance, GLM-DSA mini (trained), served by SGLang EAGLE on CPU",
        "",
        f"Hardware: {r['hardware']}. Model: `{r['model']}`. {r['prompts']} held-out prompts x "
        f"{r['prompt_len']} tokens, {r['new_tokens']} new tokens each, greedy. Flags: `{r['flags']}`.",
        f"All configurations produced identical tokens (lossless): **{r['lossless_all_configs_same_tokens']}**.",
        "",
        "## 5 draft steps: mean acceptance length and per-position acceptance",
        "",
        "| carry | index share | rounds | mean accept length | " + " | ".join(f"pos {k}" for k in range(1, MAX_STEPS + 1)) + " |",
        "|---|---|---|---|" + "---|" * MAX_STEPS,
    ]
    for c in r["configs"]:
        lines.append(
            f"| {c['recycle']} | {'on' if c['index_share'] else 'off'} | {c['rounds']} | "
            f"{c['mean_accept_length']:.3f} | "
            + " | ".join(f"{x:.3f}" for x in c["per_position_acceptance"]) + " |"
        )
    lines += [
        "",
        "## 1..5 draft steps: mean acceptance length",
        "",
        "Truncated = every configuration's 5-step rounds cut to k drafts (1 + E[min(accepted, k)]).",
        "",
        "| carry | index share | " + " | ".join(f"{k} steps" for k in range(1, MAX_STEPS + 1)) + " |",
        "|---|---|" + "---|" * MAX_STEPS,
    ]
    for c in r["configs"]:
        t = c["accept_length_truncated"]
        lines.append(
            f"| {c['recycle']} | {'on' if c['index_share'] else 'off'} | "
            + " | ".join(f"{t[k] if k in t else t[str(k)]:.3f}" for k in range(1, MAX_STEPS + 1)) + " |"
        )
    if r["measured_steps"]:
        by_steps = {m["steps"]: m["mean_accept_length"] for m in r["measured_steps"]}
        lines.append(
            "| post_norm, measured (separate runs, k steps) | on | "
            + " | ".join(f"{by_steps[k]:.3f}" if k in by_steps else "-" for k in range(1, MAX_STEPS + 1)) + " |"
        )
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # plotting must not lose the numbers
        print(f"no plot: {e}")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ks = list(range(1, MAX_STEPS + 1))
    for c in r["configs"]:
        ax1.plot(ks, c["per_position_acceptance"], marker="o", label=c["name"])
        t = c["accept_length_truncated"]
        ax2.plot(ks, [t[k] if k in t else t[str(k)] for k in ks], marker="o", label=c["name"])
    if r["measured_steps"]:
        ax2.plot([m["steps"] for m in r["measured_steps"]], [m["mean_accept_length"] for m in r["measured_steps"]],
                 "k--", marker="x", label="post-norm, share on (measured runs)")
    ax1.set(xlabel="draft position", ylabel="acceptance rate", title="Per-position acceptance (5 steps)")
    ax2.set(xlabel="draft steps", ylabel="mean acceptance length", title="Acceptance length vs steps")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"GLM-DSA mini MTP, SGLang EAGLE on CPU ({r['hardware'][:60]})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1:])
