"""A GLM-5.2-shaped model directory for serving benchmarks: config, tokenizer and prompts, no weights.

GLM-5.2's per-layer width (hidden 6144, 64 heads, q_lora 2048, kv_lora 512, rope 64, v_head 256,
indexer 32 x 128 with top-k 2048, 256 experts top-8 of width 2048 plus a shared expert, FP8 128x128
block weights) on its first 8 layers (3 dense, 5 MoE; `--layers`) and its MTP layer. IndexCache plan
FSSSFSSS: GLM-5.2's steady state of one full layer in four.

Weights come from SGLang's own benchmarking loader (`--load-format dummy`): the 8 layers and the
MTP layer weigh about 67 GB in FP8, more than the H200 machine's 64 GiB disk could hold as a
checkpoint. The server runs with SGLANG_SIMULATE_UNIFORM_EXPERTS=1 because dummy router weights
would send every token to the same 8 experts.

The tokenizer is a word-level vocabulary of the full 154880 ids ("<unk>", "<eos>", "w2" ... "w154879"), so every
generated id past the two specials decodes to text (bench_serving times the first token by the first non-empty text)
and the prompts file holds random words: distinct prompts, no accidental radix-cache hits.

    python benchmarks/serving/gpu/make_glm52_shaped.py OUT_DIR [--tiny]

`hot_vocab.pt` is a `--speculative-token-map` of 32768 ids (the first ones: weights are random, so
which ids does not matter, only how many rows the draft's LM head keeps); bench_gpu's
`eagle_3_4_token_map` serves it.

`--layers N` serves a deeper slice of GLM-5.2 (the plan repeats FSSS; 3 dense layers, the rest MoE):
the draft side of an MTP round does not grow with depth, so a deeper proxy weighs it nearer to
GLM-5.2's 78 layers. Each MoE layer adds ~9.7 GB of FP8 weights: 12 layers (~107 GB with the MTP
layer) should leave the H200 room for a pool (not yet served).

`--experts E` keeps every width but builds E routed experts a MoE layer instead of 256 (top-8 routing
kept), so many more layers fit one H200: a deep proxy for the batch-1 round. At batch 1 a token reads
8 routed experts whatever E, so a plain step costs what GLM-5.2's would; a 4-token verify reads
E(1 - (1 - 8/E)^4) distinct experts under uniform routing, 26.5 at E = 64 against GLM-5.2's 30.5
(a slightly cheaper verify), 19.3 at E = 24. Batch 32 is not represented (its tokens read all E).
The script prints the FP8 weight size; e.g. `--layers 40 --experts 64` is ~104 GB.

`--tiny` keeps the vocabulary, plan and layer count but shrinks the widths, for a CPU smoke run.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

VOCAB = 154880
HOT_VOCAB = 32768  # the draft head's rows with a token map: a fifth of GLM's vocabulary
PLAN_UNIT = "FSSS"  # GLM-5.2's steady state: one full layer in four

GLM52_LAYER = dict(
    hidden_size=6144, num_attention_heads=64, num_key_value_heads=64, q_lora_rank=2048,
    kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
    index_n_heads=32, index_head_dim=128, index_topk=2048,
    n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, moe_intermediate_size=2048,
    intermediate_size=12288, first_k_dense_replace=3, n_group=1, topk_group=1,
    routed_scaling_factor=2.5, norm_topk_prob=True,
)
TINY_LAYER = dict(
    GLM52_LAYER, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=64,
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, index_n_heads=4,
    index_head_dim=32, index_topk=64, n_routed_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32, intermediate_size=128,
)


def plan(layers: int) -> str:
    return (PLAN_UNIT * layers)[:layers]


def config(tiny: bool, layers: int = 8, experts: int | None = None) -> dict:
    from sglang_glm_tools.checkpoint import FP8_BLOCK, build_config, fp8_quantization_config

    widths = dict(TINY_LAYER if tiny else GLM52_LAYER)
    if experts is not None:
        widths["n_routed_experts"] = experts
    fields = dict(
        widths,
        vocab_size=VOCAB, num_hidden_layers=layers, indexer_types=["full" if c == "F" else "shared" for c in plan(layers)],
        max_position_embeddings=202752, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=0, eos_token_id=1, index_share_for_mtp_iteration=True, dtype="bfloat16",
    )
    cfg = build_config(fields, mtp=True)
    out = cfg.to_dict()
    out["architectures"] = ["GlmMoeDsaForCausalLM"]
    if not tiny:
        out["quantization_config"] = fp8_quantization_config(cfg, mtp=True)
        assert out["quantization_config"]["weight_block_size"] == [FP8_BLOCK, FP8_BLOCK]
    return out


def weight_gb(cfg: dict) -> float:
    """Weights in GB as served: FP8 layers (1 byte a parameter, block scales ignored), BF16 embedding
    and LM head; the MTP layer counted as one more MoE layer."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    attn = (h * cfg["q_lora_rank"] + cfg["q_lora_rank"] * heads * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
            + h * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
            + cfg["kv_lora_rank"] * heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]) + heads * cfg["v_head_dim"] * h)
    moe = 3 * h * cfg["moe_intermediate_size"] * (cfg["n_routed_experts"] + cfg["n_shared_experts"])
    dense_layers = cfg["first_k_dense_replace"]
    moe_layers = cfg["num_hidden_layers"] - dense_layers + 1  # + the MTP layer
    params = dense_layers * (attn + 3 * h * cfg["intermediate_size"]) + moe_layers * (attn + moe)
    return (params + 2 * 2 * cfg["vocab_size"] * h) / 1e9


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    # Special tokens must not prefix a word: added tokens match anywhere in the text.
    words = {"<unk>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "unk_token": "<unk>",
         "model_max_length": 202752}))


def write_prompts(path: Path, rows: int = 96, words: int = 4096, seed: int = 0) -> None:
    """ShareGPT layout, as bench_serving's random dataset reads it (--dataset-path)."""
    rng = random.Random(seed)
    text = lambda: " ".join(f"w{rng.randrange(2, VOCAB)}" for _ in range(words))  # noqa: E731
    data = [{"id": str(i), "conversations": [{"from": "human", "value": text()},
                                             {"from": "gpt", "value": "w2"}]} for i in range(rows)]
    (path / "prompts_sharegpt.json").write_text(json.dumps(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (>= 4: 3 dense, then MoE)")
    ap.add_argument("--experts", type=int, default=None, help="routed experts a MoE layer (default: GLM-5.2's 256)")
    args = ap.parse_args()
    if args.layers < 4:
        ap.error(f"--layers {args.layers}: GLM-5.2's first 3 layers are dense, so at least 4 keep an MoE layer")
    top = (TINY_LAYER if args.tiny else GLM52_LAYER)["num_experts_per_tok"]
    if args.experts is not None and args.experts < top:
        ap.error(f"--experts {args.experts}: a token is routed to {top} experts, so at least {top}")
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = config(args.tiny, args.layers, args.experts)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=1))
    write_tokenizer(args.out)
    write_prompts(args.out)
    torch.save(list(range(HOT_VOCAB)), args.out / "hot_vocab.pt")
    print(f"wrote {args.out} (plan {plan(args.layers)}, {'tiny' if args.tiny else 'GLM-5.2'} widths, "
          f"{cfg['n_routed_experts']} experts a MoE layer, vocab {VOCAB}, {weight_gb(cfg):.1f} GB of weights)")


if __name__ == "__main__":
    main()
