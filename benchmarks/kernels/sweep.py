"""Launch-shape sweep on the GPU: times candidate configs of glm_dsa_kernels' sparse MLA and
indexer + top-k per benchmark problem, next to SGLang's kernel and (when given) a previous
version of glm_dsa_kernels, all in one run. Candidates were screened offline first (triton
compiled for sm_90, ptxas -v: registers, spills, shared memory); results.md lists what was tried
and lost.

  pip install -e .   # glm_dsa_kernels, from kernels/glm_dsa_kernels/
  python3 benchmarks/kernels/sweep.py --out OUT/sweep.json [--prev DIR]

--prev DIR: an older copy of the kernels package folder, e.g.
  git archive REV kernels/glm_dsa_kernels | tar x -C DIR --strip-components=2
(loaded under the name glm_dsa_kernels_prev; the recorded runs compared against 306d059, when the
kernels sat directly in kernels/: `git archive 306d059 kernels | tar x -C DIR --strip-components=1`).

Prints one line per problem, fastest first, and writes every timing to --out.
"""

import argparse
import dataclasses
import json
import time
import traceback
from pathlib import Path

import torch

# Run as a script, this folder is on sys.path already.
from bench_kernels import bench, decode_indexer_inputs, load_previous, measure_ceilings, mla_inputs, rel_err, sglang_decode

RESULTS = []


def log(*a):
    print(*a, flush=True)


def timed(problem, name, fn, floor, rep=20):
    try:
        t = bench(fn, rep=rep)
    except Exception as exc:
        log(f"  {problem} {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}")
        return None
    RESULTS.append(dict(problem=problem, name=name, us=t * 1e6, roofline_pct=100 * floor / t))
    return t


def mla_sweep(kv_bf16, kv_fp8, ceil, prev, only_problems=None):
    from glm_dsa_kernels.sparse_mla import SparseMLAConfig as C
    from glm_dsa_kernels.sparse_mla import sparse_mla_bytes, sparse_mla_flops, sparse_mla_fwd, sparse_mla_fwd_ref

    scale = 576**-0.5
    cands = {  # (format, tokens, head class) -> [(block_h, block_n, num_warps, num_stages, prefetch[, warp_specialized])]
        ("bf16", 64, "small"): [(16, 64, 4, 3, False), (16, 64, 4, 4, False), (16, 32, 4, 4, False)],
        ("bf16", 256, "small"): [(16, 64, 4, 4, False), (16, 64, 4, 5, False), (16, 32, 4, 4, False)],
        ("bf16", 64, "all"): [(64, 64, 8, 4, False), (64, 64, 8, 2, False, True), (64, 32, 8, 4, False, True),
                              (64, 32, 8, 3, False, True)],
        ("fp8", 64, "small"): [(16, 64, 8, 1, True), (16, 32, 8, 1, True), (16, 64, 4, 4, False), (16, 64, 4, 3, False),
                               (16, 64, 4, 1, True), (16, 64, 8, 3, False)],
        ("fp8", 64, "all"): [(64, 64, 8, 2, False), (64, 32, 8, 3, False), (64, 64, 8, 3, False)],
    }
    cands[("fp8", 256, "small")] = cands[("fp8", 64, "small")]
    for fmt in ("bf16", "fp8"):
        for T in (1, 8, 32, 256, 4096):
            cands[(fmt, T, "all")] = cands[(fmt, 64, "all")]
    kv3 = kv_bf16.view(-1, 1, 576)
    for fmt, kv, row_bytes in (("bf16", kv_bf16, 1152), ("fp8", kv_fp8, 656)):
        problems = ((64, 16), (256, 16), (1, 64), (8, 64), (32, 64), (64, 64), (256, 64), (4096, 64))
        for T, H in problems:
            problem = f"mla {fmt} T={T} H={H}"
            if only_problems and f"{fmt}:{T}:{H}" not in only_problems:
                continue
            q, idx = mla_inputs(kv_bf16, T, H, 2048, 7)
            nb, fl = sparse_mla_bytes(T, H, 2048, row_bytes), sparse_mla_flops(T, H, 2048)
            floor = max(nb / ceil[0], fl / ceil[1])
            res = []
            if fmt == "bf16" and T <= 256:
                res.append(("sglang", timed(problem, "sglang", lambda: sglang_decode(q, kv3, idx, scale), floor)))
            if prev is not None:
                res.append(("prev default", timed(problem, "prev default", lambda: prev.sparse_mla_fwd(q, kv, idx, scale), floor)))
            res.append(("new default", timed(problem, "new default", lambda: sparse_mla_fwd(q, kv, idx, scale), floor)))
            sub = torch.arange(0, T, max(1, T // 8), device="cuda")
            ref, _ = sparse_mla_fwd_ref(q[sub], kv, idx[sub], scale)
            for bh, bn, nw, ns, pf, *ws in cands[(fmt, T, "small" if H <= 16 else "all")]:
                ws = bool(ws and ws[0])
                for sp in ((1,) if T > 1000 else (1, 2, 4, 8, 16, 32)):
                    programs = T * sp * (H // bh)
                    if (sp > 1 and programs > 4.5 * 132) or (sp == 1 and programs < 132 and T < 256):
                        continue
                    cfg = C(bh, bn, sp, nw, ns, pf, ws)
                    name = f"bh{bh} bn{bn} w{nw} s{ns}{' pf' if pf else ''}{' ws' if ws else ''} sp{sp}"
                    out = sparse_mla_fwd(q, kv, idx, scale, config=cfg)[0]
                    e = rel_err(out[sub], ref)
                    if not e < 2e-2:
                        log(f"  {problem} {name}: WRONG rel err {e:.2e}")
                        continue
                    res.append((name, timed(problem, name, lambda: sparse_mla_fwd(q, kv, idx, scale, config=cfg), floor)))
            res = sorted((t, n) for n, t in res if t)
            log(f"{problem} floor {floor * 1e6:.0f}us: " + "; ".join(f"{n} {t * 1e6:.1f}us {100 * floor / t:.0f}%" for t, n in res[:8]))
            if T == 64 and H == 16:
                log(f"  {problem} default per kernel: " + kernel_times(lambda: sparse_mla_fwd(q, kv, idx, scale)))
            base = [t for t, n in res if n == "sglang"]
            if base:
                log(f"    best vs sglang: {base[0] / res[0][0]:.2f}x")


def indexer_sweep(ceil, prev):
    from glm_dsa_kernels.indexer import IndexerConfig as IC
    from glm_dsa_kernels.indexer import indexer_bytes, indexer_flops, indexer_logits, indexer_topk
    from glm_dsa_kernels.topk_select import topk_positions, topk_positions_ref

    # the decode kernel strides a query's key blocks over programs_per_query programs (session 36's default:
    # ~512 programs in all, block_n 64, 5 stages from 8 queries); q_terms 2 / 1: the e4m3 dot on the keys'
    # codes (no conversion), q as two / one e4m3 terms
    logit_cands = [IC(block_n=bn, programs_per_query=ppq, num_stages=st, num_warps=4, q_terms=qt)
                   for bn, ppq, st, qt in ((64, 8, 5, 0), (64, 16, 5, 0), (64, 4, 5, 0), (64, 8, 3, 0), (128, 8, 5, 0),
                                           (64, 8, 5, 2), (64, 8, 5, 1))]
    topk_cands = [(16384, 4096, 2048, 4096), (16384, 4096, 1024, 4096), (16384, 4096, 4096, 4096),
                  (32768, 8192, 2048, 4096), (16384, 4096, 2048, 2048), (8192, 4096, 2048, 4096)]
    for B, keys in ((64, 65536), (32, 131072)):
        problem = f"indexer B={B} keys={keys}"
        q, w, k_cache, pt, qr, kl = decode_indexer_inputs(B, keys)
        nb, fl = indexer_bytes(B * keys, B, 2048), indexer_flops(B * keys)
        floor = max(nb / ceil[0], fl / ceil[1])
        lg = torch.empty(B, keys, device="cuda")
        parts, logit_times, topk_times = [], [], []
        want = (prev_idx.indexer_topk(q, w, k_cache, pt, qr, kl, 2048) if prev is not None
                else indexer_topk(q, w, k_cache, pt, qr, kl, 2048))  # every variant must give these positions
        if prev is not None:
            parts.append((timed(problem, "prev indexer_topk", lambda: prev_idx.indexer_topk(q, w, k_cache, pt, qr, kl, 2048), floor), "prev indexer_topk"))
            parts.append((timed(problem, "prev logits", lambda: prev_idx.indexer_logits(q, w, k_cache, pt, qr, kl, lg), floor), "prev logits"))
            parts.append((timed(problem, "prev topk alone", lambda: prev_idx.topk_positions(lg, kl, 2048), floor), "prev topk alone"))
        lg0 = torch.empty_like(lg)
        indexer_logits(q, w, k_cache, pt, qr, kl, lg0)
        for c in logit_cands:
            indexer_logits(q, w, k_cache, pt, qr, kl, lg.fill_(float("nan")), config=c)
            if not rel_err(lg, lg0) < LOGITS_TOL[c.q_terms]:
                log(f"  {problem} {c}: WRONG logits, rel err {rel_err(lg, lg0):.2e}")
                continue
            name = f"logits bn{c.block_n} ppq{c.programs_per_query} s{c.num_stages} w{c.num_warps} qt{c.q_terms}"
            t = timed(problem, name, lambda: indexer_logits(q, w, k_cache, pt, qr, kl, lg, config=c), floor)
            parts.append((t, name))
            if t:
                logit_times.append((t, c))
        want_lg = topk_positions_ref(lg0, kl, 2048)
        for chunk, block, sel, sample in topk_cands:
            name = f"topk alone chunk{chunk} block{block} select{sel} sample{sample}"
            kw = dict(chunk=chunk, block=block, select_block=sel, sample=sample)
            if not torch.equal(topk_positions(lg0, kl, 2048, **kw), want_lg):
                log(f"  {problem} {name}: WRONG top-k")
                continue
            t = timed(problem, name, lambda: topk_positions(lg0, kl, 2048, **kw), floor)
            parts.append((t, name))
            if t:
                topk_times.append((t, kw))
        parts = sorted(p for p in parts if p[0])
        log(f"{problem} floor {floor * 1e6:.0f}us, parts: " + "; ".join(f"{n} {t * 1e6:.1f}us" for t, n in parts))
        full = []
        for _, c in sorted((x for x in logit_times if x[1].q_terms != 1), key=lambda x: x[0])[:2]:  # 1 term: other top-k
            for _, kw in sorted(topk_times, key=lambda x: x[0])[:2]:
                cfg = dataclasses.replace(c, topk_chunk=kw["chunk"], topk_block=kw["block"],
                                          topk_select_block=kw["select_block"], topk_sample=kw["sample"])
                got = indexer_topk(q, w, k_cache, pt, qr, kl, 2048, config=cfg)
                if not torch.equal(got, want):
                    log(f"  {problem} {cfg}: top-k differs from the reference version in {(got != want).any(1).sum().item()} rows")
                name = f"pipeline {cfg}"
                full.append((timed(problem, name, lambda: indexer_topk(q, w, k_cache, pt, qr, kl, 2048, config=cfg), floor), name))
        full = sorted(f for f in full if f[0])
        log(f"{problem} floor {floor * 1e6:.0f}us: " + "; ".join(f"{n} {t * 1e6:.1f}us {100 * floor / t:.0f}%" for t, n in full))
        log(f"  {problem} default indexer_topk per kernel: " + kernel_times(lambda: indexer_topk(q, w, k_cache, pt, qr, kl, 2048)))
        del k_cache, pt, lg, lg0


def _time_logit_configs(problem, configs, inputs, width, floor, with_topk=False):
    """Time indexer_logits (and indexer_topk) per config on inputs (q, w, k_cache, page_table,
    query_req, key_limit); each config's logits are first checked against the per-query kernel's
    where a query sees keys (the rest of a row is left as is). Returns [(seconds, name)]."""
    from glm_dsa_kernels.indexer import IndexerConfig, indexer_logits, indexer_topk

    q, w, k_cache, pt, qr, kl = inputs
    T = q.shape[0]
    seen = torch.arange(width, device="cuda")[None, :] < kl[:, None]
    want = indexer_logits(*inputs, torch.zeros(T, width, device="cuda"), IndexerConfig())[seen]
    lg = torch.empty(T, width, device="cuda")
    times = []
    for c in configs:
        got = indexer_logits(*inputs, lg.fill_(float("nan")), config=c)[seen]
        if not rel_err(got, want) < LOGITS_TOL[c.q_terms]:
            log(f"  {problem} {c}: WRONG logits, rel err {rel_err(got, want):.2e}")
            continue
        spread = f"ppq{c.programs_per_query}" if c.block_q == 1 else f"kpp{c.keys_per_program}"
        shape = f"bq{c.block_q} bn{c.block_n} {spread} s{c.num_stages} w{c.num_warps} qt{c.q_terms}"
        runs = [("logits", lambda: indexer_logits(*inputs, lg, config=c))]
        if with_topk:
            runs.append(("indexer_topk", lambda: indexer_topk(*inputs, 2048, config=c)))
        for what, fn in runs:
            t = timed(problem, f"{what} {shape}", fn, floor)
            if t:
                times.append((t, f"{what} {shape}"))
    return sorted(times)


def prefill_indexer_sweep(ceil):
    """The indexer's logits in prefill: 2048 queries at the end of a 32K / 128K context, causal,
    FP8 keys; the per-query decode kernel against query-block candidates."""
    from glm_dsa_kernels.indexer import IndexerConfig as IC
    from glm_dsa_kernels.indexer import default_config, indexer_flops

    from bench_kernels import prefill_indexer_inputs

    cands = [IC(block_q=bq, block_n=bn, num_stages=st, num_warps=wa, q_terms=qt)  # no spills on sm_90a (ptxas -v)
             for bq, bn, st, wa, qt in ((4, 64, 5, 4, 0), (4, 64, 3, 4, 0), (2, 64, 5, 4, 0), (8, 64, 5, 8, 0),
                                        (4, 128, 5, 8, 0), (4, 64, 3, 4, 2), (4, 128, 3, 8, 2), (8, 64, 3, 8, 2),
                                        (4, 64, 3, 4, 1), (8, 128, 3, 8, 1))]
    C = 2048
    for ctx in (32768, 131072):
        problem = f"prefill indexer {C} queries x {ctx // 1024}K keys"
        inputs = prefill_indexer_inputs(C, ctx)
        fl = indexer_flops(int(inputs[-1].sum()))
        times = _time_logit_configs(problem, [IC(), default_config(C, queries_per_request=C)] + cands, inputs, ctx,
                                    fl / ceil[1])
        log(f"{problem}: " + "; ".join(f"{n} {t * 1e6:.0f}us {fl / t / 1e12:.0f} TFLOP/s" for t, n in times))
        del inputs


def verify_indexer_sweep(ceil):
    """The indexer in MTP verify: every request scores its 4 draft tokens' queries (key limits n-3..n)
    over its whole context, FP8 keys. The per-query kernel reads each key 4 times, a 4-query block
    once."""
    from glm_dsa_kernels.indexer import IndexerConfig as IC
    from glm_dsa_kernels.indexer import indexer_bytes, indexer_flops

    per = 4
    cands = [IC(), IC(programs_per_query=8), IC(q_terms=2)] + [
        IC(block_q=bq, block_n=64, keys_per_program=kpp, num_stages=st, q_terms=qt)
        for bq, kpp, st, qt in ((4, 4096, 3, 0), (4, 2048, 3, 0), (4, 4096, 5, 0), (2, 4096, 3, 0), (4, 4096, 3, 2))]
    for B, keys in ((64, 65536), (32, 131072)):
        problem = f"verify indexer {B} requests x {per} queries x {keys // 1024}K keys"
        q, w, k_cache, pt, qr, kl = decode_indexer_inputs(B, keys, per)
        nb = indexer_bytes(B * keys, q.shape[0], 2048)  # keys read once per request: the floor a block can reach
        floor = max(nb / ceil[0], indexer_flops(int(kl.sum())) / ceil[1])
        times = _time_logit_configs(problem, cands, (q, w, k_cache, pt, qr, kl), keys, floor, with_topk=True)
        log(f"{problem} (floor {floor * 1e6:.0f}us): " + "; ".join(f"{n} {t * 1e6:.1f}us" for t, n in times))
        del k_cache, pt


def kernel_times(fn, iters=20):
    """Mean device time per call of each kernel fn launches (torch.profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / iters, e.key) for e in prof.key_averages() if e.device_time_total > 0]
    return "; ".join(f"{k[:40]} {t:.1f}us" for t, k in sorted(rows, reverse=True))


prev_idx = None
LOGITS_TOL = {0: 1e-5, 2: 1e-3, 1: 6e-2}  # vs the fp16-dot logits, by IndexerConfig.q_terms (e4m3 terms of q)


def main():
    global prev_idx
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prev", type=Path, help="folder holding an older copy of glm_dsa_kernels")
    ap.add_argument("--only", default="mla,indexer", help="comma list of: mla,indexer,prefill-indexer,verify-indexer")
    ap.add_argument("--mla-problems", default="", help="comma list of fmt:T:H, e.g. bf16:256:64 (default: all)")
    args = ap.parse_args()
    prev = None
    if args.prev:
        prev, prev_idx = load_previous(args.prev, "sparse_mla", "indexer")
    bw, peak = measure_ceilings()
    log(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s, matmul {peak / 1e12:.0f} TFLOP/s")
    t0 = time.time()
    from glm_dsa_kernels.sparse_mla import quantize_kv_fp8

    kv_bf16 = torch.randn(1 << 20, 576, device="cuda", dtype=torch.bfloat16)
    kv_fp8 = quantize_kv_fp8(kv_bf16)
    for name, fn in (("mla", lambda: mla_sweep(kv_bf16, kv_fp8, (bw, peak), prev, set(filter(None, args.mla_problems.split(","))))),
                     ("indexer", lambda: indexer_sweep((bw, peak), prev)), ("prefill-indexer", lambda: prefill_indexer_sweep((bw, peak))),
                     ("verify-indexer", lambda: verify_indexer_sweep((bw, peak)))):
        if name not in args.only.split(","):
            continue
        try:
            fn()
        except Exception:
            traceback.print_exc()
        log(f"(after {name}: {time.time() - t0:.0f}s)")
        args.out.write_text(json.dumps(dict(copy_tbps=bw / 1e12, matmul_tflops=peak / 1e12, results=RESULTS), indent=1))


if __name__ == "__main__":
    main()
