"""Serving benchmark: SGLang's own `python -m sglang.bench_serving` against the plugin's server.

For each configuration (IndexCache plan on/off x MTP on/off) this script starts the server (the
plugin's CPU launcher on a CPU machine, `python -m sglang.launch_server` on a GPU one), runs
`sglang.bench_serving --backend sglang` with a local dataset (held-out Python source from
benchmarks/train/data, in ShareGPT layout, through `--dataset-name random --dataset-path`: no hub
download; `--tokenizer` is the local model directory), reads SGLang's result line, adds the
server's mean acceptance length (MTP) and stops the server. Results land next to this script:

    results/<config>.jsonl      bench_serving's own output line(s)
    results/summary.json/.md    one row per configuration
    results/*.png               throughput, TTFT, TPOT, acceptance length

    python benchmarks/serving/bench_serving.py                     # all four configurations
    python benchmarks/serving/bench_serving.py --mtp off           # IndexCache on/off only
    python benchmarks/serving/bench_serving.py --url http://HOST:PORT --name mine   # a running server

A configuration whose server does not start (e.g. MTP before it is supported) is recorded with
its error instead of numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import requests

from sglang_glm_tools.serving_bench import on_cpu, run_bench_serving, server, write_dataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = HERE / "results"
HELDOUT = ROOT / "benchmarks" / "train" / "data" / "heldout.txt"
BUNDLED = ROOT / "assets" / "glm-dsa-mini"

# IndexCache "on": the plan from the calibration search on glm-dsa-mini (benchmarks/calibration);
# "off": every layer runs its indexer.
PLAN_ON = "FFFFFSSF"
MTP_ARGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def run_bench(url: str, model: Path, dataset: Path, out: Path, args) -> dict:
    return run_bench_serving(
        ["--backend", "sglang", "--base-url", url, "--dataset-name", "random", "--dataset-path", str(dataset),
         "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
         "--random-range-ratio", "1.0", "--num-prompts", str(args.num_prompts),
         "--max-concurrency", str(args.concurrency), "--tokenizer", str(model),
         "--model", str(model), "--seed", "0", "--disable-tqdm", "--warmup-requests", "1"],
        out, args.bench_timeout)


def server_accept_length(url: str) -> float | None:
    try:
        info = requests.get(f"{url}/get_server_info", timeout=10).json()
        return info["internal_states"][0].get("avg_spec_accept_length")
    except Exception:
        return None


KEEP = ["completed", "duration", "request_throughput", "input_throughput", "output_throughput",
        "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
        "p99_tpot_ms", "mean_itl_ms", "mean_e2e_latency_ms", "accept_length"]


def configurations(args, n_layers: int) -> list[tuple[str, list[str]]]:
    plans = {"ic_on": PLAN_ON if args.plan_on is None else args.plan_on, "ic_off": "F" * n_layers}
    mtps = {"on": ["mtp_on"], "off": ["mtp_off"], "both": ["mtp_off", "mtp_on"]}[args.mtp]
    ics = {"on": ["ic_on"], "off": ["ic_off"], "both": ["ic_off", "ic_on"]}[args.indexcache]
    out = []
    for m in mtps:
        for ic in ics:
            extra = ["--json-model-override-args", json.dumps({"index_topk_pattern": plans[ic]})]
            if m == "mtp_on":
                extra += MTP_ARGS
            out.append((f"{ic}_{m}", extra))
    return out


def plot(rows: list[dict], path_prefix: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if "error" not in r]
    if not ok:
        return
    names = [r["config"] for r in ok]
    panels = [("output_throughput", "output tokens/s"), ("mean_ttft_ms", "mean TTFT (ms)"),
              ("mean_tpot_ms", "mean TPOT (ms)"), ("accept_length", "mean acceptance length")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, label) in zip(axes, panels):
        vals = [r.get(key) or 0.0 for r in ok]
        ax.bar(names, vals, color=["#4c72b0" if "mtp_off" in n else "#dd8452" for n in names])
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.3g}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(rows[0].get("title", ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(f"{path_prefix}.png", dpi=110)
    plt.close(fig)


def write_summary(rows, meta):
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = [f"# Serving benchmark ({meta['when']})", "",
             f"{meta['machine']}. Model `{meta['model']}`; bench_serving random over held-out text, "
             f"{meta['num_prompts']} prompts, input {meta['input_len']} / output {meta['output_len']} "
             f"tokens, max concurrency {meta['concurrency']}, server max running requests "
             f"{meta['max_running']}. IndexCache on = plan `{meta['plan_on']}`, off = every layer full. "
             f"MTP = `{' '.join(MTP_ARGS)}`.", "",
             "| config | done | req/s | out tok/s | mean TTFT ms | p99 TTFT ms | mean TPOT ms | "
             "p99 TPOT ms | accept len | load avg |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | not run: {r['error'][:160]} | | | | | | | | |")
            continue
        f = lambda k, p=1: "" if r.get(k) is None else f"{r[k]:.{p}f}"  # noqa: E731
        lines.append(f"| {r['config']} | {r.get('completed')} | {f('request_throughput', 3)} | "
                     f"{f('output_throughput', 2)} | {f('mean_ttft_ms')} | {f('p99_ttft_ms')} | "
                     f"{f('mean_tpot_ms')} | {f('p99_tpot_ms')} | {f('accept_length', 2)} | "
                     f"{r.get('loadavg_1m_after', '')} |")
    if meta.get("note"):
        lines += ["", meta["note"]]
    (RESULTS / "summary.md").write_text("\n".join(lines) + "\n")
    plot(rows, RESULTS / "serving")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=BUNDLED)
    ap.add_argument("--url", help="benchmark this running server instead of starting servers")
    ap.add_argument("--name", default="external", help="config name for --url")
    ap.add_argument("--mtp", choices=["on", "off", "both"], default="both")
    ap.add_argument("--indexcache", choices=["on", "off", "both"], default="both")
    ap.add_argument("--plan-on", default=None, help=f"IndexCache plan for 'on' (default {PLAN_ON})")
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-running", type=int, default=4)
    ap.add_argument("--bench-timeout", type=int, default=1800)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    if on_cpu():
        from sglang_glm.cpu_compat import activate

        activate()  # the bench_serving client subprocess imports sglang too

    RESULTS.mkdir(exist_ok=True)
    dataset = write_dataset(RESULTS / "heldout_sharegpt.json", HELDOUT)
    n_layers = json.loads((args.model / "config.json").read_text())["num_hidden_layers"]
    machine = ("CPU, " + f"{os.cpu_count()} cores (shared)") if on_cpu() else "GPU"
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine,
            "model": str(args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model),
            "num_prompts": args.num_prompts, "input_len": args.input_len,
            "output_len": args.output_len, "concurrency": args.concurrency,
            "max_running": args.max_running, "plan_on": args.plan_on or PLAN_ON, "note": args.note}

    rows = []
    if args.url:
        res = run_bench(args.url, args.model, dataset, RESULTS / f"{args.name}.jsonl", args)
        row = {"config": args.name, **{k: res.get(k) for k in KEEP}}
        row["accept_length"] = row.get("accept_length") or server_accept_length(args.url)
        rows.append(row)
    else:
        for name, extra in configurations(args, n_layers):
            print(f"[{name}]", flush=True)
            with server(args.model, extra, RESULTS / f"{name}.server.log", args.max_running) as (url, err):
                if err:
                    print(f"  not run: {err}", flush=True)
                    rows.append({"config": name, "error": err})
                    continue
                try:
                    res = run_bench(url, args.model, dataset, RESULTS / f"{name}.jsonl", args)
                except Exception as e:  # keep going: the other configurations still count
                    rows.append({"config": name, "error": str(e)[-300:]})
                    continue
                row = {"config": name, **{k: res.get(k) for k in KEEP}}
                row["loadavg_1m_after"] = round(os.getloadavg()[0], 1)  # shared machines: context
                if "mtp_on" in name:
                    row["accept_length"] = row.get("accept_length") or server_accept_length(url)
                rows.append(row)
                print("  " + json.dumps(row), flush=True)
    write_summary(rows, meta)
    print((RESULTS / "summary.md").read_text())


if __name__ == "__main__":
    main()
