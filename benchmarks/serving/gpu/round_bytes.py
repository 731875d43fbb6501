"""Bytes one GPU reads for a plain decode step and for an EAGLE round (chain, `steps` draft steps,
`steps + 1` draft tokens) of a GLM-DSA config: the bandwidth bound on issue 29's "round in plain steps".

While decode is bandwidth-bound no implementation does better than this ratio, and the faster the plain
step's kernels get, the closer a measured ratio comes to it. The verify runs `steps + 1` tokens per
request, and with uniform routing (the random-weight models') they read far more distinct experts than
one token does; the draft runs the MTP layer `steps` times, each with the LM head.

What is counted, per GPU (tensor parallel `tp` splits heads, MLP widths and the LM head):
- each layer's weights as the FP8 checkpoints store them: FP8 linears at a byte a weight, the absorbed
  kv_b (w_kc, w_vc), the router, the indexer's head weights and the MTP layer's eh_proj in BF16;
- routed experts: the expected number of distinct experts `tokens` tokens pick, E (1 - (1 - k/E)^tokens);
- the KV cache: each request's top-k rows per layer (FP8 rows of 656 bytes; a request's queries share
  them) and, in full layers, its whole index-K cache (132 bytes a position);
- the LM head once per forward that samples (the verify, the draft-extend, each later draft step), cut to
  `hot_vocab` rows in the draft when a token map is used, and at a byte a weight in the draft with
  `mtp_draft_head_fp8` (the verify keeps the target's BF16 head).
Activations, norms and the like are left out: they are small at decode batches.

The last column is `round_floor`: with a plain step's served time on the H200, the fewest plain steps a
round can cost there (its docstring says why).

    python round_bytes.py --config /tmp/glm52/config.json --out results/round_bytes.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KV_ROW, INDEX_K_ROW = 656, 132  # bytes per position: FP8 latent + scales + BF16 rope; FP8 index key + scale


def distinct_experts(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts among `tokens` tokens that each pick `top_k` of `experts` uniformly."""
    return experts * (1 - (1 - top_k / experts) ** tokens)


def layer_bytes(cfg: dict, tp: int, batch: int, tokens: int, context: int, dense: bool, full: bool) -> float:
    """What one decoder layer reads for `batch` requests of `tokens` tokens each at `context` positions."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"] // tp
    nope, rope, v, lat = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    attn = (h * cfg["q_lora_rank"] + cfg["q_lora_rank"] * heads * (nope + rope) + h * (lat + rope)
            + heads * v * h) + 2 * heads * lat * (nope + v)
    if full:
        attn += cfg["q_lora_rank"] * cfg["index_n_heads"] * cfg["index_head_dim"] + h * cfg["index_head_dim"]
        attn += 2 * h * cfg["index_n_heads"] + batch * context * INDEX_K_ROW
    attn += batch * min(context, cfg["index_topk"]) * KV_ROW
    if dense:
        return attn + 3 * h * cfg["intermediate_size"] // tp
    expert = 3 * h * cfg["moe_intermediate_size"] // tp
    routed = distinct_experts(batch * tokens, cfg["n_routed_experts"], cfg["num_experts_per_tok"])
    return attn + cfg["n_shared_experts"] * expert + 2 * h * cfg["n_routed_experts"] + routed * expert


def step_and_round(cfg: dict, tp: int, batch: int, steps: int, context: int, hot_vocab: int | None = None,
                   draft_head_bytes: int = 2) -> dict:
    """Bytes of a plain step, and of a round by phase (verify, draft-extend, later draft steps)."""
    n, k_dense = cfg["num_hidden_layers"], cfg["first_k_dense_replace"]
    full = [t == "full" for t in cfg.get("indexer_types") or ["full"] * n]
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    head = 2 * vocab * h / tp
    draft_head = draft_head_bytes * (hot_vocab or vocab) * h / tp

    def model(tokens):
        return sum(layer_bytes(cfg, tp, batch, tokens, context, i < k_dense, full[i]) for i in range(n)) + head

    def mtp(tokens):  # the MTP layer (its own indexer, a MoE layer), eh_proj in BF16, the draft's LM head
        return layer_bytes(cfg, tp, batch, tokens, context, False, True) + 2 * 2 * h * h + draft_head

    plain = model(1)
    phases = {"verify": model(steps + 1), "draft-extend": mtp(steps + 1), "draft steps": (steps - 1) * mtp(1)}
    total = sum(phases.values())
    return {"plain_step_gb": plain / 1e9, "round_gb": total / 1e9,
            "phases_gb": {p: b / 1e9 for p, b in phases.items()}, "round_in_plain_steps": total / plain}


CASES = (  # (label, layers, routed experts, tensor parallel, a served batch-1 plain step on the H200 in ms)
    ("GLM-5.2-shaped, 8 layers, one H200 (make_glm52_shaped.py)", 8, None, 1, 3.15),  # session 18, tuned GEMMs
    ("deep proxy, 40 layers x 64 experts, one H200", 40, 64, 1, 14.29),  # session 24
    ("GLM-5.2, 78 layers, TP 8 (per GPU)", 78, None, 8, None),  # not served here: needs eight H200s
)
H200_COPY_TBPS = 4.29  # benchmarks/kernels/results.md: a 2 GiB device copy, bytes read + written


def round_floor(plain_gb: float, round_gb: float, plain_ms: float, tbps: float = H200_COPY_TBPS) -> float:
    """The fewest plain steps a round can cost on the GPU that served the plain step in plain_ms: its verify
    runs every kernel of a plain step (on more tokens, so no faster), and every byte the round reads past a
    plain step's (the verify's extra experts, the whole draft) costs at least bytes / the device-copy rate."""
    return 1 + (round_gb - plain_gb) / tbps / plain_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="make_glm52_shaped.py's config.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--hot-vocab", type=int, default=32768, help="the token map's size (the second column)")
    args = ap.parse_args()

    base = json.loads(args.config.read_text())
    # the draft's LM head: BF16, cut to the token map's rows, FP8, both (the keys suffix the JSON fields)
    variants = {"": {}, "_token_map": {"hot_vocab": args.hot_vocab}, "_fp8_head": {"draft_head_bytes": 1},
                "_token_map_fp8_head": {"hot_vocab": args.hot_vocab, "draft_head_bytes": 1}}
    rows = []
    print("| model | batch | plain step GB | round GB | round in plain steps | with a token map | with an FP8 draft "
          "head | floor at batch 1 (no map / map / FP8 head / both) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, layers, experts, tp, plain_ms in CASES:
        cfg = dict(base, num_hidden_layers=layers, n_routed_experts=experts or base["n_routed_experts"])
        pattern = base["indexer_types"][:4]  # the proxy's plan: one full layer in four
        cfg["indexer_types"] = (pattern * layers)[:layers]
        for batch in (1, 8, 32):
            runs = {name: step_and_round(cfg, tp, batch, args.steps, args.context, **kw) for name, kw in variants.items()}
            plain = runs[""]
            floor = {}
            if batch == 1 and plain_ms:
                floor = {"h200_plain_step_ms": plain_ms, "h200_copy_tbps": H200_COPY_TBPS,
                         **{f"floor_in_plain_steps{name}": round_floor(plain["plain_step_gb"], run["round_gb"], plain_ms)
                            for name, run in runs.items()}}
            rows.append(dict(model=label, layers=layers, experts=cfg["n_routed_experts"], tp=tp, batch=batch,
                             context=args.context, steps=args.steps, **plain,
                             round_in_plain_steps_token_map=runs["_token_map"]["round_in_plain_steps"],
                             round_in_plain_steps_fp8_head=runs["_fp8_head"]["round_in_plain_steps"], **floor))
            shown = " / ".join(f"{floor[f'floor_in_plain_steps{name}']:.2f}" for name in variants) if floor else ""
            print(f"| {label} | {batch} | {plain['plain_step_gb']:.2f} | {plain['round_gb']:.2f} | "
                  f"{plain['round_in_plain_steps']:.2f} | {runs['_token_map']['round_in_plain_steps']:.2f} | "
                  f"{runs['_fp8_head']['round_in_plain_steps']:.2f} | {shown} |")
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
