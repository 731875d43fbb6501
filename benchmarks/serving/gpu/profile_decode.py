"""Where a decode step's time goes: a torch-profiler trace of a few forward steps of the served model
at batch B and context L, summarised by kernel family, and for MTP servers by phase of the round.

The server is bench_gpu.py's (same flags, same configs). Per batch size B (one server, `--batch 1 8 32`):
B requests of L tokens are sent at once, streamed; once every request has its first token (all
prefills done, so each step decodes the whole batch) SGLang's `/start_profile` records `--steps`
forward steps, then every request is aborted. The summary gives, per step: the wall span, the GPU busy
time (union of kernel intervals), the idle remainder (host: scheduler, Python, launches), and the
busy time split into kernel families. An MTP server's step is a speculative round; `spec_round`
splits it into draft steps, target verify, verify/accept ops and draft-extend (SGLang's profiler
spans), each with its GPU time, graph replays and eager launches, and the round's idle GPU time.

    python benchmarks/serving/gpu/profile_decode.py --model /tmp/glm52 --out $OUT --batch 32 --context 131072
    python benchmarks/serving/gpu/profile_decode.py --model assets/glm5-geometry-carry --out $OUT \
        --config eagle_3_4 --text --context 512 --batch 1 8 32 --steps 24 --no-stack
    python benchmarks/serving/gpu/profile_decode.py --model /tmp/glm52 --out DIR --from-trace T.trace.json.gz

`--text` sends held-out text (a trained model then accepts drafts as in service); `--plugin DIR` serves
a plugin installed there (a before/after pair in one run); `--peer-site DIR` serves SGLang's own GLM-DSA
path instead, as bench_gpu.py's `CONFIG@sglang` does (issue 30: the gap named per part). `--from-trace` summarises a trace written
earlier (same --batch/--context/--steps) without serving. Traces carry Python stacks unless
`--no-stack` (stack tracing inflates host times: use it for round timings): each kernel is
attributed to the innermost plugin frame (`sglang_glm/...`) or, failing that, SGLang frame that
launched it, and the host time of the scheduler's and the plugin's per-step functions is summed.
With CUDA graphs the model's kernels all come from the graph replay; `--eager` serves without
graphs so they are attributed one by one.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import os
import random
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import requests

from bench_gpu import HELDOUT, check_peer_log, configs, hardware, peer_flags, server_setup
from sglang_glm_tools import peer
from sglang_glm_tools.serving_bench import server

# First match wins; names are the kernels' own (Triton function names, SGLang JIT and CUTLASS symbols).
FAMILIES = [
    # the plugin's Triton kernels (both indexer launches, the Hopper Gluon sparse MLA); SGLang's own path's
    # DeepGEMM MQA logits and FlashMLA's sparse prefill / decode / combine kernels (the peer)
    ("indexer logits", r"_indexer_logits|mqa_logits"),
    ("top-k select", r"_sample_bound_kernel|_candidates_kernel|_select_kernel|_select_small_kernel"),
    ("sparse MLA", r"sparse_mla_fwd|_merge_splits_kernel|sparse_attn_fwd|flash_fwd_splitkv_mla|mla_combine"),
    # torch.topk: the peer's indexer top-k (--dsa-topk-backend torch), or MoE routing where it calls it
    ("torch top-k", r"gatherTopK|sbtopk|radixSelect"),
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


def host_frames(events: list[dict], steps: int, pattern: str = HOST_FRAMES) -> list[dict]:
    agg: dict[str, list] = {}
    for e in events:
        if e.get("cat") == "python_function" and "dur" in e and re.search(pattern, e["name"]):
            a = agg.setdefault(_short(e["name"]), [0.0, 0])
            a[0] += e["dur"]
            a[1] += 1
    return [{"frame": k, "us": round(v[0] / steps, 1), "calls": round(v[1] / steps, 1)}
            for k, v in sorted(agg.items(), key=lambda kv: -kv[1][0])[:40]]


# SGLang 0.5.23's profiler spans around a speculative round's phases (spec_utils.spec_stage_span);
# verify runs between them, unannotated.
SPEC_SPANS = ("draft", "draft_extend")
GRAPH_LAUNCH = "cudaGraphLaunch"


def spec_round_phases(events: list[dict], kernels: list[dict]) -> dict | None:
    """Per speculative round: each phase's GPU time, graph replays and eager launches, and the idle rest.

    A round runs from one `draft` span to the next on the scheduler thread. A kernel belongs to the
    phase whose span holds its launch (the graph launch, under CUDA graphs); launches outside both
    spans are the verify: its graph launches are the target-verify forward, its other launches the
    accept bookkeeping (or the whole forward when the target runs eagerly).
    """
    spans = {name: sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                          if e.get("cat") == "user_annotation" and e.get("name") == name and "dur" in e)
             for name in SPEC_SPANS}
    if not spans["draft"]:
        return None
    starts = [s for s, _ in spans["draft"]]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}

    def phase_of(launch: dict) -> str:
        t = launch["ts"]
        for name in SPEC_SPANS:
            if any(s <= t <= e for s, e in spans[name]):
                return "draft steps" if name == "draft" else "draft-extend"
        return "target verify" if launch["name"] == GRAPH_LAUNCH else "verify/accept (eager ops)"

    def round_of(t: float) -> int:
        return bisect.bisect_right(starts, t) - 1

    rounds = len(starts) - 1  # whole rounds: between consecutive draft spans
    phases: dict[str, dict] = collections.defaultdict(
        lambda: {"gpu_us": 0.0, "kernels": 0, "graph_replays": 0, "eager_launches": 0})
    for e in launches.values():
        r = round_of(e["ts"])
        if 0 <= r < rounds:
            p = phases[phase_of(e)]
            if e["name"] == GRAPH_LAUNCH:
                p["graph_replays"] += 1
            elif "Launch" in e["name"]:
                p["eager_launches"] += 1
    for k in kernels:
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch is None or not 0 <= round_of(launch["ts"]) < rounds:
            continue
        p = phases[phase_of(launch)]
        p["gpu_us"] += k["dur"]
        p["kernels"] += 1
    wall = starts[-1] - starts[0]
    busy = sum(p["gpu_us"] for p in phases.values())
    host = {name: round(sum(e - s for s, e in spans[name] if starts[0] <= s < starts[-1]) / rounds, 1)
            for name in SPEC_SPANS}
    return {
        "rounds": rounds,
        "round_wall_us": round(wall / rounds, 1),
        "gpu_kernel_us_per_round": round(busy / rounds, 1),
        "gpu_idle_us_per_round": round((wall - busy) / rounds, 1),
        "host_span_us_per_round": host,
        "phases_per_round": {
            name: {"gpu_us": round(v["gpu_us"] / rounds, 1), "kernels": round(v["kernels"] / rounds, 1),
                   "graph_replays": round(v["graph_replays"] / rounds, 2),
                   "eager_launches": round(v["eager_launches"] / rounds, 1)}
            for name, v in sorted(phases.items(), key=lambda kv: -kv[1]["gpu_us"])
        },
    }


def split_steps(kernels: list[dict], steps: int) -> list[dict]:
    """Wall span and kernel families of each forward step, the kernels (sorted by start) cut at the
    steps - 1 widest GPU idle gaps: the scheduler's work between steps leaves the GPU idle, which a
    step's own kernels (all launched ahead of the GPU) rarely do. A prefill's chunks differ (a later
    chunk's indexer scans the earlier ones' keys), so its per-step average hides where it is slow."""
    ends, end = [], 0.0
    for e in kernels:
        end = max(end, e["ts"] + e["dur"])
        ends.append(end)
    gaps = sorted(range(1, len(kernels)), key=lambda i: kernels[i]["ts"] - ends[i - 1], reverse=True)
    cuts = [0, *sorted(gaps[: steps - 1]), len(kernels)]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        fams: dict[str, float] = collections.defaultdict(float)
        for e in kernels[a:b]:
            fams[family(e["name"])] += e["dur"]
        out.append({"wall_us": round(ends[b - 1] - kernels[a]["ts"], 1), "kernels": b - a,
                    "families_us": {k: round(v, 1) for k, v in sorted(fams.items(), key=lambda kv: -kv[1])}})
    return out


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
        "by_step": split_steps(kernels, steps) if 1 < steps <= len(kernels) else [],
        "families_us_per_step": {k: {"us": per_step(v["us"]), "launches": round(v["launches"] / steps, 1)}
                                 for k, v in sorted(fams.items(), key=lambda kv: -kv[1]["us"])},
        "top_kernels_us_per_step": [{"name": k, "us": per_step(v[0]), "launches": round(v[1] / steps, 1)}
                                    for k, v in sorted(names.items(), key=lambda kv: -kv[1][0])[:25]],
        **({"launched_from": attributed} if attributed else {}),
        **({"spec_round": rounds} if (rounds := spec_round_phases(events, kernels)) else {}),
        "host_frames_us_per_step": host_frames(events, steps),
        # inclusive host time of every SGLang and plugin frame: where an eager (prefill) step's host time goes
        "all_frames_us_per_step": host_frames(events, steps, r"sglang_glm/|sglang/") if len(kernels) else [],
    }


def stream_request(url: str, ids: list[int], new_tokens: int, first: threading.Event) -> None:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=3600) as r:
        for line in r.iter_lines():
            if line.startswith(b"data:") and b'"error"' in line:  # SGLang streams a refusal as an event
                print(f"  request refused: {line[:300]!r}", flush=True)
                return
            if line:
                first.set()


def warm_up(url: str, prompts: list[list[int]]) -> None:
    """The same prefills once, unprofiled (first-use kernel builds stay out of the trace), then the
    prefix cache emptied so that the profiled prefill computes every token again."""
    def one(ids):
        requests.post(f"{url}/generate", timeout=600, json={
            "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 4}}).raise_for_status()
    threads = [threading.Thread(target=one, args=(ids,)) for ids in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(30):
        if requests.post(f"{url}/flush_cache", timeout=60).status_code == 200:
            return
        time.sleep(1)
    raise SystemExit("the prefix cache did not flush")


def prompts_for(args, cfg: dict, batch: int) -> list[list[int]]:
    """B prompts: random token ids of --context tokens, or (--text) held-out text, where drafts of
    a trained model are accepted as in service."""
    if args.text:
        from transformers import AutoTokenizer

        text = HELDOUT.read_text()
        ids = AutoTokenizer.from_pretrained(str(args.model))(text)["input_ids"]
        step = max(1, (len(ids) - args.context) // max(batch, 1))
        return [ids[i * step: i * step + args.context] for i in range(batch)]
    rng = random.Random(0)
    return [[rng.randrange(2, cfg["vocab_size"]) for _ in range(args.context)] for _ in range(batch)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", default="indexcache")
    ap.add_argument("--batch", type=int, nargs="+", default=[32], help="one trace per batch size, one server")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--text", action="store_true", help="held-out text prompts instead of random token ids")
    ap.add_argument("--no-stack", action="store_true",
                    help="record without Python stacks: true host times, no per-frame attribution")
    ap.add_argument("--plugin", type=Path, default=None, help="serve a plugin installed in this directory")
    ap.add_argument("--peer-site", type=Path, default=None,
                    help="serve SGLang's own GLM-DSA path instead, its FlashMLA (and DeepGEMM) installed here "
                         "(bench_gpu.py's CONFIG@sglang)")
    ap.add_argument("--label", default=None, help="names the output files (default: the config)")
    ap.add_argument("--timeout-s", type=float, default=400, help="give up waiting for the prefills after this")
    ap.add_argument("--from-trace", type=Path, default=None, help="summarise this trace instead of serving")
    ap.add_argument("--eager", action="store_true", help="serve with --disable-cuda-graph")
    ap.add_argument("--prefill", action="store_true",
                    help="profile the batch's prefill instead: the profile starts on an idle server, then the B "
                         "requests arrive (--steps: the prefill's forward steps, one per --chunked-prefill-size chunk)")
    ap.add_argument("--server-args", default="",
                    help="appended to the config's server flags, one string: --server-args='--mem-fraction-static 0.08'")
    args = ap.parse_args()
    if args.peer_site and args.plugin:
        ap.error("--peer-site serves SGLang's own path, --plugin a plugin copy: one of them")
    args.model, args.out = args.model.resolve(), args.out.resolve()
    cfg = json.loads((args.model / "config.json").read_text())
    label = (args.label or args.config) + ("_eager" if args.eager else "") + ("_prefill" if args.prefill else "")
    # a timeout's SIGTERM unwinds the server's context (its process group stops) instead of orphaning it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{label}: terminated"))
    if args.from_trace:
        report(args, cfg, label, args.batch[0], args.from_trace)
    else:
        record_traces(args, cfg, label)


def report(args, cfg: dict, label: str, batch: int, trace: Path) -> None:
    """One trace's summary: OUT/profile_LABEL_bB_ctxL.json and a few lines on stdout."""
    summary = {"hardware": "from the trace's devices" if args.from_trace else hardware(), "config": args.config,
               "label": label, "cuda_graphs": not args.eager, "batch": batch, "context": args.context,
               "prompts": "held-out text" if args.text else "random token ids", "with_stack": not args.no_stack,
               "num_hidden_layers": cfg["num_hidden_layers"], "indexer_types": cfg.get("indexer_types"),
               "trace": trace.name, **summarize(trace, args.steps)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"profile_{label}_b{batch}_ctx{args.context}.json").write_text(json.dumps(summary, indent=1))
    print(f"[{label} batch {batch}] " + json.dumps({k: summary[k] for k in (
        "wall_us_per_step", "gpu_busy_us_per_step", "gpu_idle_us_per_step", "kernel_launches_per_step")}), flush=True)
    if summary["by_step"]:
        print(f"  wall us by step: {[s['wall_us'] for s in summary['by_step']]}", flush=True)
    for phase, v in summary.get("spec_round", {}).get("phases_per_round", {}).items():
        print(f"  {phase:28s} {v}", flush=True)
    if "spec_round" in summary:
        r = summary["spec_round"]
        print(f"  round {r['round_wall_us']} us, GPU kernels {r['gpu_kernel_us_per_round']} us, "
              f"idle {r['gpu_idle_us_per_round']} us, host spans {r['host_span_us_per_round']}", flush=True)


def record_traces(args, cfg: dict, label: str) -> None:
    """One server; per batch size B: B streamed requests, then `--steps` forward steps profiled once
    every request decodes (with --prefill: from the moment they arrive), summarised at once, then every
    request aborted before the next batch size."""
    _, extra, _ = server_setup(args.model, gpu=True)
    site = args.peer_site or args.plugin
    if site:  # its directory first, and servers started away from the working tree (bench_gpu.py)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site.resolve()), os.environ.get("PYTHONPATH", "")])
    flags = [*configs(cfg["num_hidden_layers"], args.model)[args.config], *extra, *(["--disable-cuda-graph"] if args.eager else [])]
    if args.peer_site:  # as bench_gpu.py serves the peer: its environment, flags and pool
        os.environ.update(peer.env(args.peer_site))
        flags = peer_flags(flags, args.peer_site)
    flags += shlex.split(args.server_args)
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(args.out)
    t0 = time.time()
    log = args.out / f"server_profile_{label}.log"
    with server(args.model, flags, log, max(args.batch)) as (url, err):
        if err:
            raise SystemExit(f"server did not start: {err}")
        if args.peer_site:
            check_peer_log(log, label)
        for batch in args.batch:
            trace_dir = args.out / f"trace_{label}_b{batch}"
            trace_dir.mkdir(parents=True, exist_ok=True)
            firsts = [threading.Event() for _ in range(batch)]
            # decodes past the profile, within the model's context less a speculative round's draft tokens
            new_tokens = min(4096, cfg.get("max_position_embeddings", 1 << 30) - args.context - 64)
            profile = {"num_steps": args.steps, "activities": ["CPU", "GPU"], "with_stack": not args.no_stack,
                       "output_dir": str(trace_dir)}
            prompts = prompts_for(args, cfg, batch)
            if args.prefill:  # the server is idle: the profiled steps start with the prefill of the arrivals
                warm_up(url, prompts)
                r = requests.post(f"{url}/start_profile", timeout=60, json=profile)
            for ids, ev in zip(prompts, firsts):
                threading.Thread(target=stream_request, args=(url, ids, new_tokens, ev), daemon=True).start()
            shown = 0.0
            while sum(e.is_set() for e in firsts) < batch:
                if time.time() - t0 > args.timeout_s:
                    raise SystemExit(f"only {sum(e.is_set() for e in firsts)}/{batch} prefills done in time")
                if time.time() - shown > 10:
                    print(f"  prefilled {sum(e.is_set() for e in firsts)}/{batch} (t={time.time() - t0:.0f}s)", flush=True)
                    shown = time.time()
                time.sleep(0.05)
            if not args.prefill:  # every request decodes: the profiled steps are decode steps of the batch
                time.sleep(0.5)
                r = requests.post(f"{url}/start_profile", timeout=60, json=profile)
            print(f"  batch {batch}: profiling {args.steps} forward steps: {r.status_code} {r.text[:200]}", flush=True)
            for _ in range(120):  # the trace is written when the steps are done
                written = sorted(trace_dir.glob("*.trace.json.gz"))
                if written and time.time() - written[-1].stat().st_mtime > 3:
                    break
                time.sleep(1)
            else:
                raise SystemExit("no trace written")
            requests.post(f"{url}/abort_request", json={"abort_all": True}, timeout=60)
            report(args, cfg, label, batch, written[-1])


if __name__ == "__main__":
    main()
