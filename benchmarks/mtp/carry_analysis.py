"""Why post-norm and pre-norm carry draft almost alike on the GLM-DSA mini model (numbers).

The MTP layer reads its carry through `hnorm` (an RMSNorm): x = eh_proj(cat(enorm(e), hnorm(c))).
RMSNorm removes the scale of c, so carrying post = shared_head.norm(pre) = w_s * rms(pre) instead
of pre changes the MTP input only through the SHAPE of w_s (shared_head.norm.weight): with
w_s = const, hnorm(post) == hnorm(pre) exactly. This script measures, with the reference
model on held-out prompts (one draft round per prompt, paired across configurations):
  1. the spread of w_s (coefficient of variation; the bigger it is, the more the choice matters);
  2. how far hnorm(post) is from hnorm(pre) for the carries of real draft steps (cosine, rel. L2);
  3. per-position acceptance of one round (drafts vs the target's greedy tokens) for
     post/pre carry x index share on/off, with the paired post-minus-pre difference and how
     often the two carries draft the same token at each position.

    python benchmarks/mtp/carry_analysis.py [--prompts 96]   # writes carry_analysis.{json,md}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

# Run as a script, this folder is on sys.path already.
from bench_acceptance import DEFAULT_MODEL, DEFAULT_TEXT, hardware

HERE = Path(__file__).resolve().parent

STEPS = 5


def cv(w: torch.Tensor) -> float:
    w = w.double()
    return float(w.std() / w.abs().mean())


@torch.no_grad()
def one_round(model, ids, steps):
    """Drafts for every config + the target's greedy tokens + carries of the draft steps."""
    from sglang_glm_tools.reference import accepted_length, greedy_continuation
    from sglang_glm_tools.reference.mtp import draft_round

    target = model(ids)
    nxt = target.logits[:, -1].argmax(-1, keepdim=True)
    full = torch.cat([ids, nxt], 1)
    truth = greedy_continuation(model, full, steps)  # the tokens after nxt
    out = {}
    for post in (True, False):
        for share in (True, False):
            r = draft_round(model, full, target.hidden, steps, index_share=share, post_norm_carry=post)
            n = int(accepted_length(r.tokens, truth)[0])
            out[(post, share)] = (n, r.tokens[0].tolist())
    # Carry geometry on the post-norm path: step 0's carry for the next step.
    mtp = model.mtp_layer
    step = model.mtp_forward(full[:, 1:], target.hidden, torch.arange(full.shape[1] - 1)[None])
    pre, post = step.pre_norm[:, -1], step.post_norm[:, -1]
    hp, hq = mtp.hnorm(post), mtp.hnorm(pre)
    cos = float(torch.nn.functional.cosine_similarity(hp, hq, dim=-1)[0])
    rel = float((hp - hq).norm() / hp.norm())
    return out, cos, rel


def acceptance_table(rounds, steps):
    rows = {}
    for key in rounds[0][0]:
        ns = torch.tensor([r[0][key][0] for r in rounds], dtype=torch.float64)
        rows[key] = {
            "mean_accept_length": float(1 + ns.mean()),
            "per_position": [float((ns >= k).double().mean()) for k in range(1, steps + 1)],
            "accepted": ns.tolist(),
        }
    return rows


def paired(a, b, n_boot=2000, seed=0):
    """Mean of a - b with a 95% bootstrap interval (paired: same rounds)."""
    d = torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(d), (n_boot, len(d)), generator=g)
    boots = d[idx].mean(1).sort().values
    return float(d.mean()), float(boots[int(0.025 * n_boot)]), float(boots[int(0.975 * n_boot)])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--out", type=Path, default=HERE)
    a = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from sglang_glm_tools.reference import load_reference_model

    torch.set_grad_enabled(False)
    model = load_reference_model(a.model, dtype=getattr(torch, a.dtype))
    tok = AutoTokenizer.from_pretrained(str(a.model))
    text = a.text.read_text()
    stride = len(text) // a.prompts
    prompts = [tok(text[i * stride : i * stride + 8 * a.prompt_len])["input_ids"][: a.prompt_len]
               for i in range(a.prompts)]
    prompts = [p for p in prompts if len(p) == a.prompt_len]

    w_s = model.mtp_layer.shared_head.norm.weight
    result = {"hardware": hardware(), "model": str(a.model), "prompts": len(prompts), "dtype": a.dtype,
              "prompt_len": a.prompt_len, "steps": STEPS,
              "shared_head_norm_weight": {"mean": float(w_s.mean()), "std": float(w_s.std()), "cv": cv(w_s)}}
    for name, m in (("trained", model),):
        rounds = []
        for i, p in enumerate(prompts):
            rounds.append(one_round(m, torch.tensor([p]), STEPS))
            print(f"{name}: round {i + 1}/{len(prompts)}", flush=True)
        table = acceptance_table(rounds, STEPS)
        cos = torch.tensor([r[1] for r in rounds])
        rel = torch.tensor([r[2] for r in rounds])
        entry = {
            "shared_head_norm_weight_cv": cv(m.mtp_layer.shared_head.norm.weight),
            "hnorm_post_vs_pre_cosine": {"mean": float(cos.mean()), "min": float(cos.min())},
            "hnorm_post_vs_pre_rel_l2": {"mean": float(rel.mean()), "max": float(rel.max())},
            "configs": {
                f"{'post' if k[0] else 'pre'}-norm, share {'on' if k[1] else 'off'}": {
                    kk: vv for kk, vv in v.items() if kk != "accepted"} for k, v in table.items()
            },
            "post_minus_pre_accept_length": {
                f"share {'on' if s else 'off'}": paired(table[(True, s)]["accepted"], table[(False, s)]["accepted"])
                for s in (True, False)
            },
            "post_pre_same_drafts_per_position": [
                float(sum(r[0][(True, True)][1][k] == r[0][(False, True)][1][k] for r in rounds) / len(rounds))
                for k in range(STEPS)
            ],
        }
        result[name] = entry
        print(name, json.dumps(entry, indent=1), flush=True)
    (a.out / "carry_analysis.json").write_text(json.dumps(result, indent=1))
    (a.out / "carry_analysis.md").write_text(render(result))
    print(render(result))


def render(r):
    lines = [
        "# Post-norm vs pre-norm carry on the GLM-DSA mini model: why they draft alike",
        "",
        f"Reference model ({r['dtype']}), {r['prompts']} held-out prompts x {r['prompt_len']} tokens, one "
        f"{r['steps']}-step draft round per prompt, drafts vs the target's greedy tokens (paired: "
        f"every configuration drafts from the same states). Hardware: {r['hardware']}.",
        "",
        "| model | CV of shared_head.norm.weight | cos(hnorm(post), hnorm(pre)) mean / min | rel. L2 mean | "
        "config | mean accept length | per-position acceptance |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("trained",):
        e = r[name]
        for cname, c in e["configs"].items():
            lines.append(
                f"| {name} | {e['shared_head_norm_weight_cv']:.3f} | "
                f"{e['hnorm_post_vs_pre_cosine']['mean']:.4f} / {e['hnorm_post_vs_pre_cosine']['min']:.4f} | "
                f"{e['hnorm_post_vs_pre_rel_l2']['mean']:.4f} | {cname} | {c['mean_accept_length']:.3f} | "
                + " ".join(f"{x:.2f}" for x in c["per_position"]) + " |"
            )
    lines += ["", "Paired post-minus-pre difference of accepted length (mean, 95% bootstrap interval):", ""]
    for name in ("trained",):
        for k, (m, lo, hi) in r[name]["post_minus_pre_accept_length"].items():
            lines.append(f"- {name}, {k}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}]")
        same = r[name]["post_pre_same_drafts_per_position"]
        lines.append(f"- {name}: post and pre carry draft the same token at positions 1..5: "
                     + ", ".join(f"{x:.2f}" for x in same))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1:])
