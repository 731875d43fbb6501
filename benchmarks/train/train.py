"""Train glm-dsa-mini with the reference model: dense warm-up with indexer distillation, then sparse DSA, MTP x3.

Stops itself on a wall-clock budget, evaluates on held-out data and writes, under --out:
hub-NN.safetensors (hub-layout tensors, bf16, in shards of at most 15 MiB: the GPU machine returns
files of 16 MiB), model_config.json, log.csv, summary.json.
`export.py` turns these into the committed checkpoint with sglang_glm_tools.checkpoint's writer.

The config's `train.final_norm_spread` ({sigma, outliers, outlier_scale, seed}) starts both final
norms (`model.norm`, the MTP's `shared_head.norm`) from per-channel gains spread like a large trained
LLM's instead of ones (issue 15: the post-norm and pre-norm MTP carries then differ).
"""

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from sglang_glm_tools.carry_models import norm_spread, norm_stats
from sglang_glm_tools.reference import DsaConfig, GlmDsaForCausalLM
from sglang_glm_tools.reference.layers import Router

LOG_FIELDS = ["step", "seconds", "tokens", "phase", "lr", "loss", "lm", "mtp1", "mtp2", "mtp3",
              "indexer_kl", "mtp_indexer_kl", "tokens_per_s"]


def init_weights(model: GlmDsaForCausalLM, std: float, final_norm_spread: dict | None = None) -> None:
    """Normal(0, std) matrices; residual outputs scaled by 1/sqrt(2 * layers) (GPT-2 style); gains 1,
    or for the two final norms the given spread."""
    depth_scale = (2 * (model.cfg.num_hidden_layers + 1)) ** -0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                scale = depth_scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                p.normal_(0.0, std * scale)
            elif name.endswith("norm.bias"):
                p.zero_()
            else:
                p.fill_(1.0)
        if final_norm_spread:
            s = norm_spread(model.cfg.hidden_size, **final_norm_spread).float()
            model.model.norm.weight.copy_(s)
            model.mtp_layer.shared_head.norm.weight.copy_(s)


def save_shards(tensors: dict, out: Path, max_bytes: int = 15 << 20) -> None:
    shards, size = [{}], 0
    for k, v in tensors.items():
        if shards[-1] and size + v.numel() * v.element_size() > max_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.numel() * v.element_size()
    for i, shard in enumerate(shards):
        save_file(shard, str(out / f"hub-{i:02d}.safetensors"), metadata={"format": "pt"})


class ExpertLoad:
    """Aux-loss-free balancing (noaux_tc): nudge each router's e_score_correction_bias toward equal load."""

    def __init__(self, model, rate: float):
        self.rate, self.routers, self.loads = rate, [], {}
        for m in model.modules():
            if isinstance(m, Router):
                self.routers.append(m)
                m.register_forward_hook(self._record)

    def _record(self, router, _inputs, combine):
        load = (combine > 0).float().sum(0)
        self.loads[router] = self.loads.get(router, 0) + load

    @torch.no_grad()
    def update(self):
        for router, load in self.loads.items():
            router.e_score_correction_bias.add_(self.rate * torch.sign(load.mean() - load))
        self.loads.clear()


def batches(tokens: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """Random windows of `length` tokens (documents joined by <|endoftext|>)."""
    span = torch.arange(length, device=tokens.device)
    while True:
        starts = torch.randint(0, tokens.numel() - length, (batch,), generator=gen, device="cpu").to(tokens.device)
        yield tokens[starts[:, None] + span]


def losses(model, x, ctx: int, depths: int, dense: bool, distill: bool):
    """LM loss, per-depth MTP losses (recursive post-norm carry), indexer KLs (target, MTP)."""
    b = x.shape[0]
    out = model(x[:, :ctx], dense=dense, distill=distill)
    lm = F.cross_entropy(out.logits.float().flatten(0, 1), x[:, 1:ctx + 1].flatten())
    positions = torch.arange(ctx, device=x.device).expand(b, ctx)
    carry, mtp, mtp_kl = out.hidden, [], 0.0
    for k in range(depths):
        step = model.mtp_forward(x[:, k + 1:k + 1 + ctx], carry, positions + k, dense=dense, distill=distill)
        mtp.append(F.cross_entropy(step.logits.float().flatten(0, 1), x[:, k + 2:k + 2 + ctx].flatten()))
        mtp_kl = mtp_kl + (step.indexer_kl if step.indexer_kl is not None else 0.0)
        carry = step.post_norm
    return lm, mtp, out.indexer_kl, mtp_kl


def lr_at(step: int, frac: float, t: dict) -> float:
    warm = min(1.0, (step + 1) / t["warmup_steps"])
    cosine = t["min_lr_ratio"] + (1 - t["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
    return t["lr"] * warm * cosine


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, ctx: int, depths: int, n_windows: int, batch: int) -> dict:
    """Held-out LM loss (sparse DSA and dense attention) and teacher-forced MTP loss/accuracy per depth."""
    model.eval()
    usable = min(n_windows, (tokens.numel() - depths - 2) // ctx)
    sums = {"lm_sparse": 0.0, "lm_dense": 0.0, **{f"mtp{k + 1}": 0.0 for k in range(depths)},
            **{f"mtp{k + 1}_acc": 0.0 for k in range(depths)}}
    for i in range(0, usable, batch):
        idx = torch.arange(i, min(i + batch, usable), device=tokens.device)
        x = tokens[idx[:, None] * ctx + torch.arange(ctx + depths + 2, device=tokens.device)]
        with torch.autocast(tokens.device.type, torch.bfloat16):
            for dense in (False, True):
                out = model(x[:, :ctx], dense=dense)
                loss = F.cross_entropy(out.logits.float().flatten(0, 1), x[:, 1:ctx + 1].flatten())
                sums["lm_dense" if dense else "lm_sparse"] += loss.item() * len(idx)
            carry = model(x[:, :ctx]).hidden
            pos = torch.arange(ctx, device=x.device).expand(len(idx), ctx)
            for k in range(depths):
                step = model.mtp_forward(x[:, k + 1:k + 1 + ctx], carry, pos + k)
                target = x[:, k + 2:k + 2 + ctx]
                sums[f"mtp{k + 1}"] += F.cross_entropy(step.logits.float().flatten(0, 1), target.flatten()).item() * len(idx)
                sums[f"mtp{k + 1}_acc"] += (step.logits.argmax(-1) == target).float().mean().item() * len(idx)
                carry = step.post_norm
    model.train()
    return {k: v / usable for k, v in sums.items()} | {"eval_tokens": usable * ctx}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", type=Path, default=Path(__file__).parent / "config.json")
    ap.add_argument("--data", type=Path, default=Path("build/glm-dsa-mini-data"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, required=True, help="wall-clock seconds of training")
    ap.add_argument("--max-steps", type=int, default=None, help="stop earlier (smoke runs)")
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)

    spec = json.loads(a.config.read_text())
    t = spec["train"]
    torch.manual_seed(t["seed"])
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(a.device)
    cfg = DsaConfig.from_dict(spec["model"])
    model = GlmDsaForCausalLM(cfg)
    init_weights(model, t["init_std"], t.get("final_norm_spread"))
    model.to(dev).train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params / 1e6:.2f}M", flush=True)

    train = torch.from_numpy(np.load(a.data / "train.npy").astype(np.int64)).to(dev)
    heldout = torch.from_numpy(np.load(a.data / "heldout.npy").astype(np.int64)).to(dev)
    ctx, depths = t["context"], t["mtp_depths"]
    data = batches(train, t["batch_size"], ctx + depths + 2, torch.Generator().manual_seed(t["seed"]))
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(0.9, 0.95), fused=dev.type == "cuda")
    balance = ExpertLoad(model, rate=1e-3)

    a.out.mkdir(parents=True, exist_ok=True)
    log = open(a.out / "log.csv", "w", newline="")
    writer = csv.DictWriter(log, LOG_FIELDS)
    writer.writeheader()
    start, step, tokens = time.time(), 0, 0
    while True:
        elapsed = time.time() - start
        frac = elapsed / a.budget_s
        if frac >= 1.0 or (a.max_steps is not None and step >= a.max_steps):
            break
        dense = frac < t["dense_warmup_fraction"]
        lr = lr_at(step, frac, t)
        for g in opt.param_groups:
            g["lr"] = lr
        x = next(data)
        with torch.autocast(dev.type, torch.bfloat16):
            lm, mtp, kl, mtp_kl = losses(model, x, ctx, depths, dense=dense, distill=True)
            loss = lm + t["mtp_weight"] * sum(mtp) / depths + t["indexer_kl_weight"] * (kl + mtp_kl)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        balance.update()
        step += 1
        tokens += x.shape[0] * ctx
        if step % t["log_every"] == 0 or step <= 3:
            secs = time.time() - start
            row = {"step": step, "seconds": round(secs, 2), "tokens": tokens, "phase": "dense" if dense else "sparse",
                   "lr": f"{lr:.3e}", "loss": f"{loss.item():.4f}", "lm": f"{lm.item():.4f}",
                   **{f"mtp{k + 1}": f"{m.item():.4f}" for k, m in enumerate(mtp)},
                   "indexer_kl": f"{kl.item() / cfg.num_hidden_layers:.4f}", "mtp_indexer_kl": f"{mtp_kl.item() / depths:.4f}",
                   "tokens_per_s": round(tokens / secs)}
            writer.writerow(row)
            log.flush()
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    log.close()
    train_s = time.time() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0
    print(f"trained {step} steps, {tokens} tokens in {train_s:.0f}s; peak mem {peak:.1f} GiB",
          flush=True)

    summary = {"steps": step, "train_tokens": tokens, "train_seconds": round(train_s, 1), "params": n_params,
               "final_norm": norm_stats(model.model.norm.weight),
               "shared_head_norm": norm_stats(model.mtp_layer.shared_head.norm.weight),
               "heldout": evaluate(model, heldout, ctx, depths, a.eval_windows, t["batch_size"])}
    print(json.dumps(summary, indent=1), flush=True)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (a.out / "model_config.json").write_text(json.dumps(spec["model"], indent=1) + "\n")
    tensors = {k: v.to(torch.float32 if "e_score_correction_bias" in k else torch.bfloat16).cpu().contiguous()
               for k, v in model.hub_state_dict().items()}
    save_shards(tensors, a.out)
    print("saved", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
