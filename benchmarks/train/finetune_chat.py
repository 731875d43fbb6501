"""Fine-tune glm-dsa-mini into glm-dsa-mini-chat: GLM-5 chat format, reasoning and tool calls (CPU).

Starts from the committed glm-dsa-mini, adds GLM's special tokens to its tokenizer and the chat
template (`sglang_glm_tools.chat_format`), grows the embedding and lm head by those rows (new rows
start at the mean of the old ones, so no new token wins before training), and trains briefly with
train.py's losses (sparse DSA, indexer distillation, MTP; 1 depth by default, to fit a CPU budget) on a mix of synthetic
GLM-format conversations (`sglang_glm_tools.chat_data`) and standard-library source from the training split.
Writes the checkpoint (bf16, as the bundled model) and, next to this script (or in --log-dir),
finetune_chat_log.csv and finetune_chat_summary.json.
"""

import argparse
import csv
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

# Run as a script: its folder is on sys.path, so the training modules beside it import by name.
from prepare_data import read, split_of, stdlib_files
from train import ExpertLoad, losses

from sglang_glm_tools.chat_data import conversation, render
from sglang_glm_tools.chat_format import add_chat_format, stop_token_ids
from sglang_glm_tools.checkpoint import build_config, write_checkpoint
from sglang_glm_tools.reference import GlmDsaForCausalLM
from sglang_glm_tools.reference.model import load_reference_model

HERE = Path(__file__).parent

ROOT = HERE.parent.parent
BASE = ROOT / "assets/glm-dsa-mini"


def grown(model: GlmDsaForCausalLM, vocab: int) -> GlmDsaForCausalLM:
    """The same model with `vocab` embedding / lm-head rows; new rows = mean of the old."""
    old = model.cfg.vocab_size
    new = GlmDsaForCausalLM(dataclasses.replace(model.cfg, vocab_size=vocab))
    state = model.state_dict()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = state[name]
        state[name] = torch.cat([w, w.mean(0, keepdim=True).expand(vocab - old, -1)])
    new.load_state_dict(state)
    return new


def token_stream(tok, chat_share: float, n_tokens: int, seed: int) -> tuple[torch.Tensor, dict]:
    """Documents joined by <|endoftext|>: chat conversations and stdlib files, by token share."""
    rng = random.Random(seed)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    stdlib = Path(json.__file__).parent.parent
    code = [p for p in stdlib_files(stdlib) if split_of(p, stdlib) == "train"]
    rng.shuffle(code)
    ids, counts, n_chat = [], {"chat": 0, "code": 0}, 0
    while len(ids) < n_tokens:
        if counts["chat"] <= chat_share * max(len(ids), 1):
            messages, tools, thinking = conversation(rng)
            enc = tok(render(tok, messages, tools), add_special_tokens=False)["input_ids"]
            kind, n_chat = "chat", n_chat + 1
        else:
            text = read(code.pop()) if code else None
            if not text:
                continue
            enc, kind = tok(text[:20000], add_special_tokens=False)["input_ids"], "code"
        ids.extend(enc + [eos])
        counts[kind] += len(enc) + 1
    return torch.tensor(ids[:n_tokens]), {**counts, "conversations": n_chat}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "assets/glm-dsa-mini-chat")
    ap.add_argument("--budget-s", type=float, default=600, help="wall-clock seconds of training")
    ap.add_argument("--context", type=int, default=384)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--mtp-depths", type=int, default=1, help="MTP depths trained (train.py: 3)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--chat-share", type=float, default=0.6, help="share of training tokens from conversations")
    ap.add_argument("--tokens", type=int, default=3_000_000, help="size of the token stream windows are drawn from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", type=Path, default=HERE, help="where the loss log and summary go")
    a = ap.parse_args(argv)

    torch.manual_seed(a.seed)
    tok = add_chat_format(AutoTokenizer.from_pretrained(BASE))
    model = grown(load_reference_model(BASE, dtype=torch.float32), len(tok)).train()
    stream, mix = token_stream(tok, a.chat_share, a.tokens, a.seed)
    print(f"vocab {len(tok)}; stream {stream.numel()} tokens: {mix}", flush=True)

    depths = a.mtp_depths
    span = a.context + depths + 2
    gen = torch.Generator().manual_seed(a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    balance = ExpertLoad(model, rate=1e-3)
    log_path = a.log_dir / "finetune_chat_log.csv"
    fields = ["step", "seconds", "lr", "loss", "lm", *[f"mtp{k + 1}" for k in range(depths)], "indexer_kl"]
    log = csv.DictWriter(log_path.open("w", newline=""), fields)
    log.writeheader()
    start, step = time.time(), 0
    while (elapsed := time.time() - start) < a.budget_s:
        lr = a.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * (1 - elapsed / a.budget_s))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, stream.numel() - span, (a.batch,), generator=gen)
        x = stream[starts[:, None] + torch.arange(span)]
        lm, mtp, kl, mtp_kl = losses(model, x, a.context, depths, dense=False, distill=True)
        loss = lm + 0.3 * sum(mtp) / depths + kl + mtp_kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        balance.update()
        step += 1
        if step % 10 == 0 or step <= 2:
            row = {"step": step, "seconds": round(time.time() - start, 1), "lr": f"{lr:.2e}",
                   "loss": f"{loss.item():.4f}", "lm": f"{lm.item():.4f}",
                   **{f"mtp{k + 1}": f"{m.item():.4f}" for k, m in enumerate(mtp)},
                   "indexer_kl": f"{kl.item() / model.cfg.num_hidden_layers:.4f}"}
            log.writerow(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    config = build_config(base={**json.loads((BASE / "config.json").read_text()), "vocab_size": len(tok)},
                          mtp=True)
    config.eos_token_id = stop_token_ids(tok)
    write_checkpoint(a.out, config, model.hub_state_dict(), tokenizer=tok, dtype=torch.bfloat16)
    summary = {"base": "assets/glm-dsa-mini", "command": "python " + " ".join(sys.argv),
               "steps": step, "train_seconds": round(time.time() - start, 1),
               "tokens_seen": step * a.batch * a.context, "context": a.context, "batch": a.batch, "lr": a.lr, "mtp_depths": depths,
               "data_mix": {"chat_share": a.chat_share, **mix}, "final": row, "vocab": len(tok)}
    (a.log_dir / "finetune_chat_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
