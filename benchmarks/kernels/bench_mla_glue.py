"""The absorbed-MLA glue around sparse attention, way by way (issue 30: the 32K prefill gap).

Per layer, `GlmDsaAttention` turns q_nope [T, H, 192] (a view into q_b_proj's output) into the
latent query with w_kc [H, 192, 512] and sets the rotated q_pe [T, H, 64] beside it: the
[T, H, 576] query sparse MLA reads (`absorbed_query`). After attention, out [T, H, 512] goes
through w_vc [H, 512, 256] into o_proj's input [T, H * 256] (`heads_output`).

Session 25's profile put the query's torch.cat at 20.9 ms per 16K chunk of the GLM-5.2-shaped
model (8 layers) against SGLang's concat kernel's 4.7 ms; `absorbed_query`, which bmm's straight
into the query rows instead, did not move the served 32K TTFT. This times each way on the same
inputs, so the next change is chosen by measurement:

  query   einsum_cat         einsum, then torch.cat (the plugin before ff1be97)
          absorbed_query     the plugin now: bmm into the query's latent columns, q_pe copied beside
          bmm_cat            bmm to a [H, T, 512] tensor, then torch.cat of its transpose
          bmm_sglang_concat  the same bmm, then SGLang's concat_mla_absorb_q (its in-tree DSA path)
  output  einsum_reshape     einsum, then reshape (the plugin before ff1be97)
          heads_output       the plugin now: bmm into o_proj's input, head-major

at 16384 / 4096 / 128 / 32 / 1 query rows and 64 heads (the GLM-5.2-shaped model's), each eager
(a prefill chunk) and replayed from a CUDA graph (decode). Every way's output is checked against
a float32 computation first. Median of `bench_kernels.bench` (L2 evicted before each call) over
--repeats runs, the ratio to the plugin's way of the same run; JSON to --out, a table to stdout:

    python3 benchmarks/kernels/bench_mla_glue.py --out benchmarks/kernels/logs/mla_glue.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from sglang_glm.models.attention import absorbed_query, heads_output

HEADS, NOPE, ROPE, LATENT, V = 64, 192, 64, 512, 256
ROWS = (16384, 4096, 128, 32, 1)


def sglang_concat():
    """SGLang's JIT concat kernel, or None where it does not load (no CUDA, no nvcc, no JIT cache)."""
    try:
        from sglang.kernels.ops.attention.concat_mla import concat_mla_absorb_q

        a = torch.zeros(2, 2, LATENT, dtype=torch.bfloat16, device="cuda")
        concat_mla_absorb_q(a, torch.zeros(2, 2, ROPE, dtype=torch.bfloat16, device="cuda"))
        return concat_mla_absorb_q
    except Exception as exc:  # reported in the run's output, never silently dropped
        print(f"bmm_sglang_concat skipped: {type(exc).__name__}: {exc}", flush=True)
        return None


def query_ways(concat=None) -> dict:
    ways = {
        "absorbed_query": absorbed_query,
        "einsum_cat": lambda q_nope, q_pe, w_kc: torch.cat([torch.einsum("thn,hnc->thc", q_nope, w_kc), q_pe], -1),
        "bmm_cat": lambda q_nope, q_pe, w_kc: torch.cat([torch.bmm(q_nope.transpose(0, 1), w_kc).transpose(0, 1), q_pe], -1),
    }
    if concat is not None:
        ways["bmm_sglang_concat"] = lambda q_nope, q_pe, w_kc: concat(torch.bmm(q_nope.transpose(0, 1), w_kc).transpose(0, 1), q_pe)
    return ways


def output_ways() -> dict:
    return {
        "heads_output": heads_output,
        "einsum_reshape": lambda out, w_vc: torch.einsum("thc,hcv->thv", out, w_vc).reshape(out.shape[0], -1),
    }


def inputs(rows: int, device, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """The tensors as the model hands them over: q_nope a strided view of q_b_proj's [T, H, 256]
    output, q_pe the rotary's contiguous output, out the attention's [T, H, 512]."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    q = rand(rows, HEADS, NOPE + ROPE)
    return {
        "q_nope": q[..., :NOPE],
        "q_pe": rand(rows, HEADS, ROPE),
        "w_kc": rand(HEADS, NOPE, LATENT, scale=NOPE**-0.5),
        "out": rand(rows, HEADS, LATENT),
        "w_vc": rand(HEADS, LATENT, V, scale=LATENT**-0.5),
    }


def reference(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    f = {k: v.float() for k, v in x.items()}
    query = torch.cat([torch.einsum("thn,hnc->thc", f["q_nope"], f["w_kc"]), f["q_pe"]], -1)
    return query, torch.einsum("thc,hcv->thv", f["out"], f["w_vc"]).reshape(f["out"].shape[0], -1)


def check(x: dict, query: dict, output: dict) -> dict:
    """Each way's largest error against float32, relative to the reference's largest magnitude."""
    want_q, want_o = reference(x)
    err = {}
    for name, fn in query.items():
        got = fn(x["q_nope"], x["q_pe"], x["w_kc"])
        assert got.shape == want_q.shape, (name, got.shape)
        err[f"query {name}"] = ((got.float() - want_q).abs().max() / want_q.abs().max()).item()
    for name, fn in output.items():
        got = fn(x["out"], x["w_vc"])
        assert got.shape == want_o.shape, (name, got.shape)
        err[f"output {name}"] = ((got.float() - want_o).abs().max() / want_o.abs().max()).item()
    return err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_kernels import bench

    query, output = query_ways(sglang_concat()), output_ways()
    hardware = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    print(hardware, flush=True)
    rows_out = []
    for rows in map(int, args.rows.split(",")):
        x = inputs(rows, "cuda")
        err = check(x, query, output)
        bad = {k: v for k, v in err.items() if v > 2e-2}
        if bad:
            raise SystemExit(f"{rows} rows: outputs off the float32 reference: {bad}")
        for graph in (False, True):
            calls = {f"query {n}": (lambda fn=fn: fn(x["q_nope"], x["q_pe"], x["w_kc"])) for n, fn in query.items()}
            calls |= {f"output {n}": (lambda fn=fn: fn(x["out"], x["w_vc"])) for n, fn in output.items()}
            times = {name: [] for name in calls}
            for r in range(args.repeats):
                for name, fn in calls.items():  # interleaved, so drift hits every way alike
                    times[name].append(bench(fn, graph=graph) * 1e6)
                print(f"  {rows} rows, {'graph' if graph else 'eager'}: repeat {r + 1}/{args.repeats}", flush=True)
            for name, ts in times.items():
                side, way = name.split(" ", 1)
                plugin = statistics.median(times[f"{side} {'absorbed_query' if side == 'query' else 'heads_output'}"])
                rows_out.append({"rows": rows, "mode": "graph" if graph else "eager", "side": side, "way": way,
                                 "median_us": round(statistics.median(ts), 2), "runs_us": [round(t, 2) for t in ts],
                                 "plugin_over_this": round(plugin / statistics.median(ts), 3),
                                 "rel_err": err[name]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"hardware": hardware, "heads": HEADS, "repeats": args.repeats, "rows": rows_out}, indent=1))
    print("| rows | mode | side | way | median us | plugin's time / this way's |")
    print("|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['rows']} | {r['mode']} | {r['side']} | {r['way']} | {r['median_us']} | {r['plugin_over_this']} |")


if __name__ == "__main__":
    main()
