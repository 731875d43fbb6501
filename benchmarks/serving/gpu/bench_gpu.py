"""GLM-5.2-shaped serving on one GPU: `sglang.launch_server` with the plugin, driven by SGLang's own
`bench_serving`.

A run is a list of `config:workload,workload,...` items; each config is one server (started, measured,
stopped), each workload one bench_serving call against it. Every finished workload appends a line to
OUT/results.jsonl at once, so a run cut short keeps what it measured; `report.py` turns the lines of
one or more runs into the table and plots.

    python benchmarks/serving/gpu/make_glm52_shaped.py /tmp/glm52
    python benchmarks/serving/gpu/bench_gpu.py --model /tmp/glm52 --out $OUT \
        --run indexcache:prefill_128k,decode_128k_b1 --run all_full:prefill_128k,decode_128k_b1

`--repeats N` runs every workload N times on its server, one after another; a row then holds the median of
the N runs of each number and the runs' TPOT and ITL beside it (`runs`).

Before/after in one run: `--plugin before=DIR` names a plugin installed elsewhere (`pip install --target
DIR` from another commit); `--run indexcache@before:decode_b1` serves that config with it (its
directory first on PYTHONPATH), `--run indexcache:decode_b1` with the installed one.

SGLang's own GLM-DSA path, the peer of issue 30: `--run indexcache@sglang:decode_b1` serves the config
without the plugin (SGLANG_PLUGINS allows only the GPU machine's stand-in plugin), through SGLang's
`GlmMoeDsaForCausalLM` and `dsa` backend: FlashMLA sparse attention from `--peer-site DIR` (`pip install
--target DIR sgl-flash-mla`), the indexer's logits on DeepGEMM where DIR also holds `sgl-deep-gemm`
0.2.1, else on SGLang's own torch fall-back; flags and environment from `sglang_glm_tools.peer`. A peer server whose log shows the plugin's model (its
IndexCache plan line) stops the run.

Configs (the model directory's own plan is IndexCache on, one full layer in four):
  indexcache      plan from config.json, BF16 KV cache, CUDA graphs (the default launch)
  all_full        every layer runs its indexer (--json-model-override-args indexer_types)
  eager           --disable-cuda-graph
  fp8_kv          --kv-cache-dtype fp8_e4m3
  mtp_share_on    EAGLE through the MTP layer, 3 draft steps; draft steps 1+ reuse step 0's top-k
  mtp_share_off   the same with index_share_for_mtp_iteration false: every draft step runs the indexer
  eagle_S_T       EAGLE with S draft steps, T = S + 1 tokens verified, the checkpoint's index share
                  (S in 1, 2, 3, 5); eagle_3_4_no_overlap: SGLang's overlap scheduler off
  prefill_graphs  prefill under SGLang's breakable CUDA graphs; eagle_3_4_prefill_graphs: with EAGLE 3/4
  eagle_3_4_fp8_head  EAGLE 3/4 drafting from a block-FP8 copy of the LM head (mtp_draft_head_fp8)
  eagle_3_4_token_map[_fp8_head]  the draft's head cut to the model directory's hot_vocab.pt (and in FP8)

A model directory without *.safetensors (make_glm52_shaped.py's) is served by SGLang's dummy loader
with its long-context pool; one with weights (a trained model) is served as is (outside the Triton
kernels' geometry: by the PyTorch backend, eager), and the text_* workloads send it held-out text
(benchmarks/train/data/heldout.txt), where MTP acceptance is real.

On a CPU machine (no CUDA) the server is the plugin's CPU launcher and every length is scaled down by
--scale: a smoke run of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sglang_glm_tools import peer
from sglang_glm_tools.serving_bench import on_cpu, run_bench_serving, server, write_dataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
HELDOUT = ROOT / "benchmarks" / "train" / "data" / "heldout.txt"  # the text workloads' prompts


def eagle(steps: int) -> list[str]:
    """An EAGLE chain through the MTP layer: `steps` draft steps, steps + 1 tokens verified."""
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(steps + 1)]


EAGLE = eagle(3)
PREFILL_GRAPHS = ["--cuda-graph-backend-prefill", "breakable"]  # the plugin serves them when asked
DRAFT_STEPS = (1, 2, 3, 5)  # the draft shapes issue 29 tables: 1/2, 2/3, 3/4, 5/6
GPU_SERVER_ARGS = [
    "--dtype", "bfloat16",
    "--cuda-graph-max-bs-decode", "64", "--chunked-prefill-size", "16384",
    "--sampling-backend", "pytorch", "--grammar-backend", "none", "--log-level", "info",
    "--decode-log-interval", "200",  # overrides serving_bench.server's per-step log line: no scheduler spam
]

# SGLang's own path captures breakable prefill graphs (its DSA default) up to 8192 tokens after the
# pool is allocated: 0.88 left it 16 GB and the capture ran out of memory (session 17); 0.75 left 34 GB,
# which its torch indexer (DeepGEMM's does not run on the device's torch) used up by 7168 tokens, 23 GB
# for the 8192-token graph alone (session 20). 0.5 still pools ~2M BF16 KV tokens, far beyond the runs;
# graphs up to 2048 tokens, as SGLang's OOM message advises (the runs' 16K prefill chunks take none anyway).
PEER_POOL_ARGS = ["--mem-fraction-static", "0.5", "--cuda-graph-max-bs-prefill", "2048"]
# An 80 GB card (H100): the GLM-5.2-shaped model's weights take 51 GB, so the pool needs >= 0.67 (at 0.5
# SGLang refused to start), and at 0.72 with graphs up to 2048 tokens the capture ran out of memory at the
# 416-token graph, ~1.1 MB a token per graph (session 29, torch indexer). 0.70 pools ~320K BF16 KV tokens
# (decode b64 at 4K needs 262K) and graphs up to 512 tokens take ~7 GB of the ~22 GB left. The runs'
# prefills (4K-128K, 16K chunks) and decode graphs take no prefill graph on either side, so the rows compare.
PEER_POOL_ARGS_80GB = ["--mem-fraction-static", "0.70", "--cuda-graph-max-bs-prefill", "512"]
# A directory without weights is served by SGLang's benchmarking loader; dummy router weights would send
# every token to the same experts, so SGLang's switch spreads them (never with trained weights).
DUMMY_ARGS = ["--load-format", "dummy"]
DUMMY_ENV = {"SGLANG_SIMULATE_UNIFORM_EXPERTS": "1"}
# A trained model outside the Triton kernels' geometry (the bundled glm-dsa-mini) is served by the
# PyTorch backend, which has no CUDA graphs.
TORCH_ARGS = ["--attention-backend", "glm_dsa_torch", "--disable-cuda-graph"]


PEER = "sglang"  # CONFIG@sglang: SGLang's own GLM-DSA path (sglang_glm_tools.peer)


def peer_flags(flags: list[str], site: str | Path) -> list[str]:
    """A config's flags as SGLang's own path serves them (its `dsa` backend and pool; later flags win)."""
    own = peer.flags(flags)
    print(f"  SGLang's own path: {' '.join(own)}, FlashMLA from {site}, indexer on {peer.indexer(site)}", flush=True)
    return flags + own + peer_pool_args(card_gb())


def peer_pool_args(total_gb: float) -> list[str]:
    """SGLang's own path's pool and prefill-graph flags on a card of total_gb."""
    return PEER_POOL_ARGS if total_gb > 100 else PEER_POOL_ARGS_80GB


def check_peer_log(log: Path, label: str) -> None:
    """Stops where the plugin's model served a server meant for SGLang's own path."""
    if peer.PLUGIN_MODEL_LOG_LINE in log.read_text(errors="replace"):
        raise SystemExit(f"[{label}] the plugin's model served SGLang's own path's server")


def override(**fields) -> list[str]:
    return ["--json-model-override-args", json.dumps(fields)]


def configs(n_layers: int, model: Path | None = None) -> dict[str, list[str]]:
    """Server flags by config name; a model directory holding a `hot_vocab.pt` token map
    (make_glm52_shaped.py) adds `eagle_3_4_token_map` and `eagle_3_4_token_map_fp8_head`."""
    hot_vocab = model / "hot_vocab.pt" if model is not None else None
    return {
        "indexcache": [],
        "all_full": override(indexer_types=["full"] * n_layers),
        "eager": ["--disable-cuda-graph"],
        "fp8_kv": ["--kv-cache-dtype", "fp8_e4m3"],
        "mtp_share_on": EAGLE + override(index_share_for_mtp_iteration=True),
        "mtp_share_off": EAGLE + override(index_share_for_mtp_iteration=False),
        # the checkpoint's own index share; eagle_3_4 is mtp_share_on for a checkpoint that shares
        **{f"eagle_{n}_{n + 1}": eagle(n) for n in DRAFT_STEPS},
        "eagle_3_4_no_overlap": EAGLE + ["--disable-overlap-schedule"],
        "prefill_graphs": PREFILL_GRAPHS,
        "eagle_3_4_prefill_graphs": EAGLE + PREFILL_GRAPHS,
        # the draft's logits from a block-FP8 copy of the LM head (the verify keeps BF16)
        "eagle_3_4_fp8_head": EAGLE + override(mtp_draft_head_fp8=True),
        # the draft's LM head cut to the map's rows (SGLang's --speculative-token-map)
        # ... and both: the FP8 copy is then of the map's rows
        **({"eagle_3_4_token_map": EAGLE + ["--speculative-token-map", str(hot_vocab)],
            "eagle_3_4_token_map_fp8_head": EAGLE + ["--speculative-token-map", str(hot_vocab)]
            + override(mtp_draft_head_fp8=True)}
           if hot_vocab is not None and hot_vocab.exists() else {}),
    }


@dataclasses.dataclass(frozen=True)
class Workload:
    input_len: int  # random dataset; the text workloads take whole held-out chunks
    output_len: int
    batch: int  # max concurrency
    prompts: int
    est_s: float  # rough H200 seconds, to skip what the deadline cannot fit
    dataset: str = "random"  # "text": held-out text, for trained models where acceptance is real


WORKLOADS = {
    "prefill_4k": Workload(4096, 1, 1, 4, 5),
    "prefill_32k": Workload(32768, 1, 1, 4, 10),
    "prefill_128k": Workload(131072, 1, 1, 3, 30),
    "decode_b1": Workload(4096, 256, 1, 2, 10),
    "decode_b8": Workload(4096, 256, 8, 8, 15),
    "decode_b32": Workload(4096, 256, 32, 32, 25),
    "decode_b64": Workload(4096, 256, 64, 64, 35),
    "decode_32k_b1": Workload(32768, 256, 1, 2, 15),  # issue 30's peer table: decode at 4K and 32K
    "decode_32k_b8": Workload(32768, 256, 8, 8, 30),
    "decode_32k_b32": Workload(32768, 128, 32, 32, 60),
    "decode_32k_b64": Workload(32768, 128, 64, 64, 90),
    "decode_128k_b1": Workload(131072, 128, 1, 2, 25),
    "decode_128k_b8": Workload(131072, 128, 8, 8, 70),
    "text_b1": Workload(0, 256, 1, 4, 15, "text"),
    "text_b8": Workload(0, 256, 8, 24, 15, "text"),
    "text_b32": Workload(0, 256, 32, 64, 20, "text"),
}

KEEP = ["completed", "duration", "request_throughput", "input_throughput", "output_throughput",
        "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
        "median_itl_ms", "median_e2e_latency_ms", "accept_length"]


def pool_args() -> list[str]:
    """Most of the GPU for a 128K-context pool: 0.88 on an H200, which leaves ~17 GB for activations,
    graph capture and the start-up warm-up; a smaller card keeps the same 17 GB (an H100 at 0.88 ran out
    of memory in the warm-up's 16K-token chunk, in the device's sgl_kernel stand-in summing the routed
    experts in float32; session 29)."""
    return ["--mem-fraction-static", f"{min(0.88, 1 - 17 / card_gb()):.2f}"]


def card_gb() -> float:
    """GPU 0's memory in GB."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 1e9


def server_setup(model: Path, gpu: bool) -> tuple[bool, list[str], dict]:
    """(dummy weights?, flags every config adds, the server environment) for `model`; puts that
    environment into os.environ, which the servers inherit."""
    from types import SimpleNamespace

    from sglang_glm.attention.backends import triton_geometry_problem

    dummy = not any(model.glob("*.safetensors"))
    flags = DUMMY_ARGS if dummy else []
    if gpu:
        flags = GPU_SERVER_ARGS + pool_args() + flags
        config = SimpleNamespace(**json.loads((model / "config.json").read_text()))
        if triton_geometry_problem(config):
            print(f"{model.name}: not the Triton kernels' geometry; served with {' '.join(TORCH_ARGS)}", flush=True)
            flags += TORCH_ARGS
    env = DUMMY_ENV if gpu and dummy else {}
    os.environ.update(env)
    if gpu:  # SGLang's EAGLE worker imports FlashMLA's module on CUDA; the wheel is not on the machine
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests/gpu/standins"), os.environ.get("PYTHONPATH", "")])
    return dummy, flags, env


def hardware() -> str:
    import sglang
    import torch

    dev = torch.cuda.get_device_name(0) if not on_cpu() else f"CPU ({os.cpu_count()} cores)"
    return f"{dev}, torch {torch.__version__}, SGLang {sglang.__version__}, Python {platform.python_version()}"


def dataset_args(model: Path, w: Workload, out: Path) -> list[str]:
    if w.dataset == "text":
        path = write_dataset(out / "heldout_sharegpt.json", HELDOUT)
        return ["--dataset-name", "sharegpt", "--dataset-path", str(path), "--sharegpt-output-len", str(w.output_len)]
    # make_glm52_shaped.py writes the random dataset's source text; other models take the held-out text
    source = model / "prompts_sharegpt.json"
    if not source.exists():
        source = write_dataset(out / "heldout_sharegpt.json", HELDOUT)
    return ["--dataset-name", "random", "--dataset-path", str(source),
            "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
            "--random-range-ratio", "1.0"]


def bench_serving(url: str, model: Path, w: Workload, out_file: Path, client=None) -> dict:
    """One `python -m sglang.bench_serving` run (in its own process, or a kept `BenchClient`);
    its result line."""
    argv = ["--backend", "sglang", "--base-url", url, "--model", str(model), "--tokenizer", str(model),
            *dataset_args(model, w, out_file.parent), "--num-prompts", str(w.prompts),
            "--max-concurrency", str(w.batch), "--seed", "0", "--warmup-requests", "1",
            "--flush-cache", "--disable-tqdm"]
    return run_bench_serving(argv, out_file, timeout=1800, client=client)


def median_of(runs: list[dict], key: str):
    """The median of one bench_serving number over repeated runs (None where no run reported it)."""
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def server_info(url: str) -> dict:
    import requests

    info = requests.get(f"{url}/get_server_info", timeout=30).json()
    state = (info.get("internal_states") or [{}])[0]
    return {"max_total_num_tokens": info.get("max_total_num_tokens"),
            "accept_length": state.get("avg_spec_accept_length")}


def scaled(w: Workload, scale: float) -> Workload:
    if scale == 1.0:
        return w
    return dataclasses.replace(w, input_len=max(16, int(w.input_len * scale)),
                               output_len=max(1, min(w.output_len, 8)), prompts=min(w.prompts, 4))


def parse_runs(items: list[str], known: dict, plugins: dict) -> list[tuple[str, str | None, list[str]]]:
    """`config[@plugin]:workload,...` items -> (config, plugin name or None, workloads)."""
    runs = []
    for item in items:
        head, _, wl = item.partition(":")
        name, _, plugin = head.partition("@")
        if name not in known:
            raise SystemExit(f"--run {item!r}: unknown config {name!r}; choose from {sorted(known)}")
        if plugin and plugin not in plugins:
            hint = "--peer-site DIR" if plugin == PEER else f"--plugin {plugin}=DIR"
            raise SystemExit(f"--run {item!r}: {plugin!r} not given; add {hint}")
        names = [w for w in wl.split(",") if w]
        bad = [w for w in names if w not in WORKLOADS]
        if bad or not names:
            raise SystemExit(f"--run {item!r}: unknown or no workloads {bad}; choose from {sorted(WORKLOADS)}")
        runs.append((name, plugin or None, names))
    return runs


def plugin_origin() -> dict[str, str]:
    """Where a server started now (this environment, this directory) imports the plugin from."""
    code = "import glm_dsa_kernels, sglang_glm, os; print(os.path.dirname(sglang_glm.__file__)); print(os.path.dirname(glm_dsa_kernels.__file__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return {"sglang_glm": out[0], "glm_dsa_kernels": out[1]}


def parse_plugins(items: list[str]) -> dict[str, str]:
    plugins = {}
    for item in items:
        name, _, path = item.partition("=")
        if not name or not Path(path, "sglang_glm").is_dir():
            raise SystemExit(f"--plugin {item!r}: want NAME=DIR with DIR/sglang_glm (pip install --target DIR)")
        plugins[name] = str(Path(path).resolve())
    return plugins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="made by make_glm52_shaped.py")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--run", action="append", required=True, help="config:workload,workload,...")
    ap.add_argument("--deadline-s", type=float, default=560, help="skip what would end past this")
    ap.add_argument("--scale", type=float, default=None, help="length scale (default 1 on GPU, 1/256 on CPU)")
    ap.add_argument("--plugin", action="append", default=[], help="NAME=DIR: a plugin installed in DIR")
    ap.add_argument("--repeats", type=int, default=1, help="bench_serving runs of every workload; rows hold medians")
    ap.add_argument("--peer-site", type=Path, default=None,
                    help=f"sgl-flash-mla installed here (pip install --target): enables @{PEER} runs")
    args = ap.parse_args()
    args.model, args.out = args.model.resolve(), args.out.resolve()
    t0 = time.time()
    n_layers = json.loads((args.model / "config.json").read_text())["num_hidden_layers"]
    plugins = parse_plugins(args.plugin)
    if args.peer_site:
        if not (args.peer_site / "flash_mla").is_dir():
            raise SystemExit(f"--peer-site {args.peer_site}: no flash_mla package there (pip install --target DIR sgl-flash-mla)")
        plugins[PEER] = str(args.peer_site.resolve())
    runs = parse_runs(args.run, configs(n_layers, args.model), plugins)
    gpu = not on_cpu()
    scale = args.scale if args.scale is not None else (1.0 if gpu else 1 / 256)
    dummy, extra, server_env = server_setup(args.model, gpu)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    meta = {"hardware": hardware(), "server_args": extra, "server_env": server_env, "weights": "dummy" if dummy else "trained",
            "scale": scale, "model": json.loads((args.model / "config.json").read_text()), "model_path": str(args.model)}
    print(f"{meta['hardware']}; {len(runs)} server(s), deadline {args.deadline_s:.0f}s", flush=True)

    base_path = os.environ.get("PYTHONPATH", "")
    # `python -m` puts the working directory first on sys.path: from the repository root the
    # working tree's sglang_glm would shadow a --plugin copy's (while its kernels came from the copy).
    os.chdir(args.out)
    base_env = dict(os.environ)
    for name, plugin, workloads in runs:
        os.environ.clear()
        os.environ.update({**base_env, **(peer.env(plugins[PEER]) if plugin == PEER else {})})
        os.environ["PYTHONPATH"] = os.pathsep.join([plugins[plugin], base_path]) if plugin else base_path
        label = f"{name}@{plugin}" if plugin else name
        origin = None if plugin == PEER else plugin_origin()  # SGLang's own path loads no plugin
        if plugin not in (None, PEER) and not all(Path(d).is_relative_to(plugins[plugin]) for d in origin.values()):
            raise SystemExit(f"[{label}] the server would import {origin}, not the plugin in {plugins[plugin]}")
        left = args.deadline_s - (time.time() - t0)
        if left < 120:
            print(f"[{label}] skipped: {left:.0f}s left", flush=True)
            continue
        print(f"[{label}] starting server (t={time.time() - t0:.0f}s)", flush=True)
        ts = time.time()
        flags = [*configs(n_layers, args.model)[name], *extra]
        if plugin == PEER:
            flags = peer_flags(flags, plugins[PEER])
        else:
            print(f"  plugin: {origin['sglang_glm']}, kernels: {origin['glm_dsa_kernels']}", flush=True)
        file_label = f"{name}_{plugin}" if plugin else name  # no '@' in file names: the device tool refuses them
        with server(args.model, flags, args.out / f"server_{file_label}.log", 64, timeout=min(480, left)) as (url, err):
            if err:
                print(f"  not started: {err}", flush=True)
                with results.open("a") as f:
                    f.write(json.dumps({"config": name, "plugin": plugin, "error": err, "meta": meta}) + "\n")
                continue
            startup_s = round(time.time() - ts, 1)
            if plugin == PEER:
                check_peer_log(args.out / f"server_{file_label}.log", label)
            for wname in workloads:
                w = scaled(WORKLOADS[wname], scale)
                left = args.deadline_s - (time.time() - t0)
                if left < WORKLOADS[wname].est_s * 1.5 * args.repeats:
                    print(f"  {wname}: skipped, {left:.0f}s left", flush=True)
                    continue
                print(f"  {wname} (t={time.time() - t0:.0f}s)", flush=True)
                runs = []
                for r in range(args.repeats):
                    suffix = f"_r{r}" if args.repeats > 1 else ""
                    try:
                        runs.append(bench_serving(url, args.model, w, args.out / f"{file_label}_{wname}{suffix}.json"))
                    except Exception as exc:  # keep going: the other workloads still count
                        print(f"  {wname} failed: {exc}", flush=True)
                        break
                if len(runs) < args.repeats:
                    continue
                row = {"config": name, "plugin": plugin, "workload": wname, **dataclasses.asdict(w),
                       **{k: median_of(runs, k) for k in KEEP}, **server_info(url), "startup_s": startup_s,
                       "runs": [{k: r.get(k) for k in ("median_tpot_ms", "median_itl_ms")} for r in runs],
                       "plugin_origin": origin, "meta": meta,
                       **({"peer_indexer": peer.indexer(plugins[PEER])} if plugin == PEER else {})}
                with results.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"    TTFT {row['median_ttft_ms']:.1f} ms, TPOT {row['median_tpot_ms'] or 0:.2f} ms, "
                      f"out {row['output_throughput']:.1f} tok/s, in {row['input_throughput']:.0f} tok/s",
                      flush=True)
    print(f"done in {time.time() - t0:.0f}s: {results}", flush=True)


if __name__ == "__main__":
    main()
