"""Tune SGLang's fused MoE kernel (`fused_experts_impl`, block-FP8 experts, 128 x 128 weight blocks) for
GLM-5.2's routed experts on this GPU, and write the winners where the plugin ships them
(`sglang_glm/moe_configs/`, SGLang's file format; `sglang_glm/hooks/moe.py` hands them to SGLang in
GLM-DSA servers).

SGLang 0.5.23 ships H200 files for other models' (E, N) only; the GLM-5.2-shaped model on one GPU
(E = 257: its 256 routed experts and the shared one, which SGLang fuses into the kernel; N = 2048) runs its
one default launch (64-row token tiles, 128-wide weight tiles, 3 stages)
at every batch, and SGLang turns on its SM90 swapped-operand path only for tiles under 64 rows
(`should_enable_swap_ab`). The experts are most of what an MTP round costs there (session 15's round
profile: `fused_moe_kernel` 1.79 of 9.14 ms at batch 1, 16.6 of 26.8 ms at batch 32, where the verify's
128 tokens read nearly all 256 experts), but the default launch already streams them at about 3.7 and
4.1 TB/s by that profile's byte counts (uniform routing), so this looks for the last 10-20%, most likely
at the batches between.

For each (E, N, K, top-k) the config gives at the tensor-parallel sizes asked, and each batch M:
every candidate launch is checked against SGLang's own launch on the same inputs (same quantization,
so only the summation order may differ), SGLang's own against a float32 reference, then each is timed
by CUDA-graph replay after an L2 eviction (tuning.fastest_launch); the fastest is kept if it beats
SGLang's choice. Routing is uniform over the experts (distinct per token), as the random-weight model's.

    python3 make_glm52_shaped.py /tmp/glm52      # (benchmarks/serving/gpu) for the config
    python3 benchmarks/kernels/tune_fused_moe.py --config /tmp/glm52/config.json --tp 1 \
        --m 1,4,8,16,32,64,128 --results OUT/fused_moe.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parents[1] / "sglang_glm" / "moe_configs"
BLOCK = 128  # the checkpoints' weight block (weight_block_size)


def fuses_shared_expert(cfg: dict, experts: int | None = None) -> bool:
    """Whether SGLang runs the shared expert inside this fused MoE on CUDA without expert parallelism: its
    rule for GLM-DSA, one shared expert beside 256 or 384 routed ones (sglang_glm's SharedExpertFusion)."""
    return cfg.get("n_shared_experts") == 1 and (experts or cfg["n_routed_experts"]) in (256, 384)


def expert_shapes(cfg: dict, tp: int, experts: int | None = None, fused: bool | None = None) -> tuple[int, int, int, int]:
    """(E, N, K, top-k) of the fused MoE per rank, as SGLang names its files: E experts (a fused shared
    expert is the last, in every token's top-k; `fused` None: as SGLang decides), N the intermediate width
    per rank (w2's last dim), K the hidden size. Tensor parallel splits N."""
    shared = int(fuses_shared_expert(cfg, experts) if fused is None else fused)
    return ((experts or cfg["n_routed_experts"]) + shared, cfg["moe_intermediate_size"] // tp, cfg["hidden_size"],
            cfg["num_experts_per_tok"] + shared)


def candidates(M: int) -> list[dict]:
    """Launch configs worth timing at batch M. Up to 64 tokens an expert holds a token or two, so the
    token tile is SGLang's smallest (16 or 32 rows: its SM90 kernel then swaps operands) and the weight
    tile and pipeline depth are what matter; above, wider token tiles and grouped scheduling."""
    out = []

    def add(bm, bn, warps, stages, group=1):
        out.append(dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=BLOCK, GROUP_SIZE_M=group,
                        num_warps=warps, num_stages=stages))

    if M <= 64:
        for bm in (16, 32) if M > 16 else (16,):
            for bn in (64, 128, 256):
                for stages in (3, 4, 5):
                    add(bm, bn, 4, stages)
        return out
    for bm in (32, 64, 128):
        for bn in (64, 128, 256):
            for warps, stages in ((4, 3), (4, 4), (8, 3)):
                add(bm, bn, warps, stages, 1 if M <= 256 else 16)
    return out


def quantized_experts(E: int, N: int, K: int, device: str = "cuda", seed: int = 0):
    """w1 [E, 2N, K] (gate rows, then up rows) and w2 [E, K, N] as e4m3 per 128 x 128 block, with their
    scales [E, rows / 128, cols / 128] (SGLang's layout), made an expert at a time."""
    import torch

    assert N % BLOCK == 0 and K % BLOCK == 0, f"N={N} K={K}: the checkpoints' experts have whole 128 blocks"
    gen = torch.Generator(device=device).manual_seed(seed)

    def quantize(rows, cols):
        w8 = torch.empty(E, rows, cols, device=device, dtype=torch.float8_e4m3fn)
        s = torch.empty(E, rows // BLOCK, cols // BLOCK, device=device)
        for e in range(E):
            w = torch.randn(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK, device=device, generator=gen) / cols ** 0.5
            s[e] = w.abs().amax((1, 3)).clamp(min=1e-8) / 448
            w8[e] = (w / s[e][:, None, :, None]).to(torch.float8_e4m3fn).view(rows, cols)
        return w8, s

    return (*quantize(2 * N, K), *quantize(K, N))


def dequantized(w8, s, e: int):
    """Expert e's weight in float32, as its blocks and scales give it."""
    return w8[e].float() * s[e].repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)


def routed_tokens(M: int, E: int, K: int, topk: int, shared: int = 0, device: str = "cuda", seed: int = 0):
    """Hidden states [M, K] (bf16), router weights [M, topk] and distinct expert ids per token; with a fused
    shared expert (shared = 1) every token's last id is expert E - 1, at weight 1."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed + M)
    x = torch.randn(M, K, device=device, generator=gen).to(torch.bfloat16)
    ids = torch.rand(M, E - shared, device=device, generator=gen).topk(topk - shared, dim=-1).indices.to(torch.int32)
    weights = torch.rand(M, topk - shared, device=device, generator=gen).softmax(-1)
    if shared:
        ids = torch.cat([ids, torch.full((M, 1), E - 1, device=device, dtype=torch.int32)], dim=1)
        weights = torch.cat([weights, torch.ones(M, 1, device=device)], dim=1)
    return x, weights, ids


def reference(x, weights, ids, w1, s1, w2, s2):
    """Float32 routed-expert output: sum over a token's experts of weight * down(silu(gate) * up)."""
    import torch

    out = torch.zeros(x.shape[0], w2.shape[1], device=x.device)
    N = w2.shape[2]
    for e in ids.unique().tolist():
        d1, d2 = dequantized(w1, s1, e), dequantized(w2, s2, e)
        for t, k in (ids == e).nonzero().tolist():
            h = d1 @ x[t].float()
            out[t] += weights[t, k] * (d2 @ (torch.nn.functional.silu(h[:N]) * h[N:]))
    return out


@contextlib.contextmanager
def launch_config(launch: dict | None):
    """SGLang's MoE config lookup answers `launch` at every batch (None: SGLang's own file or default).
    The down projection has no file of its own, so it runs the same launch, as SGLang does then."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as lookup

    own = lookup.get_moe_configs
    if launch is not None:  # SGLang takes the entry nearest the batch: the only one
        lookup.get_moe_configs = lambda *a, down_moe=False, **kw: None if down_moe else {1: launch}
    try:
        yield
    finally:
        lookup.get_moe_configs = own


def experts_with(launch: dict | None, x, weights, ids, w1, s1, w2, s2):
    """SGLang's fused MoE (block-FP8 experts, SiLU gate) with `launch` as its config."""
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts_impl

    with launch_config(launch):
        return fused_experts_impl(x, w1, w2, weights, ids, use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2,
                                  block_shape=[BLOCK, BLOCK])


def publish_runtime_context(device: str, model_path: str) -> None:
    """SGLang reads its runtime context inside the MoE path (deterministic mode, the tensor-parallel
    group its symmetric-memory switch names): publish its defaults, as a server does from its
    arguments, and no group (one process, one GPU)."""
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.server_args import ServerArgs

    get_context().set_server_args(ServerArgs(model_path=model_path, device=device))
    get_parallel().override_permanently(tp_group=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="the model's config.json")
    ap.add_argument("--tp", default="1", help="comma list of tensor-parallel sizes")
    ap.add_argument("--experts", type=int, default=None, help="routed experts a layer (default: the config's)")
    ap.add_argument("--unfused", action="store_true", help="the shared expert apart, as a server started with "
                    "--disable-shared-experts-fusion runs it (default: fused where SGLang fuses it)")
    ap.add_argument("--m", default="1,4,8,16,32,64,128", help="comma list of batch sizes (tokens); SGLang "
                    "takes the nearest")
    ap.add_argument("--anchors", default="256,1024,4096", help="batches written with SGLang's own launch where "
                    "the file has none (tuning.merge_into)")
    ap.add_argument("--out-configs", type=Path, default=SHIPPED, help="where the config files go (merged per M)")
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop starting batch sizes after this long")
    args = ap.parse_args()

    import torch
    import triton
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (
        get_config_file_name,
        try_get_optimal_moe_config,
    )

    from bench_kernels import bench
    from tuning import fastest_launch, merge_into

    publish_runtime_context("cuda", str(args.config.parent))
    cfg = json.loads(args.config.read_text())
    device = torch.cuda.get_device_name()
    results, t0 = [], time.time()
    for tp in map(int, args.tp.split(",")):
        E, N, K, topk = expert_shapes(cfg, tp, args.experts, False if args.unfused else None)
        shared = topk - cfg["num_experts_per_tok"]
        w1, s1, w2, s2 = quantized_experts(E, N, K)
        path = args.out_configs / get_config_file_name(E, N, "fp8_w8a8", [BLOCK, BLOCK])

        anchors = [int(m) for m in args.anchors.split(",") if m]

        def sglang_launch(M):  # the up launch SGLang resolves at batch M (its file's entry, else its default)
            return try_get_optimal_moe_config((E, 2 * N, K), (E, K, N), topk, "fp8_w8a8", M,
                                              block_shape=[BLOCK, BLOCK])

        for M in map(int, args.m.split(",")):
            if time.time() - t0 > args.deadline_s:
                print(f"E={E} N={N} M={M}: skipped, past the deadline", flush=True)
                continue
            x, weights, ids = routed_tokens(M, E, K, topk, shared)
            experts = w1, s1, w2, s2

            def run(launch):
                return experts_with(launch, x, weights, ids, *experts)

            own = run(None).float()
            ref = reference(x, weights, ids, *experts)
            own_err = ((own - ref).norm() / ref.norm()).item()
            assert own_err < 0.1, f"E={E} N={N} M={M}: SGLang's own launch is {own_err:.1e} from float32"
            base = bench(lambda: run(None), rep=30)
            # SGLang takes the entry nearest a batch, so a batch where its own launch wins is written too
            own_launch = sglang_launch(M)
            best = fastest_launch(run, candidates(M), (base, own_launch), own, 1e-2, f"E={E} N={N} M={M}")
            experts_read = len(set(ids.flatten().tolist()))
            nbytes = experts_read * 3 * N * K  # FP8 weights of the experts the batch reads dominate
            results.append(dict(E=E, N=N, K=K, topk=topk, tp=tp, M=M, experts_read=experts_read,
                                sglang_us=base * 1e6, sglang_config=own_launch, tuned_us=best[0] * 1e6, tuned_config=best[1],
                                speedup=base / best[0], tuned_tbps=nbytes / best[0] / 1e12, sglang_err=own_err))
            merge_into(path, {M: best[1]}, anchors, sglang_launch)  # at once: a run cut short keeps it
            print(f"E={E} N={N} K={K} M={M} ({experts_read} experts read): SGLang {base * 1e6:.1f} us, tuned "
                  f"{best[0] * 1e6:.1f} us ({base / best[0]:.2f}x, {nbytes / best[0] / 1e12:.2f} TB/s) "
                  f"[t={time.time() - t0:.0f}s]", flush=True)
            args.results.write_text(json.dumps(dict(device=device, triton=triton.__version__, results=results),
                                               indent=1))
        del w1, s1, w2, s2
    print(f"done in {time.time() - t0:.0f}s: {args.results}", flush=True)


if __name__ == "__main__":
    main()
