"""Time sparse MLA or the top-k select from several copies of the glm_dsa_kernels package in one
GPU run (kernel variants that are not launch shapes: a different schedule, barrier or prefetch),
each checked first (sparse MLA against float64, the top-k exactly against its reference). Copies
are made with
  git archive REV kernels/glm_dsa_kernels | tar x -C DIR --strip-components=2
or by editing a copy; the run's log names what each copy changes. A copy may also be one package with
top-k keywords (`NAME=DIR@small_row=4096`, for a choice that is a launch argument, not another copy).

  python3 benchmarks/kernels/compare_versions.py --pkg a=DIR_A --pkg b=DIR_B \
      [--problems bf16:64:64,bf16:256:64,bf16:4096:64,topk:1:4096:202752] [--out results.json]

Problems: fmt:T:H is sparse MLA (fmt bf16 or fp8 KV, T queries, H heads, 2048 keys each);
topk:T:KEYS:WIDTH is topk_positions' top 2048 of T rows of KEYS keys inside logits WIDTH wide, as
under decode CUDA graphs (the logits as wide as the longest context, +inf past each row's keys);
topkp:T:KEYS is a causal prefill chunk, the last T queries of a KEYS-token prompt (row t sees
KEYS - T + t + 1 keys; T <= KEYS - 2048, so every row keeps 2048). Each top-k problem also times
`torch.topk` on the same logits, masked to -inf past each row's keys as SGLang's own path selects
(--dsa-topk-backend torch; unordered, ties unspecified), checked to keep the reference's positions.

Prints, per problem, each copy's median (bench_kernels.bench: CUDA graph, L2 evicted) and its
ratio to the first copy.
"""

import argparse
import json
from pathlib import Path

import torch

# Run as a script, this folder is on sys.path already.
from bench_kernels import bench, load_previous, measure_ceilings, mla_inputs, rel_err


def topk_inputs(fmt: str, *dims: int, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """Random fp32 logits and their rows' key limits for a topk / topkp problem (module docstring)."""
    if fmt == "topk":
        T, keys, width = dims
        logits = torch.randn(T, width, device=device)
        logits[:, keys:] = float("inf")  # never read: a row's keys end at its key_limit
        return logits, torch.full((T,), keys, device=device, dtype=torch.int32)
    T, keys = dims
    assert T <= keys - 2048, f"topkp:{T}:{keys}: a row with fewer than 2048 keys pads with -1, torch.topk cannot"
    key_limit = torch.arange(keys - T + 1, keys + 1, device=device, dtype=torch.int32)
    logits = torch.randn(T, keys, device=device)
    logits.masked_fill_(torch.arange(keys, device=device) >= key_limit[:, None], float("inf"))  # never read
    return logits, key_limit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pkg", action="append", required=True,
                    help="NAME=DIR[@KEY=INT,...] of a package copy, with topk_positions keywords (repeat)")
    ap.add_argument("--problems", default="bf16:64:64,bf16:256:64,bf16:4096:64",
                    help="fmt:T:H, topk:T:KEYS:WIDTH or topkp:T:KEYS, comma list")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    copies, topk_kw = [], {}
    for spec in args.pkg:
        name, rest = spec.split("=", 1)
        folder, _, kw = rest.partition("@")
        copies.append((name, *load_previous(Path(folder), "sparse_mla", "topk_select", name=name)))
        topk_kw[name] = {k: int(v) for k, v in (item.split("=") for item in filter(None, kw.split(",")))}
    bw, peak = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s, matmul {peak / 1e12:.0f} TFLOP/s", flush=True)
    kv_bf16 = torch.randn(1 << 20, 576, device="cuda", dtype=torch.bfloat16)
    kv_fp8 = copies[0][1].quantize_kv_fp8(kv_bf16)
    results = []
    for problem in args.problems.split(","):
        fmt, *dims = problem.split(":")
        line = []
        if fmt in ("topk", "topkp"):
            logits, key_limit = topk_inputs(fmt, *map(int, dims))
            ref = copies[0][2].topk_positions_ref(logits, key_limit, 2048)
            for name, _, mod in copies:
                if not torch.equal(mod.topk_positions(logits, key_limit, 2048, **topk_kw[name]), ref):
                    line.append(f"{name} WRONG (not the reference's top-k)")
                    continue
                t = bench(lambda: mod.topk_positions(logits, key_limit, 2048, **topk_kw[name]), rep=50)
                results.append(dict(problem=problem, copy=name, us=t * 1e6))
                base = next(r["us"] for r in results if r["problem"] == problem)
                line.append(f"{name} {t * 1e6:.1f}us ({base / (t * 1e6):.2f}x)")
            masked = logits.masked_fill(torch.arange(logits.shape[1], device="cuda") >= key_limit[:, None], float("-inf"))
            kept = torch.topk(masked, 2048, dim=1, sorted=False).indices.sort(dim=1).values
            if not torch.equal(kept.to(torch.int32), ref):
                line.append("torch.topk WRONG (not the reference's positions)")
            else:
                t = bench(lambda: torch.topk(masked, 2048, dim=1, sorted=False), rep=50)
                base = next((r["us"] for r in results if r["problem"] == problem), t * 1e6)
                results.append(dict(problem=problem, copy="torch.topk", us=t * 1e6))
                line.append(f"torch.topk {t * 1e6:.1f}us ({base / (t * 1e6):.2f}x)")
        else:
            T, H = map(int, dims)
            kv = kv_fp8 if fmt == "fp8" else kv_bf16
            q, idx = mla_inputs(kv_bf16, T, H, 2048, 7)
            sub = torch.arange(0, T, max(1, T // 8), device="cuda")
            ref, _ = copies[0][1].sparse_mla_fwd_ref(q[sub], kv, idx[sub], 576**-0.5)
            fl = copies[0][1].sparse_mla_flops(T, H, 2048)
            for name, mod, _ in copies:
                e = rel_err(mod.sparse_mla_fwd(q, kv, idx, 576**-0.5)[0][sub], ref)
                if not e < 2e-2:
                    line.append(f"{name} WRONG (rel err {e:.1e})")
                    continue
                t = bench(lambda: mod.sparse_mla_fwd(q, kv, idx, 576**-0.5), rep=50)
                results.append(dict(problem=problem, copy=name, us=t * 1e6, tflops=fl / t / 1e12, rel_err=e))
                base = next(r["us"] for r in results if r["problem"] == problem)
                line.append(f"{name} {t * 1e6:.1f}us {fl / t / 1e12:.0f} TFLOP/s ({base / (t * 1e6):.2f}x)")
        print(f"{problem}: " + "; ".join(line), flush=True)
    if args.out:
        args.out.write_text(json.dumps(dict(copy_tbps=bw / 1e12, matmul_tflops=peak / 1e12, results=results), indent=1))


if __name__ == "__main__":
    main()
