"""Issue 30's side-by-side: bench_gpu.py runs' results.jsonl (plugin rows `CONFIG`, SGLang's own path
`CONFIG@sglang`) -> results/peer.json, a list of {"what", "metric", "sglang", "plugin", "ratio",
"sglang_indexer", "run"} rows (ratio = SGLang's time / the plugin's: > 1 means the plugin is faster;
sglang_indexer: the kernels SGLang's indexer ran, "deepgemm" or its "torch" fall-back; run: the name of the
directory holding the row's results.jsonl), peer.md, the table, and peer.png, its ratios as bars.

Only rows of the same config and workload in the same file pair up (one run, one machine); where a side
ran a workload more than once the median counts. A plugin copy served in the run (`CONFIG@NAME`, e.g. the
plugin with FlashMLA on its path) pairs too, as its own row "(plugin@NAME)". Decode workloads compare TPOT, prefill ones TTFT. Several
files (runs of different configs) give the union of their pairs.

    python benchmarks/serving/gpu/peer_report.py RUN_DIR/results.jsonl [RUN_DIR2/results.jsonl ...] \
        [--out benchmarks/serving/gpu/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEER = "sglang"


def metric(workload: str) -> str:
    return "median_ttft_ms" if workload.startswith("prefill") else "median_tpot_ms"


def peer_rows(rows: list[dict], run: str) -> list[dict]:
    times = defaultdict(list)  # (config, workload, side) -> times; side: PEER, or a plugin copy (None: installed)
    for r in rows:
        value = r.get(metric(r["workload"])) if "error" not in r else None
        if value is not None:
            times[(r["config"], r["workload"], r.get("plugin"))].append(value)
    # runs before the peer could use DeepGEMM (session 17) did not record it: they ran the torch fall-back
    indexer = {r["config"]: r.get("peer_indexer", "torch") for r in rows if r.get("plugin") == PEER and "error" not in r}
    out = []
    for (config, workload, side), sglang in sorted(times.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        if side != PEER:
            continue
        copies = sorted((c for (cf, wl, c) in times if (cf, wl) == (config, workload) and c != PEER), key=str)
        for copy in copies:  # the installed plugin, or a copy such as the FlashMLA one (`--plugin NAME=DIR`)
            s, p = statistics.median(sglang), statistics.median(times[(config, workload, copy)])
            out.append({"what": f"{config} {workload}" + (f" (plugin@{copy})" if copy else ""), "metric": metric(workload),
                        "sglang": round(s, 3), "plugin": round(p, 3), "ratio": round(s / p, 3),
                        "sglang_indexer": indexer[config], "run": run})
    return out


def markdown(rows: list[dict], hardware: str) -> str:
    lines = [f"SGLang's own GLM-DSA path vs the plugin on {hardware}, each pair from one run (ratio > 1: the "
             "plugin is faster)", "", "| what | metric | SGLang | plugin | ratio | SGLang's indexer | run |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['what']} | {r['metric']} | {r['sglang']:.2f} ms | {r['plugin']:.2f} ms | {r['ratio']:.2f}x | "
              f"{r['sglang_indexer']} | {r['run']} |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], hardware: str, path: Path) -> None:
    """One bar per row from 1.0 (the two level) to SGLang's time over the plugin's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.6))
    labels = [f"{r['what'].replace(' (plugin', ' (')}\n{r['run']}: {r['sglang']:.1f} vs {r['plugin']:.1f} ms"
              for r in rows][::-1]
    ratios = [r["ratio"] for r in rows][::-1]
    ax.barh(labels, [x - 1 for x in ratios], left=1.0, color=["C2" if x >= 1 else "C3" for x in ratios])
    ax.axvline(1.0, color="k", lw=0.8)
    for y, x in enumerate(ratios):
        ax.text(max(x, 1.0), y, f" {x:.2f}x", va="center", fontsize=8)
    ax.set_xlim(min(0.8, min(ratios) - 0.05), max(ratios) + 0.15)
    ax.set_xlabel("SGLang's own path time / plugin time (> 1: the plugin is faster)")
    ax.set_title(f"GLM-5.2-shaped model: SGLang's own GLM-DSA path vs sglang-glm\n{hardware.split(',')[0]}", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, nargs="+", help="bench_gpu.py runs' results.jsonl")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    table, rows = [], []
    for path in args.results:
        run = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        table += peer_rows(run, path.parent.name)
        rows += run
    if not table:
        raise SystemExit(f"{' '.join(map(str, args.results))}: no config served by both SGLang's own path and the plugin")
    hardware = next((r["meta"]["hardware"] for r in rows if "meta" in r), "unknown hardware")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peer.json").write_text(json.dumps(table, indent=1) + "\n")
    (args.out / "peer.md").write_text(markdown(table, hardware))
    plot(table, hardware, args.out / "peer.png")
    print(markdown(table, hardware))


if __name__ == "__main__":
    main()
