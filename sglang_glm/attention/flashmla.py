"""FlashMLA's SM90 sparse-MLA kernels, for the shapes where they beat the plugin's Triton kernel.

sgl-flash-mla 1.0.0 keeps SM90 and DeepSeek-V3.2's KV formats in its legacy kernels
(`use_legacy=True`): `flash_mla_with_kvcache` attends over the 656-byte FP8 rows the plugin's pool
stores (V3.2's format), `flash_mla_sparse_fwd` over BF16 rows; both take the pool rows the Triton
kernel takes (-1 = no key). Against the plugin's fastest (warp-specialized) kernel on the H200, top-k
2048 (session 20, benchmarks/kernels/logs/session20_flashmla_tables.md):
  FP8 KV:  64 heads: batch 1 21.9 vs 16.9 us (Triton ahead), batch 8 / 32 / 64 level, batch 256
           222.7 vs 243.0 us; 128 heads: batch 64 / 128 1.5x faster
  BF16 KV: 64 and 128 heads, 256 / 1024 / 4096 queries 1.16-1.21x faster
so FlashMLA serves FP8 pools over FP8_ROWS[heads] query rows and BF16 pools from BF16_MIN_ROWS.

The FP8 kernel takes a split-KV schedule ("plan") per (query rows, heads, top-k). Every query attends
top-k rows, so a plan depends on those shapes alone: plans are made eagerly (at start-up for every
row count FlashMLA serves, `plan_decode`) and each call hands its plan to a fresh `FlashMLASchedMeta`,
so a captured CUDA graph reads fixed tensors and makes none.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch

from glm_dsa_kernels.layout import INDEX_PAGE

# query rows (first, last) per head count; at 64 heads Triton is level up to batch 64, FlashMLA ahead at 256
FP8_ROWS = {64: (65, 512), 128: (1, 512)}
BF16_MIN_ROWS = 256
HEADS = (64, 128)  # the head counts FlashMLA's kernels are built for
KV_FORMAT = "V32"  # 512 e4m3 latent + 4 fp32 scales + 64 bf16 rope: the pool's FP8 rows
# FlashMLA serves wherever sgl-flash-mla runs since its served speed was measured (session 25: 32K prefill
# TTFT 766 vs 798 ms on Triton, one run); SGLANG_GLM_FLASHMLA=0 keeps every shape on the plugin's kernels.
SWITCH_ENV = "SGLANG_GLM_FLASHMLA"


def compute_capability(device: torch.device) -> Optional[tuple[int, int]]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def _switch() -> str:
    value = os.environ.get(SWITCH_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{SWITCH_ENV}={value!r}; use 0 (sparse MLA on the plugin's Triton kernels everywhere) "
                         f"or 1 / unset (FlashMLA for the shapes it was measured faster on, where it is installed)")
    return value


def switched_on() -> bool:
    return _switch() != "0"


def asked_for() -> bool:
    """Set to 1 by the launch: FlashMLA missing is then worth a warning."""
    return _switch() == "1"


def _load_kernels(device: torch.device):
    """(the flash_mla module, None) where its legacy kernels run, else (None, why not)."""
    if not switched_on():
        return None, f"switched off by {SWITCH_ENV}=0"
    if compute_capability(device) != (9, 0):
        return None, "its legacy kernels run on SM90 only"
    try:
        import flash_mla
    except ImportError:
        return None, "sgl-flash-mla is not installed"
    if not flash_mla.has_legacy():
        return None, "this sgl-flash-mla build has no legacy (SM90) kernels"
    return flash_mla, None


class FlashMLA:
    """FlashMLA's sparse kernels on one device, with the decode plans made for it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kernels, self.why_not = _load_kernels(device)
        self._plans: dict = {}

    @property
    def available(self) -> bool:
        return self.kernels is not None

    @staticmethod
    def serves(tokens: int, heads: int, kv_is_fp8: bool) -> bool:
        """Where FlashMLA was measured faster than (or level with) the Triton kernel."""
        if tokens <= 0 or heads not in HEADS:
            return False
        if kv_is_fp8:
            first, last = FP8_ROWS[heads]
            return first <= tokens <= last
        return tokens >= BF16_MIN_ROWS

    def describe(self, heads: int, kv_is_fp8: bool) -> str:
        """The start-up line saying which kernel serves which shapes (the GPU suite asserts it)."""
        if not self.available:
            return f"sparse MLA on Triton (FlashMLA not used: {self.why_not})"
        if heads not in HEADS:
            return f"sparse MLA on Triton (FlashMLA takes {' or '.join(map(str, HEADS))} heads; {heads} per rank here)"
        if kv_is_fp8:
            first, last = FP8_ROWS[heads]
            return f"sparse MLA on FlashMLA for FP8 KV at {first}-{last} query rows, Triton otherwise ({heads} heads)"
        return f"sparse MLA on FlashMLA for BF16 KV from {BF16_MIN_ROWS} query rows, Triton below ({heads} heads)"

    def plan_decode(self, heads: int, topk: int) -> None:
        """Every FP8 plan a served batch can need, made before any CUDA-graph capture."""
        if heads in FP8_ROWS:
            first, last = FP8_ROWS[heads]
            for tokens in range(first, last + 1):
                self._plan(tokens, heads, topk)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # plans are read on other streams than this one

    def _plan(self, tokens: int, heads: int, topk: int):
        key = (tokens, heads, topk)
        if key not in self._plans:
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"no FlashMLA plan for {tokens} query rows x {heads} heads, top-k {topk}: plans are made "
                    "before CUDA-graph capture (FlashMLA.plan_decode)"
                )
            # the schedule counts top-k keys per query whatever the lengths say (sparse decode)
            lengths = torch.full((tokens,), topk, dtype=torch.int32, device=self.device)
            self._plans[key] = self.kernels.get_mla_decoding_metadata(
                lengths, heads, 1, heads, is_fp8_kvcache=True, topk=topk, use_legacy=True
            )
        return self._plans[key]

    def attend(self, q: torch.Tensor, kv: torch.Tensor, rows: torch.Tensor, scale: float, d_v: int) -> torch.Tensor:
        """q [T, H, 576] bf16 over pool rows [T, topk] int32 (-1 = none) of kv (FP8 uint8 [P, 656] in
        64-token pages, or BF16 [P, 576]) -> out [T, H, d_v] bf16."""
        if kv.dtype == torch.uint8:
            sched = self.kernels.get_mla_metadata()[0]
            sched.tile_scheduler_metadata, sched.num_splits = self._plan(q.shape[0], q.shape[1], rows.shape[1])
            out, _ = self.kernels.flash_mla_with_kvcache(
                q[:, None], kv.view(-1, INDEX_PAGE, 1, kv.shape[1]), None, None, d_v, sched,
                softmax_scale=scale, is_fp8_kvcache=True, indices=rows[:, None], use_legacy=True,
                kv_format=KV_FORMAT,
            )
            return out[:, 0]
        out, _, _ = self.kernels.flash_mla_sparse_fwd(
            q, kv[:, None], rows[:, None], scale, d_v, use_legacy=True, return_log2_lse=False
        )
        return out


@functools.lru_cache(maxsize=None)
def flashmla_on(device: torch.device) -> FlashMLA:
    """One per device and process: the target, draft and draft-step backends share its plans."""
    return FlashMLA(device)
