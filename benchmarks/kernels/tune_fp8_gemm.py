"""Tune SGLang's block-FP8 GEMM (`w8a8_block_fp8_matmul_triton`, 128 x 128 weight blocks) for GLM-5.2's
linear shapes on this GPU, and write the winners where the plugin ships them (`sglang_glm/gemm_configs/`,
SGLang's file format; `sglang_glm/hooks/gemm.py` hands them to SGLang in GLM-DSA servers).

SGLang 0.5.23 ships H200 configs for other models' shapes only, so GLM-5.2's projections run its one
default launch (64 x 128 tiles, no split): at batch 1 a program walks all of K alone and few programs
run, about a fifth of the H200's bandwidth (the GLM-5.2-shaped decode profile: 2.48 of 4.69 ms a step).
Its Hopper kernel also takes SWAP_AB (the weight tile on the MMA's M side, for small batches) and
SPLIT_K (K cut across programs, partial sums reduced after), which no shipped config uses.

For each (N, K) a model's FP8 linears have at the given tensor-parallel sizes, and each batch size M:
every candidate launch is checked against a float32 reference, then timed by CUDA-graph replay after an
L2 eviction (bench_kernels.bench); the fastest is kept if it beats SGLang's own choice. The results file
holds both times per (N, K, M).

    python3 make_glm52_shaped.py /tmp/glm52      # (benchmarks/serving/gpu) for the config
    python3 benchmarks/kernels/tune_fp8_gemm.py --config /tmp/glm52/config.json --tp 1 \
        --m 1,16,64 --results OUT/fp8_gemm_decode.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIPPED = HERE.parents[1] / "sglang_glm" / "gemm_configs"
BLOCK = 128  # the checkpoints' weight block (weight_block_size)
# SGLang 0.5.23's launch for a shape without a config file (w8a8_block_fp8_matmul_triton's inline default)
SGLANG_DEFAULT = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=BLOCK, BLOCK_SIZE_K=BLOCK, GROUP_SIZE_M=32, num_warps=4, num_stages=3)


def sglang_launch(own: dict | None, M: int) -> dict:
    """The launch SGLang runs at batch M: its file's entry nearest M, else its default."""
    return own[min(own, key=lambda m: abs(m - M))] if own else SGLANG_DEFAULT


def linear_shapes(cfg: dict, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) per rank of every block-FP8 linear the plugin's GLM-DSA model builds (kv_b_proj is absorbed
    into attention at load; the indexer's weights_proj, the router and the LM head stay BF16)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    inter, moe = cfg["intermediate_size"], cfg["moe_intermediate_size"] * cfg.get("n_shared_experts", 1)
    return {
        "fused_qkv_a_proj_with_mqa": (cfg["q_lora_rank"] + cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h),
        "q_b_proj": (heads * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) // tp, cfg["q_lora_rank"]),
        "o_proj": (h, heads * cfg["v_head_dim"] // tp),
        "indexer.wq_b": (cfg["index_n_heads"] * cfg["index_head_dim"], cfg["q_lora_rank"]),
        "indexer.wk": (cfg["index_head_dim"], h),
        "dense gate_up": (2 * inter // tp, h),
        "dense down": (h, inter // tp),
        "shared expert gate_up": (2 * moe // tp, h),
        "shared expert down": (h, moe // tp),
    }


def draft_head_shape(cfg: dict, tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) per rank of the MTP draft's block-FP8 LM head (`mtp_draft_head_fp8`): the vocabulary padded as
    SGLang's ParallelLMHead pads it (to 64 rows, or 64 x tp where 64 does not split evenly), split over the
    ranks, by the hidden size."""
    pad = 64 if -(-cfg["vocab_size"] // 64) * 64 % tp == 0 else 64 * tp
    return {"draft head": (-(-cfg["vocab_size"] // pad) * pad // tp, cfg["hidden_size"])}


def candidates(M: int, N: int, K: int, sms: int = 132) -> list[dict]:
    """Launch configs worth timing at batch M: up to 64 tokens the weight tile on the MMA's M side
    (SWAP_AB, the token tile on its N side) with K split so the programs fill the GPU, beside plain
    64-row tiles; above, plain tiles, K split up to 512 tokens."""
    k_tiles = K // BLOCK
    out = []

    def add(bm, bn, warps, stages, split, swap=False):
        cfg = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=BLOCK, GROUP_SIZE_M=1 if M <= 256 else 16,
                   num_warps=warps, num_stages=stages)
        out.append({**cfg, "SWAP_AB": True, "SPLIT_K": split} if swap else ({**cfg, "SPLIT_K": split} if split > 1 else cfg))

    def splits(programs):
        """K splits that leave K to split and bring the programs near one to four waves."""
        return [s for s in (1, 2, 4, 8, 16) if s <= k_tiles and (s == 1 or programs * s // 2 < 2 * sms)]

    if M <= 64:
        for bm in sorted({max(16, 1 << (M - 1).bit_length()), 64}):
            for bn in (64, 128):
                for split in splits(-(-N // bn) * -(-M // bm)):
                    add(bm, bn, 4, 4, split, swap=True)  # one stage count: each launch shape is a Triton build
        for bn in (64, 128):
            for split in splits(-(-N // bn))[:3]:
                add(64, bn, 4, 4, split)
        return out
    for bm in (64, 128):
        for bn in (64, 128, 256):
            for warps, stages in ((4, 3), (4, 4), (8, 3)):
                for split in (s for s in ((1, 2, 4) if M <= 512 else (1,)) if s <= k_tiles):
                    add(bm, bn, warps, stages, split)
    return out


def quantized_inputs(M: int, N: int, K: int, device: str = "cuda"):
    """(activation e4m3 per 1 x 128 group and its scales, weight e4m3 per 128 x 128 block and its
    scales, the float32 product of the two as quantized)."""
    import torch

    assert K % BLOCK == 0, f"K={K}: the checkpoints' linears have whole 128-wide blocks along K"
    a = torch.randn(M, K // BLOCK, BLOCK, device=device)
    a_s = a.abs().amax(-1).clamp(min=1e-6) / 448
    a8 = (a / a_s[..., None]).to(torch.float8_e4m3fn).view(M, K)
    rows = -(-N // BLOCK) * BLOCK
    w = torch.nn.functional.pad(torch.randn(N, K, device=device), (0, 0, 0, rows - N)).view(-1, BLOCK, K // BLOCK, BLOCK)
    w_s = w.abs().amax((1, 3)).clamp(min=1e-6) / 448
    w8 = (w / w_s[:, None, :, None]).to(torch.float8_e4m3fn).view(rows, K)[:N]
    a_deq = a8.float() * a_s.repeat_interleave(BLOCK, 1)
    w_deq = w8.float() * w_s.repeat_interleave(BLOCK, 0)[:N].repeat_interleave(BLOCK, 1)
    return a8, a_s.contiguous(), w8.contiguous(), w_s.contiguous(), a_deq @ w_deq.T


def matmul_with(launch: dict | None, M: int, a8, a_s, w8, w_s):
    """SGLang's block-FP8 GEMM launcher, its config lookup answering `launch` (None: its default launch)."""
    import torch
    from sglang.kernels.ops.gemm import fp8_kernel

    lookup = fp8_kernel.get_w8a8_block_fp8_configs
    fp8_kernel.get_w8a8_block_fp8_configs = lambda *_: {M: launch} if launch else None
    try:
        return fp8_kernel.w8a8_block_fp8_matmul_triton(a8, w8, a_s, w_s, [BLOCK, BLOCK], torch.bfloat16)
    finally:
        fp8_kernel.get_w8a8_block_fp8_configs = lookup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="the model's config.json")
    ap.add_argument("--tp", default="1", help="comma list of tensor-parallel sizes")
    ap.add_argument("--m", default="1,16,64", help="comma list of batch sizes (tokens); SGLang takes the nearest")
    ap.add_argument("--anchors", default="256", help="batches written with SGLang's own launch where the file "
                    "has none (tuning.merge_into)")
    ap.add_argument("--only", default="", help="comma list of linear names (default: all)")
    ap.add_argument("--draft-head", action="store_true", help="also the MTP draft's FP8 LM head (mtp_draft_head_fp8)")
    ap.add_argument("--out-configs", type=Path, default=SHIPPED, help="where the config files go (merged per M)")
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop starting shapes after this long")
    args = ap.parse_args()

    import torch
    from sglang.kernels.ops.gemm import fp8_kernel

    from bench_kernels import bench
    from tuning import fastest_launch, merge_into

    from sglang_glm.hooks.gemm import config_file_name  # the name SGLang and the plugin's hook look up

    cfg = json.loads(args.config.read_text())
    device = torch.cuda.get_device_name().replace(" ", "_")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {}
    for tp in map(int, args.tp.split(",")):
        for name, nk in {**linear_shapes(cfg, tp), **(draft_head_shape(cfg, tp) if args.draft_head else {})}.items():
            if not args.only or name in args.only.split(","):
                shapes.setdefault(nk, []).append(f"{name} (tp {tp})")
    sglang_lookup = fp8_kernel.get_w8a8_block_fp8_configs
    results, t0 = [], time.time()
    for (N, K), names in shapes.items():
        if time.time() - t0 > args.deadline_s:
            print(f"N={N} K={K}: skipped, past the deadline", flush=True)
            continue
        own = sglang_lookup(N, K, BLOCK, BLOCK)
        best_per_m = {}
        for M in map(int, args.m.split(",")):
            inputs = quantized_inputs(M, N, K)
            ref = inputs[-1]
            nbytes = N * K + M * K + M * N * 2  # weights dominate at small M

            def run(launch):
                return matmul_with(launch, M, *inputs[:4])

            base_cfg = sglang_launch(own, M)
            base = bench(lambda: run(base_cfg), rep=30)
            best = fastest_launch(run, candidates(M, N, K, sms), (base, base_cfg), ref, 1e-2, f"N={N} K={K} M={M}")
            results.append(dict(N=N, K=K, M=M, linears=names, sglang_us=base * 1e6, sglang_config=base_cfg,
                                tuned_us=best[0] * 1e6, tuned_config=best[1], speedup=base / best[0],
                                tuned_tbps=nbytes / best[0] / 1e12))
            best_per_m[M] = best[1]  # SGLang's own where it wins: the nearest entry must not be another batch's
            print(f"N={N} K={K} M={M} ({', '.join(names)}): SGLang {base * 1e6:.1f} us, tuned {best[0] * 1e6:.1f} us "
                  f"({base / best[0]:.2f}x, {nbytes / best[0] / 1e12:.2f} TB/s) [t={time.time() - t0:.0f}s]", flush=True)
            args.results.write_text(json.dumps(dict(device=device, results=results), indent=1))
        if best_per_m:
            merge_into(args.out_configs / config_file_name(N, K, device, BLOCK, BLOCK), best_per_m,
                       [int(m) for m in args.anchors.split(",") if m], lambda M: sglang_launch(own, M))
    print(f"done in {time.time() - t0:.0f}s: {args.results}", flush=True)


if __name__ == "__main__":
    main()
