"""The carry pair (issue 15): one target, two MTP layers trained with different carries.

`glm5-geometry-carry` is a small target with GLM-5's attention geometry, trained on the H200 with its
final norms started spread per channel (shared_head.norm CV 0.94, max/median 12.8 after training),
and an MTP layer trained with the post-norm carry; the MTP layer trained with the pre-norm carry over
the same frozen target sits beside it (outside the checkpoint folder, so loaders never pick it up).
Made by benchmarks/train/carry/h200_glm5_pair.sh.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from sglang_glm.mtp.recycle import POST_NORM, PRE_NORM

# The repository's assets/ (the bundled models are not in the wheel).
ASSETS = Path(__file__).resolve().parents[1] / "assets"
CARRY_MODEL = ASSETS / "glm5-geometry-carry"
PRE_NORM_MTP = ASSETS / "glm5-geometry-carry.mtp_pre_norm.safetensors"


def norm_spread(hidden: int, seed: int, sigma: float, outliers: int, outlier_scale: float) -> torch.Tensor:
    """Per-channel gains as large trained LLMs' final norms look: log-normal (sigma), a few outlier
    channels times outlier_scale, median 1 (float64)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.exp(sigma * torch.randn(hidden, generator=g, dtype=torch.float64))
    idx = torch.randperm(hidden, generator=g)[:outliers]
    s[idx] *= outlier_scale
    return s / s.median()


def norm_stats(weight: torch.Tensor) -> dict:
    """How far a norm's gains are from flat: coefficient of variation and max / median."""
    w = weight.detach().double()
    return {"cv": float(w.std() / w.mean()), "max_over_median": float(w.abs().max() / w.abs().median())}


def checkpoint_with_mtp(trained_carry: str, dest: Path, model: Path = CARRY_MODEL,
                        pre_norm_mtp: Path = PRE_NORM_MTP) -> Path:
    """The carry pair's checkpoint (`model`, its MTP layer trained with the post-norm carry, and
    `pre_norm_mtp` beside it) whose MTP layer was trained with `trained_carry`."""
    if trained_carry == POST_NORM:
        return model
    if trained_carry != PRE_NORM:
        raise ValueError(f"trained_carry = {trained_carry!r}; use {POST_NORM!r} or {PRE_NORM!r}")
    dest = Path(dest)
    shutil.copytree(model, dest, dirs_exist_ok=True)
    weights = Path(model) / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(weights))
    mtp = load_file(str(pre_norm_mtp))
    unknown = set(mtp) - set(tensors)
    if unknown:
        raise ValueError(f"{Path(pre_norm_mtp).name} names tensors the checkpoint lacks: {sorted(unknown)[:3]}")
    tensors.update(mtp)
    save_file(tensors, str(dest / "model.safetensors"), metadata=metadata)
    return dest
