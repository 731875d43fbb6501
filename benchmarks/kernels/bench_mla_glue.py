"""The absorbed-MLA glue around sparse attention, way by way (issue 30: the 32K prefill gap).

Per layer, `GlmDsaAttention` rotates the key's rope columns k_pe [T, 1, 64] (a view into
the fused q_a + kv_a projection's output), turns q_nope [T, H, 192] (a view into q_b_proj's output) into the latent query
with w_kc [H, 192, 512] and sets q_pe [T, H, 64], rotated, beside it: the [T, H, 576] query sparse
MLA reads (`absorbed_query_and_key`, which returns the rotated key too). After attention, out
[T, H, 512] goes through w_vc [H, 512, 256] into o_proj's input [T, H * 256] (`heads_output`).

Session 25's profile put the query's torch.cat at 20.9 ms per 16K chunk of the GLM-5.2-shaped
model (8 layers) against SGLang's concat kernel's 4.7 ms, and its strided copies at 30.5 ms against
23.3; the bmm-into-the-rows change did not move the served 32K TTFT. This times each way on the same
inputs, so the next change is chosen by measurement:

  query   plugin        now: bmm into the rows' latent columns, `rotate` (one Triton launch for query
                        and key; two launches with stride-2 gathers before session 29) into their rope
                        columns and into a fresh key
          bmm_into      session 25 (ff1be97): SGLang's rotary on `.contiguous()` copies of q_pe and
                        k_pe, bmm into the rows' latent columns, q_pe copied beside
          einsum_cat    before ff1be97: the same rotary, einsum, then torch.cat
          sglang_style  SGLang's own DSA path: its rotary in place on the strided views, bmm, then its
                        concat_mla_absorb_q kernel (torch.cat where that kernel does not load)
  output  heads_output  now: bmm into o_proj's input, head-major
          einsum_reshape  before ff1be97: einsum, then reshape

at 16384 / 4096 / 128 / 32 / 1 query rows and 64 heads (the GLM-5.2-shaped model's), each eager
(a prefill chunk) and replayed from a CUDA graph (decode). Every way's output is checked first
against float32 (SGLang's `forward_native` rotary, einsum). Median of `bench_kernels.bench` (L2
evicted before each call) over --repeats runs, the ways interleaved, with the ratio to the plugin's
way of the same run; JSON to --out, a table to stdout:

    python3 benchmarks/kernels/bench_mla_glue.py --out benchmarks/kernels/logs/mla_glue.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from sglang_glm.models.attention import _rope, absorbed_query_and_key, heads_output

HEADS, NOPE, ROPE, LATENT, V, Q_LORA = 64, 192, 64, 512, 256, 2048
ROWS = (16384, 4096, 128, 32, 1)
GLM52 = SimpleNamespace(rope_parameters={"rope_theta": 8e6, "rope_type": "default"}, max_position_embeddings=202752)


def rotary(device):
    """SGLang's rotary module as the model builds it for GLM-5.2 (interleaved pairs, theta 8e6)."""
    return _rope(GLM52, ROPE, interleave=True).to(device)


def sglang_concat():
    """SGLang's JIT concat kernel, or None where it does not load (no CUDA, no nvcc, no JIT cache)."""
    try:
        from sglang.kernels.ops.attention.concat_mla import concat_mla_absorb_q

        a = torch.zeros(2, 2, LATENT, dtype=torch.bfloat16, device="cuda")
        concat_mla_absorb_q(a, torch.zeros(2, 2, ROPE, dtype=torch.bfloat16, device="cuda"))
        return concat_mla_absorb_q
    except Exception as exc:  # reported in the run's output, never silently dropped
        print(f"sglang_style falls back to torch.cat: {type(exc).__name__}: {exc}", flush=True)
        return None


def query_ways(concat=None) -> dict:
    """name -> fn(x, rotary) -> (query [T, H, 576], rotated key [T, 1, 64])."""
    def plugin(x, rot):
        return absorbed_query_and_key(x["q_nope"], x["q_pe"], x["k_pe"], x["w_kc"], rot, x["positions"])

    def bmm_into(x, rot):
        q_pe, k = rot(x["positions"], x["q_pe"].contiguous(), x["k_pe"].contiguous())
        q = x["q_nope"].new_empty(q_pe.shape[0], HEADS, LATENT + ROPE)
        torch.bmm(x["q_nope"].transpose(0, 1), x["w_kc"], out=q[..., :LATENT].transpose(0, 1))
        q[..., LATENT:] = q_pe.view(-1, HEADS, ROPE)
        return q, k

    def einsum_cat(x, rot):
        q_pe, k = rot(x["positions"], x["q_pe"].contiguous(), x["k_pe"].contiguous())
        return torch.cat([torch.einsum("thn,hnc->thc", x["q_nope"], x["w_kc"]), q_pe.view(-1, HEADS, ROPE)], -1), k

    def sglang_style(x, rot):
        q_pe, k = rot(x["positions"], x["q_pe"], x["k_pe"])  # in place on the views under CUDA
        latent = torch.bmm(x["q_nope"].transpose(0, 1), x["w_kc"]).transpose(0, 1)
        q_pe = q_pe.view(-1, HEADS, ROPE)
        return (concat(latent, q_pe) if concat is not None else torch.cat([latent, q_pe], -1)), k

    return {"plugin": plugin, "bmm_into": bmm_into, "einsum_cat": einsum_cat, "sglang_style": sglang_style}


def output_ways() -> dict:
    return {
        "heads_output": lambda x: heads_output(x["out"], x["w_vc"]),
        "einsum_reshape": lambda x: torch.einsum("thc,hcv->thv", x["out"], x["w_vc"]).reshape(x["out"].shape[0], -1),
    }


def inputs(rows: int, device, dtype=torch.bfloat16, seed: int = 0) -> dict:
    """The tensors as the model hands them over: q_nope and q_pe views into q_b_proj's [T, H, 256]
    output, k_pe a view into the fused q_a + kv_a projection's [T, 2048 + 576], the attention's output
    [T, H, 512]."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    q, qkv_a = rand(rows, HEADS, NOPE + ROPE), rand(rows, Q_LORA + LATENT + ROPE)
    return {
        "q_nope": q[..., :NOPE], "q_pe": q[..., NOPE:], "k_pe": qkv_a[:, None, Q_LORA + LATENT:],
        "positions": torch.randint(0, 32768, (rows,), generator=g).to(device),
        "w_kc": rand(HEADS, NOPE, LATENT, scale=NOPE**-0.5),
        "out": rand(rows, HEADS, LATENT),
        "w_vc": rand(HEADS, LATENT, V, scale=LATENT**-0.5),
    }


def reference(x: dict, rot) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key and output in float32: SGLang's forward_native rotary, einsum."""
    f = {k: (v.float() if v.is_floating_point() else v) for k, v in x.items()}
    q_pe, k = rot.forward_native(f["positions"], f["q_pe"].contiguous(), f["k_pe"].contiguous())
    query = torch.cat([torch.einsum("thn,hnc->thc", f["q_nope"], f["w_kc"]), q_pe.view(-1, HEADS, ROPE)], -1)
    return query, k.view(-1, 1, ROPE), torch.einsum("thc,hcv->thv", f["out"], f["w_vc"]).reshape(f["out"].shape[0], -1)


def check(make_inputs, rot, query: dict, output: dict) -> dict:
    """Each way's largest error against float32, relative to the reference's largest magnitude; every
    way gets fresh inputs (SGLang's CUDA rotary rotates its views in place)."""
    want_q, want_k, want_o = reference(make_inputs(), rot)

    def rel(got, want):
        assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
        return ((got.float() - want).abs().max() / want.abs().max()).item()

    err = {}
    for name, fn in query.items():
        got_q, got_k = fn(make_inputs(), rot)
        err[f"query {name}"] = max(rel(got_q, want_q), rel(got_k.view(-1, 1, ROPE), want_k))
    for name, fn in output.items():
        err[f"output {name}"] = rel(fn(make_inputs()), want_o)
    return err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_kernels import bench

    rot = rotary("cuda")
    query, output = query_ways(sglang_concat()), output_ways()
    hardware = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    print(hardware, flush=True)
    rows_out = []
    for rows in map(int, args.rows.split(",")):
        err = check(lambda: inputs(rows, "cuda"), rot, query, output)
        bad = {k: v for k, v in err.items() if v > 2e-2}
        if bad:
            raise SystemExit(f"{rows} rows: outputs off the float32 reference: {bad}")
        x = inputs(rows, "cuda")
        for graph in (False, True):
            calls = {f"query {n}": (lambda fn=fn: fn(x, rot)) for n, fn in query.items()}
            calls |= {f"output {n}": (lambda fn=fn: fn(x)) for n, fn in output.items()}
            times = {name: [] for name in calls}
            for r in range(args.repeats):
                for name, fn in calls.items():  # interleaved, so drift hits every way alike
                    times[name].append(bench(fn, graph=graph) * 1e6)
                print(f"  {rows} rows, {'graph' if graph else 'eager'}: repeat {r + 1}/{args.repeats}", flush=True)
            for name, ts in times.items():
                side, way = name.split(" ", 1)
                plugin = statistics.median(times[f"{side} {'plugin' if side == 'query' else 'heads_output'}"])
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
