"""Where a decode step's time goes: a torch-profiler trace of a few decode steps of the served model at
batch B and context L, summarised by kernel family.

The server is bench_gpu.py's (same flags, same configs). B requests of L random token ids are sent at
once, streamed; once every request has its first token (all prefills done, so each step decodes the
whole batch) SGLang's `/start_profile` records `--steps` forward steps. The summary gives, per step: the
wall span, the GPU busy time (union of kernel intervals), the idle remainder (host: scheduler, Python,
launches), and the busy time split into kernel families, per layer where the family is per layer.

    python benchmarks/serving/gpu/profile_decode.py --model /tmp/glm52 --out $OUT --batch 32 --context 131072
    python benchmarks/serving/gpu/profile_decode.py --model /tmp/glm52 --out DIR --from-trace T.trace.json.gz

`--from-trace` summarises a trace written earlier (same --batch/--context/--steps) without serving.
Traces carry Python stacks: each kernel is attributed to the innermost plugin frame (`sglang_glm/...`)
or, failing that, SGLang frame that launched it, and the host time of the scheduler's and the plugin's
per-step functions is summed (stack tracing inflates host times). With CUDA graphs the model's kernels
all come from the graph replay; `--eager` serves without graphs so they are attributed one by one.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import threading
import time
from pathlib import Path

import requests

from bench_gpu import configs, hardware, server_setup
from bench_serving import server

# First match wins; names are the kernels' own (Triton function names, SGLang JIT and CUTLASS symbols).
FAMILIES = [
    ("indexer logits", r"_indexer_logits_kernel"),
    ("top-k select", r"_sample_bound_kernel|_candidates_kernel|_select_kernel"),
    ("sparse MLA", r"_sparse_mla_fwd_kernel|_merge_splits_kernel"),
    ("MoE experts", r"fused_moe"),
    ("MoE routing", r"moe_align|count_and_sort|topk_softmax|grouped_topk|moe_fused_gate|moe_sum|biased|topk"),
    ("FP8 block GEMM", r"w8a8|block_fp8|_per_token_group_quant|per_token_group_quant"),
    ("BF16 GEMM", r"nvjet|gemm|cutlass|xmma|gemv|cublas|bmm"),
    # The GPU machine's sgl_kernel stand-in runs RMSNorm as PyTorch ops: mean, pow, rsqrt, mul.
    ("norms", r"norm|MeanOps|rsqrt|pow_tensor_scalar"),
    ("rope", r"rope"),
    ("KV write", r"set_mla_kv|store_kv|_store|kv_buffer"),
    ("activation", r"silu|act_and_mul|activation"),
]


def family(name: str) -> str:
    for fam, pattern in FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return fam
    return "other (elementwise, copies, sampling)"


def _short(frame: str) -> str:
    # "…/site-packages/sglang_glm/models/glm_dsa.py(100): forward" -> "sglang_glm/models/glm_dsa.py: forward"
    m = re.search(r"((?:sglang_glm|sglang)/[^(]*)\(\d+\): (.*)", frame)
    return f"{m.group(1)}: {m.group(2)}" if m else frame


def launch_owners(events: list[dict]) -> dict[int, str]:
    """Kernel correlation id -> "plugin <frame>" / "sglang <frame>" / "other": the innermost frame of
    the launching thread's Python stack (needs a trace recorded with_stack)."""
    frames: dict[tuple, list] = {}
    launches: dict[tuple, list] = {}
    for e in events:
        if e.get("cat") == "python_function" and "dur" in e:
            frames.setdefault((e["pid"], e["tid"]), []).append(e)
        elif e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            launches.setdefault((e["pid"], e["tid"]), []).append(e)
    owners = {}
    for key, runs in launches.items():
        fs = sorted(frames.get(key, []), key=lambda f: (f["ts"], -f["dur"]))
        stack, i = [], 0
        for e in sorted(runs, key=lambda e: e["ts"]):
            t = e["ts"]
            while i < len(fs) and fs[i]["ts"] <= t:  # frames nest on one thread: a stack sweep
                while stack and stack[-1]["ts"] + stack[-1]["dur"] < fs[i]["ts"]:
                    stack.pop()
                stack.append(fs[i])
                i += 1
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < t:
                stack.pop()
            names = [f["name"] for f in reversed(stack)]
            owner = next((f"plugin {_short(n)}" for n in names if "sglang_glm/" in n), None)
            owner = owner or next((f"sglang {_short(n)}" for n in names if "sglang/" in n), "other")
            owners[e["args"]["correlation"]] = owner
    return owners


# Host functions of a decode step: SGLang's scheduler loop and model runner, and every plugin frame.
HOST_FRAMES = (r"scheduler\.py\(\d+\): (run_batch|process_batch_result|get_next_batch_to_run)$"
               r"|model_runner\.py\(\d+\): forward$|cuda_graph_backend\.py\(\d+\): replay$|sglang_glm/")


def host_frames(events: list[dict], steps: int) -> list[dict]:
    agg: dict[str, list] = {}
    for e in events:
        if e.get("cat") == "python_function" and "dur" in e and re.search(HOST_FRAMES, e["name"]):
            a = agg.setdefault(_short(e["name"]), [0.0, 0])
            a[0] += e["dur"]
            a[1] += 1
    return [{"frame": k, "us": round(v[0] / steps, 1), "calls": round(v[1] / steps, 1)}
            for k, v in sorted(agg.items(), key=lambda kv: -kv[1][0])[:20]]


def summarize(trace_path: Path, steps: int) -> dict:
    with gzip.open(trace_path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not kernels:
        raise RuntimeError(f"{trace_path}: no GPU kernels in the trace")
    kernels.sort(key=lambda e: e["ts"])
    start, end = kernels[0]["ts"], max(e["ts"] + e["dur"] for e in kernels)
    busy, cur_s, cur_e = 0.0, None, None
    for e in kernels:  # union of intervals: overlapping kernels on two streams count once
        s, t = e["ts"], e["ts"] + e["dur"]
        if cur_e is None or s > cur_e:
            busy += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, t
        else:
            cur_e = max(cur_e, t)
    busy += cur_e - cur_s
    fams: dict[str, dict] = {}
    names: dict[str, list] = {}
    for e in kernels:
        f = fams.setdefault(family(e["name"]), {"us": 0.0, "launches": 0})
        f["us"] += e["dur"]
        f["launches"] += 1
        n = names.setdefault(e["name"][:120], [0.0, 0])
        n[0] += e["dur"]
        n[1] += 1
    per_step = lambda x: round(x / steps, 1)  # noqa: E731
    owners = launch_owners(events)
    by_owner: dict[str, list] = {}
    for e in kernels if owners else []:
        o = by_owner.setdefault(owners.get(e.get("args", {}).get("correlation"), "other"), [0.0, 0])
        o[0] += e["dur"]
        o[1] += 1
    attributed = {}
    if by_owner:
        side = lambda k: k.split(" ", 1)[0]  # noqa: E731
        attributed = {
            "us_per_step_by_side": {w: per_step(sum(v[0] for k, v in by_owner.items() if side(k) == w))
                                    for w in ("plugin", "sglang", "other")},
            "top_owners_us_per_step": [{"owner": k, "us": per_step(v[0]), "launches": round(v[1] / steps, 1)}
                                       for k, v in sorted(by_owner.items(), key=lambda kv: -kv[1][0])[:40]],
        }
    return {
        "devices": [d.get("name") for d in trace.get("deviceProperties", [])],
        "steps": steps,
        "wall_us_per_step": per_step(end - start),
        "gpu_busy_us_per_step": per_step(busy),
        "gpu_idle_us_per_step": per_step(end - start - busy),
        "kernel_launches_per_step": round(len(kernels) / steps, 1),
        "families_us_per_step": {k: {"us": per_step(v["us"]), "launches": round(v["launches"] / steps, 1)}
                                 for k, v in sorted(fams.items(), key=lambda kv: -kv[1]["us"])},
        "top_kernels_us_per_step": [{"name": k, "us": per_step(v[0]), "launches": round(v[1] / steps, 1)}
                                    for k, v in sorted(names.items(), key=lambda kv: -kv[1][0])[:25]],
        **({"launched_from": attributed} if attributed else {}),
        "host_frames_us_per_step": host_frames(events, steps),
    }


def stream_request(url: str, ids: list[int], new_tokens: int, first: threading.Event) -> None:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=3600) as r:
        for line in r.iter_lines():
            if line:
                first.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", default="indexcache")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--timeout-s", type=float, default=400, help="give up waiting for the prefills after this")
    ap.add_argument("--from-trace", type=Path, default=None, help="summarise this trace instead of serving")
    ap.add_argument("--eager", action="store_true", help="serve with --disable-cuda-graph")
    args = ap.parse_args()
    cfg = json.loads((args.model / "config.json").read_text())
    trace = args.from_trace or record_trace(args, cfg)
    summary = {"hardware": "from the trace's devices" if args.from_trace else hardware(), "config": args.config,
               "cuda_graphs": not args.eager, "batch": args.batch,
               "context": args.context, "num_hidden_layers": cfg["num_hidden_layers"],
               "indexer_types": cfg.get("indexer_types"), "trace": trace.name, **summarize(trace, args.steps)}
    args.out.mkdir(parents=True, exist_ok=True)
    mode = "_eager" if args.eager else ""
    (args.out / f"profile_{args.config}{mode}_b{args.batch}_ctx{args.context}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("wall_us_per_step", "gpu_busy_us_per_step", "gpu_idle_us_per_step",
                                              "kernel_launches_per_step")}), flush=True)
    for fam, v in summary["families_us_per_step"].items():
        print(f"  {fam:40s} {v['us']:9.1f} us/step  {v['launches']:6.1f} launches", flush=True)


def record_trace(args, cfg: dict) -> Path:
    trace_dir = args.out / f"trace_{args.config}{'_eager' if args.eager else ''}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    _, extra, _ = server_setup(args.model, gpu=True)
    os.environ["SGLANG_TORCH_PROFILER_DIR"] = str(trace_dir)
    flags = [*configs(cfg["num_hidden_layers"])[args.config], *extra, *(["--disable-cuda-graph"] if args.eager else [])]
    rng = random.Random(0)
    prompts = [[rng.randrange(2, cfg["vocab_size"]) for _ in range(args.context)] for _ in range(args.batch)]
    t0 = time.time()
    with server(args.model, flags, args.out / f"server_profile_{args.config}.log", args.batch) as (url, err):
        if err:
            raise SystemExit(f"server did not start: {err}")
        firsts = [threading.Event() for _ in prompts]
        for ids, ev in zip(prompts, firsts):  # 4096 new tokens: 20 s of decoding at batch 1 on the H200
            threading.Thread(target=stream_request, args=(url, ids, 4096, ev), daemon=True).start()
        shown = 0.0
        while sum(e.is_set() for e in firsts) < args.batch:  # polled often: batch 1 decodes ~180 tokens/s
            if time.time() - t0 > args.timeout_s:
                raise SystemExit(f"only {sum(e.is_set() for e in firsts)}/{args.batch} prefills done in time")
            if time.time() - shown > 10:
                print(f"  prefilled {sum(e.is_set() for e in firsts)}/{args.batch} (t={time.time() - t0:.0f}s)", flush=True)
                shown = time.time()
            time.sleep(0.2)
        time.sleep(0.5)
        r = requests.post(f"{url}/start_profile", json={"num_steps": args.steps, "activities": ["CPU", "GPU"],
                                                        "with_stack": True, "output_dir": str(trace_dir)}, timeout=60)
        print(f"  profiling {args.steps} decode steps: {r.status_code} {r.text[:200]}", flush=True)
        for _ in range(120):  # the trace is written when the steps are done
            traces = sorted(trace_dir.glob("*.trace.json.gz"))
            if traces and time.time() - traces[-1].stat().st_mtime > 3:
                break
            time.sleep(1)
        else:
            raise SystemExit("no trace written")
    return traces[-1]


if __name__ == "__main__":
    main()
