"""A hot-vocabulary map for SGLang's `--speculative-token-map`: the draft's LM head keeps only these rows.

GLM-5.2's LM head is 154880 x 6144 (1.9 GB in BF16): read once per draft forward, it is about 0.45 ms
of a draft step on an H200, the largest single part of the MTP layer's cost. With a map SGLang's
EAGLE worker slices the draft's head to the listed token ids and maps the draft's picks back; the
target verifies as always, so the tokens served do not change, only how often a draft is accepted
(a draft can only be a listed token).

The map is the `size` most frequent token ids of the given text under the model's tokenizer (the
special tokens always included), written with `torch.save` as SGLang's `load_token_map` reads it.
It also reports the coverage: the share of the text's tokens that the map holds, an upper bound on
how often a draft can be right.

    python benchmarks/mtp/make_token_map.py --tokenizer assets/glm-dsa-mini --text benchmarks/train/data/calib.txt \
        --size 512 --out /tmp/hot_512.pt
    python benchmarks/mtp/make_token_map.py --vocab-size 154880 --size 32768 --out /tmp/glm52/hot_32k.pt  # first ids
        # (no text: a map of that size for speed measurements on random weights, where acceptance is 1 anyway)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def hot_token_ids(token_ids: torch.Tensor, vocab_size: int, size: int, always: list[int]) -> torch.Tensor:
    """The `size` most frequent ids (ties: lower id first) plus `always`, ascending."""
    counts = torch.bincount(token_ids, minlength=vocab_size)[:vocab_size].to(torch.float64)
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    order = torch.sort(-counts, stable=True).indices  # stable: equal counts keep id order
    return order[:size].sort().values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, help="model directory whose tokenizer counts the text")
    ap.add_argument("--text", type=Path, nargs="*", default=[], help="text files to count tokens in")
    ap.add_argument("--vocab-size", type=int, help="without text: the map is the first --size ids")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    if args.text:
        from transformers import AutoTokenizer

        if args.tokenizer is None:
            ap.error("--text needs --tokenizer")
        tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
        vocab = json.loads((args.tokenizer / "config.json").read_text())["vocab_size"]
        ids = torch.tensor([i for path in args.text for i in tok(path.read_text())["input_ids"]])
        if args.size > vocab:
            ap.error(f"--size {args.size} is larger than the vocabulary ({vocab})")
        hot = hot_token_ids(ids, vocab, args.size, tok.all_special_ids)
        coverage = torch.isin(ids, hot).double().mean().item()
        print(f"{hot.numel()} of {vocab} ids cover {coverage:.1%} of {ids.numel()} text tokens")
    elif args.vocab_size:
        hot = torch.arange(min(args.size, args.vocab_size))
        print(f"the first {hot.numel()} of {args.vocab_size} ids (no text counted)")
    else:
        ap.error("give --text with --tokenizer, or --vocab-size")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(hot.tolist(), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
