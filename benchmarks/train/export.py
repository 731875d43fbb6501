"""Turn a training run's output into the committed glm-dsa-mini checkpoint, loss log and loss-curve PNG.

Uses sglang_glm_tools.checkpoint.write_checkpoint (hub layout, MTP layer at index N, bf16 tensors).
"""

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from sglang_glm_tools.checkpoint import build_config, write_checkpoint

HERE = Path(__file__).parent


def plot(log_csv: Path, png: Path, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(log_csv.open()))
    tokens = [int(r["tokens"]) / 1e6 for r in rows]
    switch = next((int(r["tokens"]) / 1e6 for r in rows if r["phase"] == "sparse"), None)
    fig, (ax, kx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, label in [("lm", "LM"), ("mtp1", "MTP depth 1"), ("mtp2", "MTP depth 2"), ("mtp3", "MTP depth 3")]:
        ax.plot(tokens, [float(r[key]) for r in rows], label=label, lw=1)
    ax.set(xlabel="training tokens (M)", ylabel="cross-entropy (nats)", title=f"{name}: LM and MTP loss", ylim=(1, 8))
    for key, label in [("indexer_kl", "indexer KL (mean over 8 layers)"), ("mtp_indexer_kl", "MTP indexer KL (mean over depths)")]:
        kx.plot(tokens, [float(r[key]) for r in rows], label=label, lw=1)
    kx.set(xlabel="training tokens (M)", ylabel="KL(attention || indexer)", title="indexer distillation", yscale="log")
    for axis in (ax, kx):
        if switch is not None:
            axis.axvline(switch, color="gray", ls="--", lw=0.8, label="dense warm-up -> sparse")
        axis.legend()
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run", type=Path, help="train.py --out folder")
    ap.add_argument("--tokenizer", type=Path, default=Path("build/glm-dsa-mini-data/tokenizer"))
    ap.add_argument("--dest", type=Path, default=HERE.parent.parent / "assets/glm-dsa-mini")
    ap.add_argument("--logs", type=Path, default=HERE, help="where loss_log.csv, train_summary.json, loss_curve.png go")
    a = ap.parse_args(argv)

    model_cfg = json.loads((a.run / "model_config.json").read_text())
    config = build_config(base=model_cfg, mtp=model_cfg["num_nextn_predict_layers"] > 0)
    tensors = {k: v for shard in sorted(a.run.glob("hub*.safetensors")) for k, v in load_file(str(shard)).items()}
    if a.dest.exists():
        shutil.rmtree(a.dest)
    write_checkpoint(a.dest, config, tensors, tokenizer=AutoTokenizer.from_pretrained(a.tokenizer), dtype=torch.bfloat16)
    a.logs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(a.run / "log.csv", a.logs / "loss_log.csv")
    shutil.copyfile(a.run / "summary.json", a.logs / "train_summary.json")
    plot(a.logs / "loss_log.csv", a.logs / "loss_curve.png", a.dest.name)
    print(a.dest, sum(f.stat().st_size for f in a.dest.iterdir()) / 1e6, "MB")


if __name__ == "__main__":
    main(sys.argv[1:])
