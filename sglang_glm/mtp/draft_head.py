"""The MTP draft's LM head in block FP8 (launch key `mtp_draft_head_fp8`).

GLM-5.2's LM head is BF16 (154880 x 6144, 1.9 GB a GPU at TP 1), and an EAGLE 3/1/4 round runs it four
times at batch 1: once in the verify, three times in the draft (draft-extend and two draft steps), 1.36
of a 9.14 ms round on the H200 (session 15's profile). The draft only needs each step's argmax, so it
may read an FP8 copy: half the bytes, quantized as the checkpoint's linears are (e4m3, one fp32 scale a
128 x 128 block of weights, activations a 128-wide group a token). The verify keeps the target's BF16
head, so greedy tokens are the target's whatever the draft proposes; the copy can only change which
drafts are accepted.

On CUDA the product is SGLang's block-FP8 GEMM (`triton_w8a8_block_fp8_linear`, the kernel the
checkpoint's FP8 linears run, with the plugin's tuned launch configs); elsewhere the plain-PyTorch
reference below, which rounds exactly as that kernel's inputs are rounded.
"""

from __future__ import annotations

import torch
from torch import nn

BLOCK = 128  # weight block edge and activation group width, as GLM-5's FP8 checkpoints use
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def quantize_head(weight: torch.Tensor, rows_at_once: int = 64 * BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[V, H] head -> (e4m3 codes [V, H], fp32 scales [ceil(V / 128), H / 128]); w ~ code x scale.
    Done rows_at_once rows at a time (a multiple of 128): the fp32 working copy of a whole GLM-5.2 head
    would be 3.8 GB."""
    assert rows_at_once % BLOCK == 0
    V, H = weight.shape
    if H % BLOCK:
        raise ValueError(f"mtp_draft_head_fp8: hidden_size {H} is not a multiple of {BLOCK} (the FP8 head's "
                         f"block); drop the key to draft with the BF16 head")
    codes = torch.empty(V, H, dtype=FP8, device=weight.device)
    scale = torch.empty(-(-V // BLOCK), H // BLOCK, dtype=torch.float32, device=weight.device)
    for r0 in range(0, V, rows_at_once):
        w = weight[r0 : r0 + rows_at_once].float()
        n = w.shape[0]
        w = torch.nn.functional.pad(w, (0, 0, 0, -n % BLOCK))  # the last block's missing rows count as 0
        blocks = w.view(-1, BLOCK, H // BLOCK, BLOCK)
        s = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
        scale[r0 // BLOCK : r0 // BLOCK + s.shape[0]] = s
        codes[r0 : r0 + n] = (blocks / s[:, None, :, None]).to(FP8).view(-1, H)[:n]
    return codes, scale


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, H] activations -> (e4m3 codes, fp32 scales [T, H / 128]): one scale a 128-wide group a token."""
    groups = x.float().view(x.shape[0], -1, BLOCK)
    scale = groups.abs().amax(-1).clamp(min=1e-10) / FP8_MAX
    return (groups / scale[..., None]).to(FP8).view_as(x), scale


def fp8_head_logits_ref(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Logits [T, V] of x [T, H] through the FP8 head, in plain PyTorch (fp32 products of the rounded
    operands): the reference for the CUDA kernel and the CPU path."""
    xq, xs = quantize_groups(x)
    V, H = codes.shape
    a = (xq.float().view(x.shape[0], -1, BLOCK) * xs[..., None]).view(x.shape[0], H)
    w = codes.float().view(V, H // BLOCK, BLOCK) * scale.repeat_interleave(BLOCK, 0)[:V, :, None]
    return (a @ w.view(V, H).T).to(x.dtype)


class Fp8HeadMethod:
    """SGLang's LogitsProcessor runs an LM head through `quant_method.apply` when the head has one."""

    def apply(self, layer: "Fp8DraftHead", x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert bias is None, "GLM-DSA's LM head has no bias"
        if x.is_cuda:
            from sglang.srt.layers.quantization.fp8_utils import triton_w8a8_block_fp8_linear

            return triton_w8a8_block_fp8_linear(x, layer.weight, [BLOCK, BLOCK], layer.weight_scale_inv)
        return fp8_head_logits_ref(x, layer.weight, layer.weight_scale_inv)


class Fp8DraftHead(nn.Module):
    """An FP8 copy of a (vocab-parallel) LM head shard, for the draft's logits only."""

    def __init__(self, head: torch.Tensor):
        super().__init__()
        codes, scale = quantize_head(head.detach())
        self.weight = nn.Parameter(codes, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
        self.quant_method = Fp8HeadMethod()

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size() + self.weight_scale_inv.numel() * 4
