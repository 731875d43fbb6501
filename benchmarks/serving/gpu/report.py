"""results/results.jsonl (bench_gpu.py lines from one or more runs) and the profile summaries -> the table,
the same-server-session ratios and the plots in results/.

    python benchmarks/serving/gpu/report.py [--results benchmarks/serving/gpu/results]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (what, config, baseline config, workload, metric): the comparisons the issue asks for.
RATIOS = [
    ("IndexCache (1 in 4 full) vs all-full, prefill 128K", "indexcache", "all_full", "prefill_128k", "median_ttft_ms"),
    ("IndexCache vs all-full, decode at 128K, batch 1", "indexcache", "all_full", "decode_128k_b1", "median_itl_ms"),
    ("IndexCache vs all-full, prefill 32K", "indexcache", "all_full", "prefill_32k", "median_ttft_ms"),
    ("IndexCache vs all-full, decode at 4K, batch 32", "indexcache", "all_full", "decode_b32", "median_itl_ms"),
    ("CUDA graphs vs eager, decode batch 1", "indexcache", "eager", "decode_b1", "median_itl_ms"),
    ("CUDA graphs vs eager, decode batch 32", "indexcache", "eager", "decode_b32", "median_itl_ms"),
    ("FP8 KV vs BF16 KV, decode at 128K, batch 1", "fp8_kv", "indexcache", "decode_128k_b1", "median_itl_ms"),
    ("FP8 KV vs BF16 KV, decode batch 32", "fp8_kv", "indexcache", "decode_b32", "median_itl_ms"),
    ("FP8 KV vs BF16 KV, prefill 32K", "fp8_kv", "indexcache", "prefill_32k", "median_ttft_ms"),
    ("MTP draft steps with index share vs without, batch 1", "mtp_share_on", "mtp_share_off", "decode_b1", "median_itl_ms"),
    ("MTP draft steps with index share vs without, batch 32", "mtp_share_on", "mtp_share_off", "decode_b32", "median_itl_ms"),
    # the trained small model (held-out text, real acceptance); TPOT: with MTP a streamed chunk holds several tokens
    ("MTP (EAGLE, 3 draft steps) vs none, trained {model}, batch 1", "mtp_share_on", "indexcache", "text_b1", "median_tpot_ms"),
    ("MTP (EAGLE, 3 draft steps) vs none, trained {model}, batch 32", "mtp_share_on", "indexcache", "text_b32", "median_tpot_ms"),
]


def load(results: Path) -> list[dict]:
    return [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines() if line.strip()]


def model_name(row: dict) -> str:
    m = row["meta"]["model"]
    return f"GLM-5.2-shaped ({m['num_hidden_layers']} layers)" if m["hidden_size"] == 6144 else f"hidden {m['hidden_size']}"


def served_as(row: dict) -> str:
    """A trained model's name and how it was served, for the text workloads' ratio labels."""
    backend = "glm_dsa_torch, eager" if "glm_dsa_torch" in row["meta"]["server_args"] else "glm_dsa_triton, CUDA graphs"
    return f"{Path(row['meta']['model_path']).name} ({backend})"


def table(rows: list[dict]) -> str:
    out = ["| model | config | workload | in | out | batch | TTFT ms | TPOT ms | ITL ms | out tok/s | in tok/s | accept | call |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda x, d=1: "" if x is None else f"{x:.{d}f}"  # noqa: E731
    for r in rows:
        if "error" in r:
            why = re.search(r"\w+Error[^|]{0,70}", r["error"])
            out.append(f"| {model_name(r)} | {r['config']} | server did not start: {why.group(0) if why else r['error'][:70]} "
                       f"| | | | | | | | | | {r.get('call', '')} |")
            continue
        cfg = f"{r['config']}@{r['plugin']}" if r.get("plugin") else r["config"]
        out.append(f"| {model_name(r)} | {cfg} | {r['workload']} | {r['input_len'] or 'text'} | {r['output_len']} "
                   f"| {r['batch']} | {f(r['median_ttft_ms'])} | {f(r['median_tpot_ms'], 2)} | {f(r['median_itl_ms'], 2)} "
                   f"| {f(r['output_throughput'])} | {f(r['input_throughput'], 0)} | {f(r['accept_length'], 2)} "
                   f"| {r.get('call', '')} |")
    return "\n".join(out)


def ratios(rows: list[dict]) -> tuple[str, list[dict]]:
    """Each comparison within one machine lease (a feature and its baseline are served minutes apart on
    the same machine); a before/after within one call."""
    ok = [r for r in rows if "error" not in r]
    by = {(r["lease"], r["meta"]["model"]["hidden_size"] == 6144, r["config"], r["workload"]): r
          for r in ok if not r.get("plugin")}
    out = ["| comparison | metric | feature | baseline | speedup | calls |", "|---|---|---|---|---|---|"]
    found = []

    def add(what, metric, a, b):
        x = b[metric] / a[metric]
        found.append({"what": what, "speedup": round(x, 3), "metric": metric, "feature": a[metric], "baseline": b[metric]})
        out.append(f"| {what} | {metric} | {a[metric]:.2f} | {b[metric]:.2f} | **{x:.2f}x** | {a.get('call')}/{b.get('call')} |")

    for lease in sorted({r["lease"] for r in ok}):
        for what, cfg, base, wl, metric in RATIOS:
            shaped = not wl.startswith("text")
            a, b = by.get((lease, shaped, cfg, wl)), by.get((lease, shaped, base, wl))
            if a and b and a[metric] and b[metric]:
                add(what.format(model=served_as(a)) if not shaped else what, metric, a, b)
    for r in ok:  # before/after: a config served by another plugin build (--plugin NAME=DIR)
        a = next((x for x in ok if x["call"] == r["call"] and not x.get("plugin") and x["config"] == r["config"]
                  and x["workload"] == r["workload"]), None)
        metric = "median_ttft_ms" if r["output_len"] == 1 else "median_itl_ms"
        if r.get("plugin") and a and a[metric] and r[metric]:
            add(f"this plugin vs {r['plugin']}, {r['config']} {r['workload']}", metric, a, r)
    return "\n".join(out), found


def plots(rows: list[dict], found: list[dict], profile: dict | None, results: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    big = [r for r in rows if "error" not in r and r["meta"]["model"]["hidden_size"] == 6144]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    dec = [r for r in big if r["config"] == "indexcache" and not r.get("plugin") and r["workload"].startswith("decode_b")]
    if dec:  # one call's batch sweep: the call that served the most batch sizes
        call = max({r["call"] for r in dec}, key=lambda c: sum(r["call"] == c for r in dec))
        dec = sorted((r for r in dec if r["call"] == call), key=lambda r: r["batch"])
    if dec:
        ax.plot([r["batch"] for r in dec], [r["output_throughput"] for r in dec], "o-", label="output tok/s")
        ax2 = ax.twinx()
        ax2.plot([r["batch"] for r in dec], [r["median_itl_ms"] for r in dec], "s--", color="C1", label="median ITL ms")
        ax2.set_ylabel("median inter-token latency (ms)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests (4K in, 256 out)")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"decode, IndexCache plan, CUDA graphs (call {call})")
        ax.legend(loc="upper left")
        ax2.legend(loc="lower right")
    ax = axes[1]
    if found:
        ax.barh([f["what"] for f in found][::-1], [f["speedup"] for f in found][::-1], color="C2")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("speedup (baseline / feature, same machine)")
        ax.set_title("feature ratios")
        ax.tick_params(axis="y", labelsize=7)
    ax = axes[2]
    if profile:
        fams = profile["families_us_per_step"]
        names = list(fams)[::-1] + ["GPU idle (host)"]
        vals = [fams[n]["us"] / 1000 for n in list(fams)[::-1]] + [profile["gpu_idle_us_per_step"] / 1000]
        ax.barh(names, vals, color="C4")
        ax.set_xlabel("ms per decode step")
        ax.set_title(f"decode step, batch {profile['batch']} x {profile['context'] // 1024}K: "
                     f"{profile['wall_us_per_step'] / 1000:.1f} ms")
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle("GLM-5.2-shaped model (8 layers + MTP, FP8 block weights) served by SGLang 0.5.23 + sglang-glm, one H200")
    fig.tight_layout()
    fig.savefig(results / "serving_h200.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", type=Path, default=HERE / "results")
    args = ap.parse_args()
    rows = load(args.results)
    ratio_md, found = ratios(rows)
    profiles = [json.loads(f.read_text()) for f in sorted(args.results.glob("profile_*.json"))]
    hw = next((r["meta"]["hardware"] for r in rows if "meta" in r), "?")
    md = [f"# bench_gpu.py results (generated by report.py)\n\nHardware: {hw}.\n", "## Ratios\n", ratio_md,
          "\n## All runs\n", table(rows)]
    for profile in profiles:
        graphs = "CUDA graphs" if profile.get("cuda_graphs", True) else "eager"
        md += [f"\n## Decode step profile: batch {profile['batch']} x context {profile['context']}, {graphs}\n",
               f"{profile['steps']} steps on {profile['devices']}: wall {profile['wall_us_per_step']:.0f} us/step, "
               f"GPU busy {profile['gpu_busy_us_per_step']:.0f}, idle {profile['gpu_idle_us_per_step']:.0f}, "
               f"{profile['kernel_launches_per_step']:.0f} kernels/step\n",
               "| kernel family | us/step | launches/step |", "|---|---|---|",
               *[f"| {k} | {v['us']:.1f} | {v['launches']:.1f} |" for k, v in profile["families_us_per_step"].items()]]
        if "launched_from" in profile:
            sides = profile["launched_from"]["us_per_step_by_side"]
            md += ["\nGPU time by the code that launched it (us/step): "
                   + ", ".join(f"{k} {v:.0f}" for k, v in sides.items()) + "\n",
                   "| launched from | us/step | launches/step |", "|---|---|---|",
                   *[f"| {o['owner']} | {o['us']:.1f} | {o['launches']:.1f} |"
                     for o in profile["launched_from"]["top_owners_us_per_step"]]]
        if profile.get("host_frames_us_per_step"):
            md += ["\nHost time of the step's functions (us/step, stack tracing on: inflated)\n",
                   "| function | us/step | calls/step |", "|---|---|---|",
                   *[f"| {h['frame']} | {h['us']:.1f} | {h['calls']:.1f} |" for h in profile["host_frames_us_per_step"]]]
    (args.results / "table.md").write_text("\n".join(md) + "\n")
    (args.results / "ratios.json").write_text(json.dumps(found, indent=1))
    graphs = [p for p in profiles if p.get("cuda_graphs", True)]  # the plot shows the largest step profiled
    plots(rows, found, max(graphs, key=lambda p: p["batch"] * p["context"], default=None), args.results)
    print(f"wrote {args.results / 'table.md'}, ratios.json, serving_h200.png")


if __name__ == "__main__":
    main()
