"""The carry 2x2: each MTP layer of the carry pair served by SGLang with each carry (issue 15).

Rows: the MTP layer trained with the post-norm / pre-norm carry (one target, `sglang_glm_tools.carry_models`).
Columns: the carry SGLang recycles between draft steps (`mtp_recycle_hidden`). EAGLE, 5 draft steps,
eagle topk 1, index share on, greedy, held-out prompts. Every configuration's tokens are checked equal
to the target served without MTP (lossless). Writes here: carry_mismatch.json / .md / .png.
With --gpu it serves bfloat16 on the GPU with SGLang's defaults (the plugin's Triton backend, CUDA
graphs); bfloat16 is not token-exact across batch shapes, so there the share of greedy tokens equal to
the target's is reported instead of checked.

    python benchmarks/mtp/carry_mismatch.py            # 8 prompts x 64 new tokens
    python benchmarks/mtp/carry_mismatch.py --model M --pre-norm-mtp F --summary S --out DIR   # another pair
    python benchmarks/mtp/carry_mismatch.py --gpu --model M ...                                 # on the H200
      (the project's H200 lacks the flash_mla wheel SGLang's EAGLE worker imports: put tests/gpu/standins
      on PYTHONPATH there, as bench_gpu.py does for its servers)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this folder is on sys.path already.
from bench_acceptance import hardware

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TEXT = ROOT / "benchmarks" / "train" / "data" / "heldout.txt"
STEPS = 5


def shown(path: Path) -> Path:
    """path relative to the repository when inside it (for the written results)."""
    path = Path(os.path.abspath(path))  # not resolve(): a symlinked checkpoint keeps its repository name
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def target_tokens(model: Path, prompts, new_tokens: int, on_gpu: bool) -> list[list[int]]:
    import sglang as sgl

    from sglang_glm_tools.carry_check import engine_args

    llm = sgl.Engine(model_path=str(model), **engine_args(on_gpu))
    try:
        outs = llm.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": new_tokens})
    finally:
        llm.shutdown()
    return [o["output_ids"] for o in outs]


def plot(table: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (trained, row) in zip(axes, table.items()):
        for served, r in row.items():
            own = trained.split("_")[0] == served.split("_")[0]
            ax.plot(range(1, STEPS + 1), r["per_position"], "o-" if own else "s--",
                    label=f"served {served}: accept length {r['accept_length']:.2f}")
        ax.set(title=f"MTP trained with the {trained.replace('_trained', '')}-norm carry",
               xlabel="draft position", xticks=range(1, STEPS + 1), ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("per-position acceptance")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def markdown(table: dict, meta: dict) -> str:
    lines = [
        "# MTP carry mismatch: the carry pair served by SGLang",
        "",
        f"Hardware: {meta['hardware']}. {meta['prompts']} held-out prompts x {meta['prompt_len']} tokens, "
        f"{meta['new_tokens']} new tokens each, greedy; EAGLE, {STEPS} draft steps, eagle topk 1, index share on. "
        f"Model: `{meta['model']}` (shared_head.norm CV {meta['norm']['cv']:.2f}, "
        f"max/median {meta['norm']['max_over_median']:.1f}) with each MTP layer. "
        f"{meta['lossless']}. "
        f"Command: `{meta['command']}` ({meta['seconds']:.0f} s).",
        "",
        "| MTP trained with | served with | accept length | accept rate | per-position acceptance |",
        "|---|---|---|---|---|",
    ]
    for trained, row in table.items():
        for served, r in row.items():
            own = " (own)" if trained.split("_")[0] == served.split("_")[0] else ""
            lines.append(f"| {trained.replace('_trained', '')}-norm | {served}{own} | {r['accept_length']:.3f} | "
                         f"{r['accept_rate']:.3f} | {' '.join(f'{p:.2f}' for p in r['per_position'])} |")
    lines += ["", "Accept length: tokens per verify round (accepted drafts + 1). Accept rate: accepted drafts / "
              "drafted tokens. `sglang_glm_tools.carry_check` recommends, for the post-norm-trained checkpoint: "
              f"`{meta['recommended']['post_trained']}`; for the pre-norm-trained one: "
              f"`{meta['recommended']['pre_trained']}`.", "", "![per-position acceptance](carry_mismatch.png)", ""]
    lines += why(table, meta["summary"])
    return "\n".join(lines)


def why(table: dict, summary_path: Path) -> list[str]:
    """The asymmetry between the rows, from the training run's teacher-forced draft accuracy."""
    from sglang_glm_tools.carry_check import CLEAR_GAIN

    summary = json.loads(summary_path.read_text())["carries"]
    rows = []
    for carry in ("post_norm", "pre_norm"):
        own = summary[carry]["heldout_draft_accuracy_per_depth_own_carry"]
        other = summary[carry]["heldout_draft_accuracy_per_depth_other_carry"]
        served = table[f"{carry.split('_')[0]}_trained"]
        gain = served[carry]["accept_length"] - served["pre_norm" if carry == "post_norm" else "post_norm"]["accept_length"]
        rows.append(f"| {carry.split('_')[0]}-norm | {' / '.join(f'{a:.3f}' for a in own)} | "
                    f"{' / '.join(f'{a:.3f}' for a in other)} | {gain:+.3f} |")
    return [
        "## Why the two rows differ in size",
        "",
        "Draft step 0 always reads the target's post-norm hidden (SGLang hands the draft the hidden the "
        "target's logits came from), so the pre-norm-trained layer was trained on the spread post-norm "
        "input at depth 1 and on the unspread pre-norm carry at depths 2-3: served with the post-norm "
        "carry it sees, at every step, an input it was trained on at step 0. The post-norm-trained layer "
        "never saw an unspread input, so the pre-norm carry is out of its training distribution from "
        "draft step 1 on. Teacher-forced draft accuracy on 16 held-out windows x 256 tokens (training "
        f"run, `{shown(summary_path)}`) shows the same asymmetry:",
        "",
        "| MTP trained with | own carry, depth 1/2/3 | other carry, depth 1/2/3 | served accept-length gain of own carry |",
        "|---|---|---|---|",
        *rows,
        "",
        f"A gain below {CLEAR_GAIN} tokens per round is within the noise of a few hundred tokens; the "
        "carry check then keeps the checkpoint's default.",
        "",
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--model", type=Path, default=None, help="the pair's checkpoint (default: the bundled pair)")
    ap.add_argument("--pre-norm-mtp", type=Path, default=None, help="its pre-norm-trained MTP layer")
    ap.add_argument("--summary", type=Path, default=ROOT / "benchmarks" / "train" / "carry" / "summary.json",
                    help="the pair's training summary (train_mtp_carry.py)")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--gpu", action="store_true", help="serve on the GPU (bfloat16, Triton backend, CUDA graphs)")
    a = ap.parse_args(argv)

    if not a.gpu:
        from sglang_glm.cpu_compat import activate

        activate()
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from sglang_glm_tools.carry_check import check, prompts_from, token_agreement
    from sglang_glm_tools.carry_models import CARRY_MODEL, PRE_NORM_MTP, checkpoint_with_mtp, norm_stats

    pair = a.model or CARRY_MODEL, a.pre_norm_mtp or PRE_NORM_MTP
    t0 = time.time()
    prompts = prompts_from(TEXT.read_text(), AutoTokenizer.from_pretrained(str(pair[0])), a.prompts, a.prompt_len)
    table, recommended, served = {}, {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for trained in ("post_norm", "pre_norm"):
            print(f"MTP trained with the {trained} carry: serving with each carry", flush=True)
            model = checkpoint_with_mtp(trained, Path(tmp) / trained, *pair)
            result = check(model, prompts, a.new_tokens, STEPS, on_gpu=a.gpu)
            served += [r.tokens for r in result["results"].values()]
            key = f"{trained.split('_')[0]}_trained"
            table[key] = {c: r.as_dict() for c, r in result["results"].items()}
            recommended[key] = result["recommended"]
            print(json.dumps(table[key]), flush=True)
    layers = json.loads((pair[0] / "config.json").read_text())["num_hidden_layers"]
    norm = norm_stats(load_file(str(pair[0] / "model.safetensors"))[f"model.layers.{layers}.shared_head.norm.weight"])
    reference = target_tokens(pair[0], prompts, a.new_tokens, a.gpu)  # last: the table is printed by then
    agreement = [token_agreement(tokens, reference) for tokens in served]
    lossless = min(agreement) == 1
    if a.gpu:
        verdict = (f"Greedy tokens equal to the target served without MTP (bfloat16, not token-exact across "
                   f"batch shapes): {min(agreement):.1%} to {max(agreement):.1%} of positions per configuration")
    else:
        verdict = f"Lossless against the target served without MTP (float32, every token): {lossless}"
    meta = {"hardware": gpu_hardware() if a.gpu else hardware(), "prompts": len(prompts), "prompt_len": a.prompt_len,
            "model": shown(pair[0]), "summary": a.summary, "command": " ".join(["python", *sys.argv]),
            "new_tokens": a.new_tokens, "lossless": verdict, "recommended": recommended,
            "norm": norm,
            "seconds": time.time() - t0}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "carry_mismatch.json").write_text(json.dumps(table, indent=1) + "\n")
    (a.out / "carry_mismatch.md").write_text(markdown(table, meta))
    plot(table, a.out / "carry_mismatch.png")
    print((a.out / "carry_mismatch.md").read_text())
    return 0 if lossless or a.gpu else 1


def gpu_hardware() -> str:
    import platform

    import sglang
    import torch

    return (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, SGLang {sglang.__version__}, "
            f"Python {platform.python_version()} (bfloat16, CUDA graphs, the attention backend the plugin "
            "picks on CUDA: glm_dsa_triton within its geometry)")


if __name__ == "__main__":
    sys.exit(main())
