"""Tokenize the Python standard library for glm-dsa-mini: BPE tokenizer, file-level split, uint16 token arrays.

Writes OUT/{train,calib,heldout}.npy (documents separated by <|endoftext|>), OUT/tokenizer/ and the
committed text samples benchmarks/train/data/{calib,heldout}.txt.
"""

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

from sglang_glm_tools.checkpoint import train_bpe_tokenizer

SAMPLE_BYTES = 150_000


def stdlib_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.stat().st_size > 0)


def split_of(path: Path, root: Path) -> str:
    """Stable file-level split from the relative path: 90% train, 5% calibration, 5% held-out."""
    bucket = int(hashlib.sha256(str(path.relative_to(root)).encode()).hexdigest(), 16) % 100
    return "calib" if bucket < 5 else "heldout" if bucket < 10 else "train"


def read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stdlib", type=Path, default=Path("/root/.pyenv/versions/3.11.7/lib/python3.11"))
    ap.add_argument("--out", type=Path, default=Path("build/glm-dsa-mini-data"))
    ap.add_argument("--samples", type=Path, default=Path(__file__).parent / "data")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--tokenizer", type=Path, help="use this tokenizer instead of training one")
    a = ap.parse_args(argv)

    docs = {"train": [], "calib": [], "heldout": []}
    for p in stdlib_files(a.stdlib):
        text = read(p)
        if text:
            docs[split_of(p, a.stdlib)].append(text)
    if a.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(a.tokenizer))
    else:
        tok = train_bpe_tokenizer(docs["train"], a.vocab)
    a.out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(a.out / "tokenizer")
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    for split, texts in docs.items():
        ids = []
        for enc in tok(texts, add_special_tokens=False)["input_ids"]:
            ids.extend(enc)
            ids.append(eos)
        arr = np.asarray(ids, dtype=np.uint16)
        np.save(a.out / f"{split}.npy", arr)
        print(f"{split}: {len(texts)} files, {arr.size} tokens, {sum(map(len, texts)) / arr.size:.2f} chars/token")
    a.samples.mkdir(parents=True, exist_ok=True)
    for split in ("calib", "heldout"):
        sample, size = [], 0
        for text in docs[split]:
            if size + len(text) > SAMPLE_BYTES:
                continue
            sample.append(text)
            size += len(text)
        (a.samples / f"{split}.txt").write_text("<|endoftext|>".join(sample), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
