"""CPU checks of the committed glm-dsa-mini: transformers agrees with the reference, held-out loss, MTP acceptance.

Data: the committed held-out sample benchmarks/train/data/heldout.txt. Writes benchmarks/train/eval_results.json.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, GlmMoeDsaForCausalLM

from sglang_glm_tools.reference import accepted_length, draft_round, greedy_continuation, load_reference_model

HERE = Path(__file__).parent
ASSET = HERE.parent.parent / "assets/glm-dsa-mini"


def heldout_tokens(path: Path) -> torch.Tensor:
    tok = AutoTokenizer.from_pretrained(path)
    text = (HERE / "data/heldout.txt").read_text(encoding="utf-8")
    ids = []
    for doc in text.split(tok.eos_token):
        ids += tok(doc, add_special_tokens=False).input_ids + [tok.eos_token_id]
    return torch.tensor(ids)


def windows(tokens: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    starts = torch.randint(0, tokens.numel() - length, (n,), generator=torch.Generator().manual_seed(seed))
    return tokens[starts[:, None] + torch.arange(length)]


@torch.no_grad()
def check_transformers(path: Path, ref, tokens: torch.Tensor) -> dict:
    """Greedy tokens of transformers (float32) == the reference's, on prompts longer than index_topk."""
    hf = GlmMoeDsaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = windows(tokens, 4, 200, seed=1)
    want = hf.generate(prompts, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)[:, 200:]
    got = greedy_continuation(ref, prompts, 16)
    diff = (hf(prompts).logits - ref(prompts).logits).abs().max().item()
    return {"greedy_equal": bool(torch.equal(want, got)), "logits_max_abs_diff": diff,
            "prompt_tokens": 200, "new_tokens": 16, "prompts": 4}


@torch.no_grad()
def heldout_loss(ref, tokens: torch.Tensor, n: int, ctx: int) -> dict:
    x = windows(tokens, n, ctx + 1, seed=2)
    out = {}
    for name, dense in (("sparse", False), ("dense", True)):
        logits = torch.cat([ref(x[i:i + 2, :ctx], dense=dense).logits for i in range(0, n, 2)])
        out[f"lm_loss_{name}"] = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).item()
    return out | {"windows": n, "context": ctx}


@torch.no_grad()
def acceptance(ref, tokens: torch.Tensor, n: int, prompt_len: int, steps: int, batch: int) -> dict:
    """Greedy draft tokens vs the target's greedy tokens, per carry / index-share setting, 1..steps draft steps."""
    prompts = windows(tokens, n, prompt_len, seed=3)
    results = {}
    settings = [("post", True), ("pre", True), ("post", False), ("pre", False)]
    accepted = {s: [] for s in settings}
    for i in range(0, n, batch):
        p = prompts[i:i + batch]
        target_tokens = greedy_continuation(ref, p, steps + 1)  # x_L .. x_{L+steps}
        ids = torch.cat([p, target_tokens[:, :1]], 1)
        hidden = ref(p).hidden
        for carry, share in settings:
            drafts = draft_round(ref, ids, hidden, steps, index_share=share, post_norm_carry=carry == "post")
            accepted[(carry, share)].append(accepted_length(drafts.tokens, target_tokens[:, 1:]))
    for (carry, share), acc in accepted.items():
        acc = torch.cat(acc).float()
        results[f"{carry}-norm carry, index share {'on' if share else 'off'}"] = {
            "mean_acceptance_length": {s: 1 + acc.clamp(max=s).mean().item() for s in range(1, steps + 1)},
            "position_acceptance": {j: (acc >= j).float().mean().item() for j in range(1, steps + 1)},
        }
    return results | {"prompts": n, "prompt_tokens": prompt_len}


def table(acc: dict, steps: int) -> str:
    head = "| setting | " + " | ".join(f"len@{s}" for s in range(1, steps + 1)) + " | " + \
           " | ".join(f"pos{j}" for j in range(1, steps + 1)) + " |"
    lines = [head, "|" + "---|" * (2 * steps + 1)]
    for name, r in acc.items():
        if isinstance(r, dict):
            lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in r["mean_acceptance_length"].values()) + " | "
                         + " | ".join(f"{v:.2f}" for v in r["position_acceptance"].values()) + " |")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", type=Path, default=ASSET)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    ref = load_reference_model(a.model, torch.float32)
    tokens = heldout_tokens(a.model)
    results = {"transformers": check_transformers(a.model, ref, tokens)}
    print(results["transformers"], flush=True)
    results["heldout"] = heldout_loss(ref, tokens, n=8, ctx=1024)
    print(results["heldout"], flush=True)
    results["mtp_acceptance"] = acceptance(ref, tokens, a.prompts, 256, a.steps, batch=16)
    print(table(results["mtp_acceptance"], a.steps))
    (HERE / "eval_results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
