"""Plain-PyTorch versions of the `sgl_kernel` CPU ops SGLang calls on the CPU path.

SGLang 0.5.23 picks these at import time when `is_cpu()` (no setting selects another), and the
stand-in `sgl_kernel` package serves them from here. Each op follows the semantics of SGLang's
Triton twin (named in its docstring) and mutates its output arguments in place, as the C++ ops do.
All of them sit on the EAGLE / NEXTN speculative path (draft cache slots, tree build, greedy
verify); sizes there are small (batch x draft tokens), so clarity beats vectorisation.
"""

from __future__ import annotations

import torch

# TreeMaskMode values of sglang.kernels.ops.speculative.spec_tree.
_FULL_MASK, _QLEN_ONLY = 0, 1


def _ints(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """Twin of `mem_cache.allocation.assign_req_to_token_pool`: write each request's new slots
    (out_cache_loc, concatenated per request) into req_to_token[req, start:end]."""
    offset = 0
    for rpi, start, end in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        n = end - start
        if n > 0:
            req_to_token[rpi, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += max(n, 0)


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """Twin of `cache_locs.assign_extend_cache_locs`: gather req_to_token[req, start:end] of every
    request into out_cache_loc, concatenated."""
    offset = 0
    for rpi, start, end in zip(_ints(req_pool_indices), _ints(start_offset), _ints(end_offset)):
        n = end - start
        if n > 0:
            out_cache_loc[offset : offset + n] = req_to_token[rpi, start:end].to(out_cache_loc.dtype)
        offset += max(n, 0)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols
):
    """Twin of `cache_locs.assign_draft_cache_locs_contiguous`: request b's topk * num_cols draft
    slots are req_to_token[req, seq_len : seq_len + topk * num_cols], laid out [bs, topk, cols]."""
    width = topk * num_cols
    for b, (rpi, seq_len) in enumerate(zip(_ints(req_pool_indices), _ints(seq_lens))):
        out_cache_loc[b * width : (b + 1) * width] = req_to_token[
            rpi, seq_len : seq_len + width
        ].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """Twin of `eagle.fill_bonus_tokens`: the last accepted token of each request."""
    flat = accept_tokens.reshape(-1)
    for b, n in enumerate(_ints(accept_lens)):
        bonus_tokens[b] = flat[accept_stride * b + n - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Twin of `eagle.fill_accept_out_cache_loc`: compact the cache slots of accepted tokens."""
    idx = accept_index.reshape(-1)
    src = idx[idx != -1].long()
    accept_out_cache_loc[: src.numel()] = out_cache_loc[src].to(accept_out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrieve_index,
    retrieve_next_token,
    retrieve_next_sibling,
    topk,
    depth,
    draft_token_num,
    tree_mask_mode,
):
    """Twin of `spec_tree.sgl_build_tree_kernel_efficient_triton` (FULL_MASK and QLEN_ONLY).

    Slot 0 of each request is the bonus (root) token; slot i > 0 is draft token
    selected_index[b, i - 1]. Outputs: positions (root = seq_len, else seq_len + depth),
    retrieve_* (flattened index of each slot, first child, next sibling) and the tree mask
    (each slot sees the root, its ancestors and itself).
    """
    mode = int(tree_mask_mode)
    if mode not in (_FULL_MASK, _QLEN_ONLY):
        raise NotImplementedError(f"tree mask mode {mode} has no CPU implementation")
    n = draft_token_num
    seq_lens = _ints(verified_seq_len)
    parents = parent_list.reshape(len(seq_lens), -1).tolist() if parent_list.numel() else None
    selected = selected_index.reshape(len(seq_lens), -1).tolist()
    prefix_sum = 0
    for b, seq_len in enumerate(seq_lens):
        sel = selected[b]

        def parent_slot(slot: int) -> int | None:
            """Slot (1-based, 0 = root) of the parent of draft slot `slot`, None if not found."""
            parent_tb = sel[slot - 1] // topk
            if parent_tb == 0:
                return 0
            parent_token = parents[b][parent_tb]
            for pp in range(n - 1):
                if sel[pp] == parent_token:
                    return pp + 1
            return None

        base = b * n
        positions[base] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index[b, i] = base + i
            p = parent_slot(i)
            if p is not None:
                nxt = int(retrieve_next_token[b, p])
                retrieve_next_token[b, p] = i
                if nxt != -1:
                    retrieve_next_sibling[b, i] = nxt
        retrieve_index[b, 0] = base

        if mode == _FULL_MASK:
            row_len = seq_len + n
            start = n * n * b + prefix_sum * n
        for x in range(n):
            if mode == _FULL_MASK:
                row = start + row_len * x + seq_len  # column of slot 0 in row x
            else:
                row = n * n * b + n * x
            tree_mask[row : row + n] = False
            tree_mask[row] = True
            d = 0
            slot = x
            while slot > 0 and d < depth:
                tree_mask[row + slot] = True
                d += 1
                p = parent_slot(slot)
                if p is None:
                    break
                slot = p
            if x > 0:
                positions[base + x] = seq_len + d
        prefix_sum += seq_len


def verify_tree_greedy_cpu(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
):
    """Twin of `spec_tree.verify_tree_greedy_kernel_triton`: walk the tree from the root,
    accepting the child whose draft token equals the target's greedy token at its parent."""
    bs, n = candidates.shape
    num_spec = accept_index.shape[1]
    cand = candidates.tolist()
    r_index = retrive_index.reshape(bs, n).tolist()
    r_next = retrive_next_token.reshape(bs, n).tolist()
    r_sib = retrive_next_sibling.reshape(bs, n).tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(bs):
        last = r_index[b][0]
        accept_index[b, 0] = last
        num_accepted = 0
        cur = 0
        for _ in range(1, num_spec):
            cur = r_next[b][cur]
            want = target[last]
            matched = False
            while cur != -1:
                if cand[b][cur] == want:
                    predicts[last] = want
                    num_accepted += 1
                    accept_index[b, num_accepted] = r_index[b][cur]
                    last = r_index[b][cur]
                    matched = True
                    break
                cur = r_sib[b][cur]
            if not matched:
                break
        accept_token_num[b] = num_accepted
        predicts[last] = target[last]


def bind_interpreted_moe_align() -> None:
    """SGLang binds its CUDA `moe_align_block_size` op only where CUDA is; under TRITON_INTERPRET its
    own Triton single-launch align kernel (same "+1 offset" buckets, batches of up to 64 routed slots)
    stands in, so SGLang's fused MoE kernel runs on a CPU (benchmarks/kernels/tune_fused_moe.py's tests)."""
    import importlib

    from sglang.kernels.ops.moe.moe_align_small_numel import SMALL_NUMEL_LIMIT, moe_align_small_numel

    align = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size")

    def interpreted(topk_ids, buckets, block, sorted_ids, expert_ids, post_pad, _cumsum, _pad, ignore_invalid):
        assert topk_ids.numel() <= SMALL_NUMEL_LIMIT and not ignore_invalid, "only small batches, +1 buckets"
        moe_align_small_numel(topk_ids, buckets, block, sorted_ids, expert_ids, post_pad)

    align.sgl_moe_align_block_size = interpreted
