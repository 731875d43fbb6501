"""Write the carry pair from a train_mtp_carry.py run: one checkpoint, two MTP layers, loss curves.

- the checkpoint: the re-parametrised target with the post-norm-trained MTP layer (servable as is);
- the pre-norm-trained MTP layer beside it (`PRE_NORM_MTP`), which
  `sglang_glm_tools.carry_models.checkpoint_with_mtp` swaps in;
- here: log_{post,pre}_norm.csv, loss_curve.png, summary.json.

    python benchmarks/train/carry/export_carry.py build/carry
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


def plot(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    for carry, style in (("post_norm", "-"), ("pre_norm", "--")):
        rows = list(csv.DictReader((HERE / f"log_{carry}.csv").open()))
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
    a = ap.parse_args(argv)
    tensors = load_file(str(a.run / "target.safetensors"))
    post = load_file(str(a.run / "mtp_post_norm.safetensors"))
    assert set(post) <= set(tensors), "the MTP file names tensors the target checkpoint lacks"
    tensors.update(post)
    if CARRY_MODEL.exists():
        shutil.rmtree(CARRY_MODEL)
    write_checkpoint(CARRY_MODEL, AutoConfig.from_pretrained(str(TARGET)), tensors,
                     tokenizer=AutoTokenizer.from_pretrained(str(TARGET)), dtype=torch.bfloat16)
    shutil.copyfile(a.run / "mtp_pre_norm.safetensors", PRE_NORM_MTP)
    for name in ("log_post_norm.csv", "log_pre_norm.csv", "summary.json"):
        shutil.copyfile(a.run / name, HERE / name)
    plot(HERE / "loss_curve.png")


if __name__ == "__main__":
    main(sys.argv[1:])
