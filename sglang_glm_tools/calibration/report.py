"""Calibration outputs: result JSON + markdown, loss-vs-full-layers plot, Jaccard heatmap."""

from __future__ import annotations

import json
from pathlib import Path


def override_arg(pattern: str) -> str:
    return "--json-model-override-args '" + json.dumps({"index_topk_pattern": pattern}) + "'"


def add_recommendation(result: dict) -> dict:
    """`recommended_pattern`: the searched pattern, unless uniform every-k has lower calibration loss.

    Greedy sharing is myopic: a layer it keeps to the end can force a bad last step (on
    glm-dsa-mini at 2 full layers). The comparison rows already hold both losses, so the result
    names the better one instead of hiding it.
    """
    row = next((r for r in result.get("comparison") or [] if r["num_full"] == result["budget"]), None)
    pattern, reason = result["pattern"], "greedy search"
    if row is not None and "uniform" in row and row["uniform_calib"] < row["searched_calib"]:
        pattern = row["uniform"]
        reason = (f"uniform every-k: calibration NLL {row['uniform_calib']:.5f} < greedy "
                  f"{row['searched_calib']:.5f} at {row['num_full']} full layers")
    result["recommended_pattern"] = pattern
    result["recommended_reason"] = reason
    return result


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loss(path: Path, result: dict) -> None:
    """Loss against the number of full layers: the greedy path, uniform every-k, held-out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    steps = result["steps"]
    ax.plot([s["num_full"] for s in steps], [s["loss"] for s in steps], "o-",
            label=f"searched, calibration ({result['objective']})")
    rows = result.get("comparison") or []
    if rows and result["objective"] == "lm":  # the comparison is in NLL, the kl path is not
        n = [r["num_full"] for r in rows]
        if "uniform" in rows[0]:
            ax.plot(n, [r["uniform_calib"] for r in rows], "s--", label="uniform every-k, calibration")
        if "searched_heldout" in rows[0]:
            ax.plot(n, [r["searched_heldout"] for r in rows], "o-", label="searched, held-out")
        if "uniform_heldout" in rows[0]:
            ax.plot(n, [r["uniform_heldout"] for r in rows], "s--", label="uniform every-k, held-out")
    ax.set_xlabel("full layers (run their own indexer)")
    ax.set_ylabel("mean NLL (nats/token)" if result["objective"] == "lm" else "mean KL to all-full")
    ax.set_title(f"IndexCache greedy search: {Path(result['model']).name}")
    ax.invert_xaxis()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_heatmap(path: Path, overlap: dict, title: str) -> None:
    plt = _pyplot()
    layers, jac = overlap["layers"], overlap["jaccard"]
    n = len(layers)
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * n, 0.8 + 0.5 * n))
    im = ax.imshow(jac, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(n), [str(l) for l in layers])
    ax.set_yticks(range(n), [str(l) for l in layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("layer")
    if n <= 24:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{jac[i][j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if jac[i][j] < 0.6 else "black")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Jaccard of top-k sets")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def overlap_markdown(overlap: dict) -> str:
    layers, jac = overlap["layers"], overlap["jaccard"]
    lines = [
        f"Top-k overlap (Jaccard of selected key positions, index_topk = {overlap['index_topk']}, "
        f"mean over {overlap['tokens_counted']} query tokens that see more than index_topk keys)",
        "",
        "| layer | " + " | ".join(str(l) for l in layers) + " |",
        "|---" * (len(layers) + 1) + "|",
    ]
    for l, row in zip(layers, jac):
        lines.append(f"| {l} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    lines += ["", "Adjacent indexer layers: " + ", ".join(
        f"{a}-{b}: {j:.3f}" for a, b, j in ((d["a"], d["b"], d["jaccard"]) for d in overlap["adjacent"])
    )]
    return "\n".join(lines) + "\n"


def result_markdown(result: dict) -> str:
    obj = result["objective"]
    lines = [
        f"# IndexCache calibration: {result['model']}",
        "",
        f"- calibration data: {result['data']['describe']}",
    ]
    if result.get("heldout"):
        lines.append(f"- held-out data: {result['heldout']['describe']}")
    lines += [
        f"- objective: {obj} ({'mean next-token NLL, nats/token' if obj == 'lm' else 'mean KL to the all-full plan'})",
        f"- budget: {result['budget']} full layers -> pattern `{result['pattern']}`",
        f"- serve it with: `{override_arg(result['pattern'])}`",
    ]
    if result.get("recommended_pattern", result["pattern"]) != result["pattern"]:
        lines.append(
            f"- **recommended instead: `{result['recommended_pattern']}`** "
            f"({result['recommended_reason']}): `{override_arg(result['recommended_pattern'])}`"
        )
    lines += [
        "",
        "## Greedy path",
        "",
        "| full layers | pattern | shared at this step | calibration loss |",
        "|---|---|---|---|",
    ]
    for s in result["steps"]:
        shared = "-" if s["shared_layer"] is None else str(s["shared_layer"])
        lines.append(f"| {s['num_full']} | `{s['pattern']}` | {shared} | {s['loss']:.5f} |")
    rows = result.get("comparison") or []
    if rows:
        cols = [("searched_calib", "calib searched")]
        if "uniform" in rows[0]:
            cols.append(("uniform_calib", "calib uniform"))
        if "searched_heldout" in rows[0]:
            cols.append(("searched_heldout", "held-out searched"))
        if "uniform_heldout" in rows[0]:
            cols.append(("uniform_heldout", "held-out uniform"))
        uniform = "uniform" in rows[0]
        lines += [
            "",
            "## Searched vs uniform every-k (same number of full layers; mean NLL, nats/token)",
            "",
            "| full | searched" + (" | uniform" if uniform else "")
            + "".join(f" | {title}" for _, title in cols) + " |",
            "|---" * (2 + uniform + len(cols)) + "|",
        ]
        for r in rows:
            line = f"| {r['num_full']} | `{r['searched']}`" + (f" | `{r['uniform']}`" if uniform else "")
            lines.append(line + "".join(f" | {r[k]:.5f}" for k, _ in cols) + " |")
    return "\n".join(lines) + "\n"
