"""How flat is a GPU-suite prompt? The float64 reference's top-2 logit gap at each greedy position.

The suite's margin rule counts a served token that differs from the reference where that gap is at
most 0.4 nats as a near tie, and fails a server whose near ties pass 25% of its positions. On a
random-weight checkpoint some prompts sit below the margin everywhere, so a handful of their
positions alone measure the prompt more than the kernel. This runs, on CPU, the reference of the
suite's 64-head checkpoint (`glm52_64h`, built as tests/gpu/conftest.py builds it) over FlashMLA's
200-token prompt (tests/gpu/test_flashmla_gpu.py) and twelve other 200-token prompts of the same form.

    .venv/bin/python benchmarks/gpu_suite/reference_margins.py --out benchmarks/gpu_suite/reference_margins.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from gpu_serving import MARGIN, NEW_TOKENS, make_model  # noqa: E402
from test_flashmla_gpu import MID_PROMPT  # noqa: E402

from sglang_glm_tools.reference import load_reference_model  # noqa: E402

OTHERS = [(13, 1), (17, 9), (3, 11), (19, 4), (23, 6), (29, 2), (31, 8), (37, 10), (41, 12), (43, 14), (9, 20), (101, 3)]


@torch.no_grad()
def greedy_margins(model, prompt: list[int]) -> list[float]:
    ids, margins = list(prompt), []
    for _ in range(NEW_TOKENS):
        top2 = model(torch.tensor([ids])).logits[0, -1].double().topk(2)
        margins.append(round(float(top2.values[0] - top2.values[1]), 4))
        ids.append(int(top2.indices[0]))
    return margins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        path = make_model(Path(root), "glm52_64h", seed=5, overrides={"num_attention_heads": 64, "num_key_value_heads": 64})
        model = load_reference_model(path, dtype=torch.float64, device="cpu")
        prompts = {"flashmla_mid_prompt": MID_PROMPT}
        prompts.update({f"({a}i+{b})%500+2": [(a * i + b) % 500 + 2 for i in range(200)] for a, b in OTHERS})
        rows = []
        for name, prompt in prompts.items():
            m = greedy_margins(model, prompt)
            rows.append({"prompt": name, "positions": len(m), "at_most_margin": sum(x <= MARGIN for x in m),
                         "min": min(m), "max": max(m), "margins": m})
            print(f"{name:22s} {rows[-1]['at_most_margin']:2d}/{len(m)} positions <= {MARGIN} nats "
                  f"(gaps {min(m):.3f}-{max(m):.3f})", flush=True)
    args.out.write_text(json.dumps({"checkpoint": "glm52_64h (seed 5)", "reference": "float64, CPU",
                                    "margin": MARGIN, "prompts": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
