"""Two MTP layers over one target whose final norm is far from flat: one trained with the post-norm
carry, one with the pre-norm carry (issue 15).

The target is glm-dsa-mini with its final norms re-parametrised: both `model.norm` and the MTP's
`shared_head.norm` are multiplied per channel by a spread vector s (log-normal, plus a few outlier
channels, as the final norms of large trained LLMs look) and the shared lm head's columns divided by s.
Logits are unchanged, exactly up to rounding (checked); what changes is the post-norm hidden, which now
carries the spread, while the pre-norm one does not. The MTP layer (enorm, hnorm, eh_proj, decoder layer
with its indexer) is then trained recursively over 3 depths with the target frozen, once per carry,
from the same start (glm-dsa-mini's MTP layer) on the same batches.

    python benchmarks/train/prepare_data.py --tokenizer assets/glm-dsa-mini --out build/carry-data
    python benchmarks/train/carry/train_mtp_carry.py --out build/carry --steps 400
    python benchmarks/train/carry/export_carry.py build/carry     # checkpoint + loss curve

`--target DIR --sigma 0` takes a target whose final norm is already spread (trained so, e.g. with
train.py's `final_norm_spread`) as it is; `--device cuda` trains on a GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from sglang_glm_tools.carry_models import norm_spread, norm_stats
from sglang_glm_tools.reference import load_reference_model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
TARGET = ROOT / "assets" / "glm-dsa-mini"
CARRIES = ("post_norm", "pre_norm")
FROZEN_IN_MTP = ("shared_head.norm",)  # keeps the spread the experiment is about


@torch.no_grad()
def reparametrise(model, s: torch.Tensor) -> dict:
    """norm weights * s, lm head columns / s: same logits, spread post-norm hidden."""
    probe = torch.randint(1, model.cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    probe = probe.to(model.lm_head.weight.device)
    before = model(probe)
    s = s.to(model.lm_head.weight.dtype).to(model.lm_head.weight.device)
    model.model.norm.weight.mul_(s)
    model.mtp_layer.shared_head.norm.weight.mul_(s)
    model.lm_head.weight.div_(s)
    after = model(probe)
    return {
        "target_logits_max_abs_diff": float((after.logits - before.logits).abs().max()),
        "target_greedy_equal": bool(torch.equal(after.logits.argmax(-1), before.logits.argmax(-1))),
    }


def mtp_parameters(model):
    prefix = f"model.layers.{model.cfg.num_hidden_layers}."
    for name, p in model.named_parameters():
        trainable = name.startswith(prefix) and not any(f in name for f in FROZEN_IN_MTP)
        p.requires_grad_(trainable)
        if trainable:
            yield p


def mtp_losses(model, x, ctx: int, depths: int, carry_kind: str, distill: bool):
    """Per-depth MTP cross-entropy with the given recursive carry; the MTP indexer's KL."""
    b = x.shape[0]
    with torch.no_grad():
        carry = model(x[:, :ctx]).hidden  # draft step 0 always reads the target's post-norm hidden
    positions = torch.arange(ctx, device=x.device).expand(b, ctx)
    losses, kl = [], 0.0
    for k in range(depths):
        step = model.mtp_forward(x[:, k + 1:k + 1 + ctx], carry, positions + k, distill=distill)
        losses.append(F.cross_entropy(step.logits.flatten(0, 1), x[:, k + 2:k + 2 + ctx].flatten()))
        if step.indexer_kl is not None:
            kl = kl + step.indexer_kl
        carry = step.post_norm if carry_kind == "post_norm" else step.pre_norm
    return losses, kl


@torch.no_grad()
def draft_accuracy(model, x: torch.Tensor, ctx: int, depths: int, carry_kind: str) -> list[float]:
    """Teacher-forced top-1 accuracy of each draft depth on held-out windows."""
    carry = model(x[:, :ctx]).hidden
    positions = torch.arange(ctx, device=x.device).expand(x.shape[0], ctx)
    accs = []
    for k in range(depths):
        step = model.mtp_forward(x[:, k + 1:k + 1 + ctx], carry, positions + k)
        accs.append(round(float((step.logits.argmax(-1) == x[:, k + 2:k + 2 + ctx]).float().mean()), 4))
        carry = step.post_norm if carry_kind == "post_norm" else step.pre_norm
    return accs


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, required=True, help="training steps per carry (same batches)")
    ap.add_argument("--data", type=Path, default=Path("build/carry-data"),
                    help="prepare_data.py --tokenizer assets/glm-dsa-mini --out DATA")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--depths", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--target", type=Path, default=TARGET, help="checkpoint whose MTP layer is the start")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sigma", type=float, default=0.5, help="0: keep the target's final norms as they are")
    ap.add_argument("--outliers", type=int, default=6)
    ap.add_argument("--outlier-scale", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    train = torch.from_numpy(np.load(a.data / "train.npy").astype(np.int64)).to(dev)
    heldout = torch.from_numpy(np.load(a.data / "heldout.npy").astype(np.int64)).to(dev)
    span = a.context + a.depths + 2
    eval_x = heldout[torch.arange(16, device=dev)[:, None] * span + torch.arange(span, device=dev)]
    a.out.mkdir(parents=True, exist_ok=True)
    summary = {"args": {k: str(v) for k, v in vars(a).items()}, "carries": {}}
    for carry_kind in CARRIES:
        model = load_reference_model(a.target, dtype=torch.float32, device=dev)
        if a.sigma > 0:
            s = norm_spread(model.cfg.hidden_size, a.seed, a.sigma, a.outliers, a.outlier_scale)
            summary["reparametrisation"] = reparametrise(model, s)
        summary["shared_head_norm"] = norm_stats(model.mtp_layer.shared_head.norm.weight)
        print(json.dumps({k: summary[k] for k in ("reparametrisation", "shared_head_norm") if k in summary}), flush=True)
        params = list(mtp_parameters(model))
        opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
        before = draft_accuracy(model, eval_x, a.context, a.depths, carry_kind)
        gen = torch.Generator().manual_seed(a.seed)  # same batches for both carries
        log = open(a.out / f"log_{carry_kind}.csv", "w", newline="")
        writer = csv.DictWriter(log, ["step", "seconds", "tokens", "lr", "loss", *[f"mtp{k + 1}" for k in range(a.depths)], "mtp_indexer_kl"])
        writer.writeheader()
        start = time.time()
        for step in range(a.steps):
            frac = step / a.steps
            lr = a.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = lr
            starts = torch.randint(0, train.numel() - span, (a.batch,), generator=gen).to(dev)
            x = train[starts[:, None] + torch.arange(span, device=dev)]
            losses, kl = mtp_losses(model, x, a.context, a.depths, carry_kind, distill=True)
            loss = sum(losses) / a.depths + kl
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            if (step + 1) % 10 == 0 or step < 2:
                row = {"step": step + 1, "seconds": round(time.time() - start, 1), "tokens": (step + 1) * a.batch * a.context,
                       "lr": f"{lr:.2e}", "loss": f"{loss.item():.4f}",
                       **{f"mtp{k + 1}": f"{l.item():.4f}" for k, l in enumerate(losses)},
                       "mtp_indexer_kl": f"{float(kl.detach()) / a.depths:.4f}"}
                writer.writerow(row)
                log.flush()
                print(carry_kind, " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        log.close()
        after = draft_accuracy(model, eval_x, a.context, a.depths, carry_kind)
        other = draft_accuracy(model, eval_x, a.context, a.depths, CARRIES[1 - CARRIES.index(carry_kind)])
        summary["carries"][carry_kind] = {
            "steps": a.steps, "train_tokens": a.steps * a.batch * a.context,
            "train_seconds": round(time.time() - start, 1),
            "heldout_draft_accuracy_per_depth_before": before,
            "heldout_draft_accuracy_per_depth_own_carry": after,
            "heldout_draft_accuracy_per_depth_other_carry": other,
        }
        print(carry_kind, json.dumps(summary["carries"][carry_kind]), flush=True)
        mtp = {k: v.to(torch.bfloat16).cpu().contiguous() for k, v in model.hub_state_dict().items()
               if k.startswith(f"model.layers.{model.cfg.num_hidden_layers}.")
               and not k.endswith(("embed_tokens.weight", "shared_head.head.weight"))}
        save_file(mtp, str(a.out / f"mtp_{carry_kind}.safetensors"))
        if carry_kind == CARRIES[0] and a.sigma > 0:  # the re-parametrised target (else: --target as is)
            target = {k: v.to(torch.float32 if "e_score_correction_bias" in k else torch.bfloat16).cpu().contiguous()
                      for k, v in model.hub_state_dict().items()}
            save_file(target, str(a.out / "target.safetensors"))
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
