"""Write the carry pair from a train_mtp_carry.py run: one checkpoint, two MTP layers, loss curves.

- the checkpoint: the re-parametrised target with the post-norm-trained MTP layer (servable as is);
- the pre-norm-trained MTP layer beside it (`PRE_NORM_MTP`), which
  `sglang_glm_tools.carry_models.checkpoint_with_mtp` swaps in;
- here: log_{post,pre}_norm.csv, loss_curve.png, summary.json.

    python benchmarks/train/carry/export_carry.py build/carry
    python benchmarks/train/carry/export_carry.py RUN --target T --dest D --pre-norm-dest F --logs L
      (a run with --target T --sigma 0: T is the target, as trained)
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from sglang_glm_tools.carry_models import CARRY_MODEL, PRE_NORM_MTP
from sglang_glm_tools.checkpoint import write_checkpoint

HERE = Path(__file__).resolve().parent
TARGET = HERE.parents[2] / "assets" / "glm-dsa-mini"


def plot(logs: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    for carry, style in (("post_norm", "-"), ("pre_norm", "--")):
        rows = list(csv.DictReader((logs / f"log_{carry}.csv").open()))
        tokens = [int(r["tokens"]) / 1e6 for r in rows]
        for k, ax in enumerate(axes):
            ax.plot(tokens, [float(r[f"mtp{k + 1}"]) for r in rows], style, lw=1, label=f"trained with {carry} carry")
            ax.set(title=f"MTP depth {k + 1}", xlabel="training tokens (M)")
    axes[0].set_ylabel("cross-entropy (nats)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("MTP layers over one target with a spread final norm (target frozen)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run", type=Path, help="train_mtp_carry.py --out folder")
    ap.add_argument("--target", type=Path, default=TARGET, help="the run's --target")
    ap.add_argument("--dest", type=Path, default=CARRY_MODEL)
    ap.add_argument("--pre-norm-dest", type=Path, default=PRE_NORM_MTP)
    ap.add_argument("--logs", type=Path, default=HERE)
    a = ap.parse_args(argv)
    reparametrised = a.run / "target.safetensors"
    tensors = load_file(str(reparametrised if reparametrised.exists() else a.target / "model.safetensors"))
    post = load_file(str(a.run / "mtp_post_norm.safetensors"))
    assert set(post) <= set(tensors), "the MTP file names tensors the target checkpoint lacks"
    tensors.update(post)
    # read before the rmtree: --dest may be --target itself
    config, tokenizer = AutoConfig.from_pretrained(str(a.target)), AutoTokenizer.from_pretrained(str(a.target))
    if a.dest.exists():
        shutil.rmtree(a.dest)
    write_checkpoint(a.dest, config, tensors, tokenizer=tokenizer, dtype=torch.bfloat16)
    shutil.copyfile(a.run / "mtp_pre_norm.safetensors", a.pre_norm_dest)
    a.logs.mkdir(parents=True, exist_ok=True)
    for name in ("log_post_norm.csv", "log_pre_norm.csv", "summary.json"):
        shutil.copyfile(a.run / name, a.logs / name)
    plot(a.logs, a.logs / "loss_curve.png")


if __name__ == "__main__":
    main(sys.argv[1:])
