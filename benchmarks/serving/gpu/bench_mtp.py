"""MTP speculative decoding against plain decode on one GPU, one run: draft shapes x batch sizes.

Servers (bench_gpu.py's flags, a trained model with an MTP layer, held-out text so drafts are accepted
as in service): `indexcache` (no speculation) and each `--configs` entry (default: EAGLE chains of
1/2, 2/3, 3/4 and 5/6 draft steps / verified tokens, and 3/4 with the overlap scheduler off). They
start together with small pools (start-up dominates a run) and stay up to the end: bench_serving
`text_b1`, `text_b8`, `text_b32` (256 new tokens, greedy; bench_serving's TPOT and ITL are medians
over a workload's requests; its ITL is per token, a streamed chunk's gap spread over its tokens).
Every server first runs every workload once, untimed and side by side, so that no kernel compiles
inside a timed run (the first server timed in session 12's run paid first-use compiles the later
ones found in Triton's disk cache: p99 TTFT 1.5 s against 0.2 s). Each server then generates greedy
tokens for 8 held-out prompts in one batch; every MTP server's tokens are compared with the plain
server's, and where they part the float64 reference's top-2 margin at that token is recorded
(bfloat16 batches may part only at near ties). Then `--repeats` timed rounds (default 3): every
server in turn runs every workload, the order rotated each round; the tables give the median over
the rounds and the range of the per-round speedups.

    python benchmarks/serving/gpu/bench_mtp.py --model /tmp/models/glm5-geometry-carry --out $OUT

Writes, as it goes, OUT/mtp_results.jsonl (one line per server, workload and round, bench_serving's
numbers) and OUT/mtp_tokens.json; at the end OUT/mtp_speed.json (issue 29's format: EAGLE 3/1/4
against plain per batch), OUT/mtp_shapes.json, OUT/mtp_shapes.md and OUT/mtp_shapes.png (every
shape at every batch size), OUT/startup.json (each server's start-up by phase, `startup_breakdown.py`). `--tables`
rebuilds the tables from a mtp_results.jsonl (a run cut short keeps its rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench_gpu import HELDOUT, KEEP, WORKLOADS, bench_serving, configs, hardware, median_of, server_info, server_setup
from startup_breakdown import breakdown

from sglang_glm_tools.serving_bench import BenchClient, server

PLAIN = "indexcache"
DEFAULT_CONFIGS = ["eagle_1_2", "eagle_2_3", "eagle_3_4", "eagle_5_6", "eagle_3_4_no_overlap"]
HEADLINE = "eagle_3_4"  # issue 29's targets: EAGLE 3 steps / topk 1 / 4 draft tokens
BATCHES = {"text_b1": 1, "text_b8": 8, "text_b32": 32}
# Several servers share the GPU while they wait: small pools, graphs up to the largest batch.
SHARED_GPU_ARGS = ["--mem-fraction-static", "0.08", "--max-total-tokens", "131072",
                   "--cuda-graph-max-bs-decode", "32"]
TOKEN_PROMPTS, TOKEN_NEW = 8, 128
COMPILE_PROBE = Path(__file__).resolve().parents[3] / "tests" / "gpu" / "compile_probe"  # a test-only plugin


def serve_in_background(model: Path, flags: list[str], log: Path, ready: queue.Queue, done: threading.Event):
    """Holds one server open until `done`; puts (url or None, error) on `ready` once it answers."""
    with server(model, flags, log, 32, timeout=480) as (url, err):
        ready.put((url, err))
        if url:
            done.wait()


def greedy_tokens(url: str, prompts: list[str]) -> list[list[int]]:
    params = {"temperature": 0, "max_new_tokens": TOKEN_NEW, "ignore_eos": True}
    out = requests.post(f"{url}/generate", json={"text": prompts, "sampling_params": params}, timeout=600).json()
    return [o["output_ids"] for o in out]


def parting_margins(model: Path, prompts: list[str], plain: list[list[int]], other: list[list[int]]) -> list[dict]:
    """Where two greedy continuations part: the float64 reference's top-2 logit margin there."""
    import torch
    from transformers import AutoTokenizer

    from sglang_glm_tools.reference import load_reference_model

    tok = AutoTokenizer.from_pretrained(str(model))
    ref = load_reference_model(model, dtype=torch.float64, device="cuda")
    partings = []
    for i, (prompt, a, b) in enumerate(zip(prompts, plain, other)):
        j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if j is None:
            continue
        ids = torch.tensor([tok(prompt)["input_ids"] + a[:j]], device="cuda")
        with torch.no_grad():
            top2 = ref(ids).logits[0, -1].double().topk(2)
        partings.append({"prompt": i, "token": j, "plain": a[j], "mtp": b[j],
                         "reference_margin": round(float(top2.values[0] - top2.values[1]), 4)})
    return partings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a trained GLM-DSA checkpoint with its MTP layer")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    ap.add_argument("--plain", default=PLAIN, help="the server without speculation every config is measured against "
                    "(same flags but speculation: e.g. prefill_graphs for the *_prefill_graphs configs)")
    ap.add_argument("--headline", default=HEADLINE, help="the config mtp_speed.json reports")
    ap.add_argument("--workloads", nargs="+", default=list(BATCHES))
    ap.add_argument("--tables", type=Path, default=None, help="only rebuild the tables from this mtp_results.jsonl")
    ap.add_argument("--compile-probe", action="store_true",
                    help="servers log every Triton compile (tests/gpu/compile_probe); OUT/compiles_timed.json "
                         "lists those that fell inside each server's timed workloads")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds of every workload on every server")
    args = ap.parse_args()
    if args.tables:
        write_tables([json.loads(line) for line in args.tables.read_text().splitlines()], args.tables.parent,
                     args.plain, args.headline)
        return
    if not (args.model and args.out):
        ap.error("--model and --out are required unless --tables is given")
    args.model, args.out = args.model.resolve(), args.out.resolve()
    t0 = time.time()
    n_layers = json.loads((args.model / "config.json").read_text())["num_hidden_layers"]
    known = configs(n_layers)
    _, extra, _ = server_setup(args.model, gpu=True)
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(args.out)  # servers import the installed plugin, not a working tree's (bench_gpu.py)
    meta = {"hardware": hardware(), "server_args": extra + SHARED_GPU_ARGS, "model_path": str(args.model)}
    print(f"{meta['hardware']}; servers: {[args.plain] + args.configs}", flush=True)

    if args.compile_probe:  # the servers inherit this environment
        os.environ["GLM_COMPILE_PROBE_LOG"] = str(args.out / "compiles.jsonl")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(COMPILE_PROBE), os.environ.get("PYTHONPATH", "")])
    names = [args.plain] + args.configs
    ready = {n: queue.Queue() for n in names}
    done = {n: threading.Event() for n in names}
    threads = []
    for n in names:  # later flags win: the shared-GPU pool over bench_gpu's whole-GPU one
        flags = [*known[n], *extra, *SHARED_GPU_ARGS]
        threads.append(threading.Thread(target=serve_in_background,
                                        args=(args.model, flags, args.out / f"server_{n}.log", ready[n], done[n])))
        threads[-1].start()
    # a timeout's SIGTERM unwinds every server's context (their process groups stop), not orphans them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench_mtp: terminated"))
    try:
        measure(args, names, ready, meta, t0)
    finally:
        for n in names:
            done[n].set()
        for t in threads:
            t.join(timeout=60)
    print(f"done in {time.time() - t0:.0f}s", flush=True)


def measure(args, names: list[str], ready: dict, meta: dict, t0: float) -> None:
    """Greedy tokens of every server, then `--repeats` rounds of every workload on every server (one
    at a time, the order rotated each round, so that drift over the run falls on every server alike)."""
    texts = [HELDOUT.read_text()[i * 997: i * 997 + 1200] for i in range(TOKEN_PROMPTS)]
    rows, tokens, token_report = [], {}, {}
    windows: dict[str, list] = {n: [] for n in names}
    results = args.out / "mtp_results.jsonl"
    urls = {}
    for n in names:
        urls[n], err = ready[n].get()
        print(f"[{n}] up at t={time.time() - t0:.0f}s" if urls[n] else f"[{n}] not started: {err}", flush=True)
    up = [n for n in names if urls[n]]
    with contextlib.ExitStack() as stack:
        clients = {n: stack.enter_context(BenchClient()) for n in up}  # one kept bench_serving process each
        # Every workload once on every server, side by side and untimed: kernel variants a workload's
        # batches need compile on first use (Triton's disk cache then serves every later process),
        # and a compile inside a timed run stalls it by up to ~1.5 s.
        with ThreadPoolExecutor(len(up)) as pool:
            list(pool.map(lambda n: [bench_serving(urls[n], args.model, WORKLOADS[w], args.out / f"warmup_{n}_{w}.json",
                                                   client=clients[n]) for w in args.workloads], up))
        print(f"warm-up done at t={time.time() - t0:.0f}s", flush=True)
        for n in up:
            tokens[n] = greedy_tokens(urls[n], texts)
        for n in up:
            if n != args.plain and args.plain in tokens:
                token_report[n] = {"identical": sum(a == b for a, b in zip(tokens[args.plain], tokens[n])),
                                   "of": len(texts),
                                   "partings": parting_margins(args.model, texts, tokens[args.plain], tokens[n])}
        (args.out / "mtp_tokens.json").write_text(json.dumps(token_report, indent=1))
        for n, rep in token_report.items():
            print(f"[{n}] greedy tokens: {rep['identical']} of {rep['of']} prompts identical to plain; partings "
                  f"(prompt, token, reference margin): {[(p['prompt'], p['token'], p['reference_margin']) for p in rep['partings']]}",
                  flush=True)
        for r in range(args.repeats):
            for n in up[r % len(up):] + up[: r % len(up)]:
                timed_from = time.time()
                for wname in args.workloads:
                    w = WORKLOADS[wname]
                    res = bench_serving(urls[n], args.model, w, args.out / f"{n}_{wname}_r{r}.json", client=clients[n])
                    row = {"config": n, "workload": wname, "batch": w.batch, "repeat": r,
                           **{k: res.get(k) for k in KEEP}, **server_info(urls[n]), "meta": meta}
                    rows.append(row)
                    with results.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"  [{n} repeat {r}] {wname}: TPOT {row['median_tpot_ms']:.2f} ms, ITL "
                          f"{row['median_itl_ms']:.2f} ms, out {row['output_throughput']:.0f} tok/s, accept "
                          f"{row['accept_length']} (t={time.time() - t0:.0f}s)", flush=True)
                windows[n].append((timed_from, time.time()))

    if rows:
        write_tables(rows, args.out, args.plain, args.headline)
    (args.out / "startup.json").write_text(json.dumps(  # issue 31: each server's start-up by phase
        {n: breakdown((args.out / f"server_{n}.log").read_text(errors="replace")) for n in up}, indent=1))
    compiles = args.out / "compiles.jsonl"
    if compiles.exists():  # servers are timed one at a time, so a compile in a window is that server's
        seen = [json.loads(line) for line in compiles.read_text().splitlines()]
        timed = {n: [c for c in seen if any(a <= c["time"] <= b for a, b in spans)] for n, spans in windows.items()}
        (args.out / "compiles_timed.json").write_text(json.dumps(
            {n: {"count": len(c), "seconds": round(sum(x["seconds"] or 0 for x in c), 3),
                 "kernels": sorted({x["kernel"] for x in c}), "variants": c[:50]} for n, c in timed.items()}, indent=1))


def write_tables(rows: list[dict], out: Path, plain_name: str = PLAIN, headline: str = HEADLINE) -> None:
    """mtp_speed.json (issue 29's headline shape), mtp_shapes.json/.md (every shape): per config and
    batch the median over repeats of bench_serving's median TPOT and ITL, the speedup the ratio of
    the medians, with the lowest and highest per-repeat ratio beside it."""
    meta = rows[0]["meta"]
    by: dict[tuple, list] = {}
    for r in rows:
        by.setdefault((r["config"], r["batch"]), []).append(r)

    shapes = {}
    for (name, batch), rs in sorted(by.items()):
        plain = by.get((plain_name, batch))
        if name == plain_name or plain is None:
            continue
        p_tpot, m_tpot = median_of(plain, "median_tpot_ms"), median_of(rs, "median_tpot_ms")
        pairs = [a["median_tpot_ms"] / b["median_tpot_ms"] for a, b in zip(
            sorted(plain, key=lambda r: r.get("repeat", 0)), sorted(rs, key=lambda r: r.get("repeat", 0)))]
        shapes.setdefault(name, {})[str(batch)] = {
            "plain_tpot_ms": p_tpot, "mtp_tpot_ms": m_tpot, "speedup": round(p_tpot / m_tpot, 3),
            "speedup_range": [round(min(pairs), 3), round(max(pairs), 3)], "repeats": len(rs),
            "plain_itl_ms": median_of(plain, "median_itl_ms"), "mtp_itl_ms": median_of(rs, "median_itl_ms"),
            "accept_length": median_of(rs, "accept_length")}
    head = {"hardware": meta["hardware"], "model": meta["model_path"], "shape": "EAGLE 3 steps / topk 1 / 4 draft tokens",
            "config": headline, "plain": plain_name, "batch": shapes.get(headline, {})}
    (out / "mtp_speed.json").write_text(json.dumps(head, indent=1))
    (out / "mtp_shapes.json").write_text(json.dumps({"hardware": meta["hardware"], "shapes": shapes}, indent=1))
    batches = sorted({int(b) for s in shapes.values() for b in s})
    lines = ["| config | " + " | ".join(f"batch {b}: speedup [range] (accept)" for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    for name, per in shapes.items():
        cells = [f"{c['speedup']:.2f}x [{c['speedup_range'][0]:.2f}-{c['speedup_range'][1]:.2f}] "
                 + (f"({c['accept_length']:.2f})" if c["accept_length"] else "(n/a)") if (c := per.get(str(b))) else ""
                 for b in batches]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "mtp_shapes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    plot_shapes(shapes, batches, meta["hardware"], out / "mtp_shapes.png")


# issue 29's targets for EAGLE 3/4 on the trained carry model, per batch size
TARGETS = {1: 1.6, 8: 1.3, 32: 1.0}


def plot_shapes(shapes: dict, batches: list[int], hardware: str, path: Path) -> None:
    """Speedup over plain decode per shape and batch: bars at the median, whiskers at the range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(shapes), 1)
    for i, (name, per) in enumerate(shapes.items()):
        xs = [j + (i - (len(shapes) - 1) / 2) * width for j, b in enumerate(batches) if str(b) in per]
        cells = [per[str(b)] for b in batches if str(b) in per]
        mid = [c["speedup"] for c in cells]
        err = [[m - c["speedup_range"][0] for m, c in zip(mid, cells)], [c["speedup_range"][1] - m for m, c in zip(mid, cells)]]
        ax.bar(xs, mid, width, yerr=err, capsize=2, label=name)
    for j, b in enumerate(batches):
        if b in TARGETS:
            ax.hlines(TARGETS[b], j - 0.45, j + 0.45, colors="k", linestyles="dashed", linewidth=1)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    ax.set_ylabel("MTP speedup over plain (TPOT)")
    ax.set_title(f"EAGLE draft shapes, glm5-geometry-carry, held-out text ({hardware.split(',')[0]});"
                 " dashed: issue 29 targets", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
