"""A fresh server's first long prompt against the ones after it, and the start-up it took (issue 31).

Per KV-cache dtype (`--kv bf16 fp8`) one fresh `sglang.launch_server` with the plugin (bench_gpu.py's
flags and model handling): once it reports ready, `--context`-token prompts of distinct random ids
(no radix-cache hit) are sent one at a time, each a one-token greedy request, so its latency is the
prompt's time to first token. The first is the user's first request; the median of the next
`--next` is the warm cost. The start-up comes from the server's log (`startup_breakdown.py`). With
`--restart` the BF16 server starts once more, with the Triton cache the first start filled: the
difference is what that cache saves. The first start gets an empty Triton cache (`--triton-cache`,
emptied first), so the comparison holds on a machine whose default cache is already warm; SGLang's
own CUDA JIT cache (SGLANG_JIT_CACHE_DIR) is left as the environment sets it.

    python benchmarks/serving/gpu/make_glm52_shaped.py /tmp/glm52
    python benchmarks/serving/gpu/cold_start.py --model /tmp/glm52 --out $OUT --restart

Writes OUT/cold_start.json in issue 31's format: {"bf16": {"first_ttft_ms", "next10_median_ttft_ms",
"ratio", "startup": {...}}, "fp8": {...}, "startup_s": {phase: seconds} (the first BF16 start),
"second_start": {...}} and prints a table. On a CPU machine the prompts are `--scale`d down: a
smoke run of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import time
from pathlib import Path

import requests

from bench_gpu import configs, hardware, server_setup
from sglang_glm_tools.serving_bench import on_cpu, server
from startup_breakdown import breakdown

KV_CONFIGS = {"bf16": "indexcache", "fp8": "fp8_kv"}


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """n prompts of random ids; distinct first ids so that no prompt is a prefix hit of another."""
    rng = random.Random(seed)
    return [[2 + i] + [rng.randrange(2, vocab) for _ in range(length - 1)] for i in range(n)]


def ttft_ms(url: str, ids: list[int]) -> float:
    t0 = time.perf_counter()
    r = requests.post(f"{url}/generate", timeout=600, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1e3


def serve_and_time(model: Path, flags: list[str], log: Path, length: int, n_next: int, vocab: int, seed: int) -> dict:
    t0 = time.time()
    with server(model, flags, log, 8) as (url, err):
        if err:
            return {"error": err}
        up_s = round(time.time() - t0, 1)
        first, *rest = prompts(1 + n_next, length, vocab, seed)
        first_ms = ttft_ms(url, first)
        next_ms = [ttft_ms(url, p) for p in rest]
    median = statistics.median(next_ms)
    return {"first_ttft_ms": round(first_ms, 1), f"next{n_next}_median_ttft_ms": round(median, 1),
            "ratio": round(first_ms / median, 3), f"next{n_next}_ttft_ms": [round(x, 1) for x in next_ms],
            "prompt_tokens": length, "server_up_s": up_s, "startup": breakdown(log.read_text(errors="replace"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="made by make_glm52_shaped.py (or a trained model)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kv", nargs="+", default=list(KV_CONFIGS), choices=list(KV_CONFIGS))
    ap.add_argument("--context", type=int, default=32768, help="prompt tokens")
    ap.add_argument("--next", type=int, default=10, help="prompts timed after the first")
    ap.add_argument("--restart", action="store_true", help="start the first server's config again (warm Triton cache)")
    ap.add_argument("--triton-cache", type=Path, default=Path("/tmp/cold_start_triton_cache"),
                    help="TRITON_CACHE_DIR of every server here; emptied before the first start")
    ap.add_argument("--scale", type=float, default=None, help="prompt length scale (default 1 on GPU, 1/256 on CPU)")
    args = ap.parse_args()
    args.model, args.out = args.model.resolve(), args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = not on_cpu()
    length = max(16, int(args.context * (args.scale or (1.0 if gpu else 1 / 256))))
    config = json.loads((args.model / "config.json").read_text())
    known = configs(config["num_hidden_layers"])
    _, extra, _ = server_setup(args.model, gpu)
    result: dict = {"hardware": hardware(), "model": str(args.model), "server_args": extra}
    print(f"{result['hardware']}; prompts of {length} tokens", flush=True)

    shutil.rmtree(args.triton_cache, ignore_errors=True)
    args.triton_cache.mkdir(parents=True)
    os.environ["TRITON_CACHE_DIR"] = str(args.triton_cache)  # the servers inherit it
    result["triton_cache"] = str(args.triton_cache)
    runs = [(kv, kv) for kv in args.kv] + ([(args.kv[0], "second_start")] if args.restart else [])
    for i, (kv, label) in enumerate(runs):
        flags = [*known[KV_CONFIGS[kv]], *extra]
        row = serve_and_time(args.model, flags, args.out / f"server_{label}.log", length, args.next,
                             config["vocab_size"], seed=i)
        result[label] = row
        print(f"[{label}] " + (row["error"] if "error" in row else
              f"first {row['first_ttft_ms']:.0f} ms, next median {row[f'next{args.next}_median_ttft_ms']:.0f} ms "
              f"({row['ratio']:.2f}x), up in {row['server_up_s']:.0f} s"), flush=True)
    first = result.get(args.kv[0], {}).get("startup", {})
    result["startup_s"] = {**first.get("sglang", {}), "log_to_ready": first.get("log_to_ready_s"),
                           "plugin_share": first.get("plugin_share_s")}
    (args.out / "cold_start.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
