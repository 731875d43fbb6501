"""One reference MTP draft round (greedy, batch of equal-length sequences), recomputed from scratch each step.

Index share (`index_share_for_mtp_iteration`): the MTP indexer runs in the pass over the verified tokens
(draft step 0); later steps run no indexer and their query attends to exactly the key positions of the
top-k row of the last verified token. Keys written by later draft steps are not in that row, so shared
steps do not see them. Without sharing, each step recomputes its row over all keys, drafts included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .model import GlmDsaForCausalLM


@dataclass
class DraftRound:
    tokens: torch.Tensor  # [B, k] greedy draft tokens d_1..d_k
    logits: torch.Tensor  # [B, k, V] the logits each draft token was taken from


def draft_round(model: GlmDsaForCausalLM, ids: torch.Tensor, hidden: torch.Tensor, num_steps: int, *,
                index_share: bool | None = None, post_norm_carry: bool = True) -> DraftRound:
    """Draft `num_steps` tokens after the verified `ids` [B, L+1] (the last is the target's newest token).

    hidden: the target's hidden after its final norm for ids[:, :L] (h_prev of draft step 0).
    post_norm_carry: carry shared_head.norm(x) into the next step (GLM's default), else x (pre-norm).
    """
    if index_share is None:
        index_share = model.cfg.index_share_for_mtp_iteration
    b, verified = ids.shape
    n = verified - 1
    tokens, carries = ids[:, 1:], hidden
    positions = torch.arange(n, device=ids.device).expand(b, n)
    step = model.mtp_forward(tokens, carries, positions)
    context_rows = step.selection  # [B, n, n], from the MTP indexer of step 0
    drafts, logits = [], []
    for j in range(num_steps):
        last_logits = step.logits[:, -1]
        drafts.append(last_logits.argmax(-1))
        logits.append(last_logits)
        if j == num_steps - 1:
            break
        carry = (step.post_norm if post_norm_carry else step.pre_norm)[:, -1:]
        tokens = torch.cat([tokens, drafts[-1][:, None]], dim=1)
        carries = torch.cat([carries, carry], dim=1)
        t = tokens.shape[1]
        positions = torch.arange(t, device=ids.device).expand(b, t)
        selection = None
        if index_share:
            selection = torch.zeros(b, t, t, dtype=torch.bool, device=ids.device)
            selection[:, :n, :n] = context_rows
            selection[:, n:, :n] = context_rows[:, -1:, :]
        step = model.mtp_forward(tokens, carries, positions, selection=selection)
    return DraftRound(torch.stack(drafts, 1), torch.stack(logits, 1))


@torch.no_grad()
def greedy_continuation(model: GlmDsaForCausalLM, ids: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The target's greedy next `num_tokens` tokens [B, num_tokens] (full recompute per token)."""
    out = []
    for _ in range(num_tokens):
        nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        ids = torch.cat([ids, nxt], dim=1)
    return torch.cat(out, dim=1)


@torch.no_grad()
def reference_draft_round(model: GlmDsaForCausalLM, prompt_ids: torch.Tensor, num_steps: int, *,
                          index_share: bool | None = None, post_norm_carry: bool = True):
    """Target prefill of `prompt_ids`, its greedy next token, then one draft round.

    Returns (next_token [B, 1], DraftRound).
    """
    target = model(prompt_ids)
    next_token = target.logits[:, -1].argmax(-1, keepdim=True)
    ids = torch.cat([prompt_ids, next_token], dim=1)
    return next_token, draft_round(model, ids, target.hidden, num_steps,
                                   index_share=index_share, post_norm_carry=post_norm_carry)


def accepted_length(draft_tokens: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Leading draft tokens equal to the target's greedy tokens, per row [B]."""
    match = (draft_tokens == target_tokens[:, : draft_tokens.shape[1]]).long()
    return match.cumprod(dim=1).sum(dim=1)
