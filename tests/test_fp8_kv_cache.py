"""FP8 KV cache layouts of the plugin's pool on CPU: bytes, bit-exact round trips, what the kernels read.

The pool is built directly (no server) at GLM-5.2 geometry (latent 512, rope 64, index keys 128),
where its bytes must be exactly FlashMLA's and the kernels' references', and at the bundled
model's (48 / 32 / 48), where the last latent group is shorter than 128.
"""

import logging
import re

import pytest
import torch

from glm_dsa_kernels.indexer import dequantize_index_k as kernel_dequantize_index_k
from glm_dsa_kernels.indexer import quantize_index_k_fp8
from glm_dsa_kernels.sparse_mla import dequantize_kv_fp8, quantize_kv_fp8
from glm_dsa_kernels import layout
from sglang_glm.attention.kv_pool import TorchDSAKVPool

GLM52 = dict(kv_lora_rank=512, qk_rope_head_dim=64, index_head_dim=128)
MINI = dict(kv_lora_rank=48, qk_rope_head_dim=32, index_head_dim=48)


class _Layer:
    def __init__(self, layer_id):
        self.layer_id = layer_id


def make_pool(geometry, dtype=torch.float8_e4m3fn, skip=(False, True, False)):
    r, p = geometry["kv_lora_rank"], geometry["qk_rope_head_dim"]
    fp8 = dtype == torch.float8_e4m3fn
    return TorchDSAKVPool(
        size=2 * layout.INDEX_PAGE, page_size=layout.INDEX_PAGE, kv_lora_rank=r, dtype=dtype,
        qk_rope_head_dim=p, layer_num=len(skip), device="cpu", index_head_dim=geometry["index_head_dim"],
        enable_memory_saver=False, kv_cache_dim=layout.mla_row_bytes(r, p) if fp8 else r + p,
        skip_topk_layers=list(skip),
    )


def test_row_bytes_formula():
    # FlashMLA: 512 e4m3 + 4 fp32 scales + 64 bf16 rope; index key: 128 e4m3 + 1 fp32 scale.
    assert layout.mla_row_bytes(512, 64) == 512 + 4 * 4 + 2 * 64 == 656
    assert layout.index_k_token_bytes(128) == 128 + 4 == 132
    assert layout.mla_row_bytes(48, 32) == 48 + 4 + 64 == 116


@pytest.mark.parametrize("geometry, dtype, want", [
    (GLM52, torch.float8_e4m3fn, ((656, 132), 656)),
    (MINI, torch.float8_e4m3fn, ((116, 52), 116)),
    (GLM52, torch.bfloat16, ((576 * 2, 128 * 2), 576 * 2)),
    (MINI, torch.float32, ((80 * 4, 48 * 4), 80 * 4)),
])
def test_pool_logs_bytes_per_token_per_layer(caplog, geometry, dtype, want):
    with caplog.at_level(logging.INFO, logger="sglang_glm.attention.kv_pool"):
        pool = make_pool(geometry, dtype)
    (mla, index), shared = want
    assert pool.bytes_per_token_per_layer() == want
    line = next(r.getMessage() for r in caplog.records if "bytes per token per layer" in r.getMessage())
    got = re.search(r"full layers (\d+) \(MLA (\d+) \+ index K (\d+)\), shared layers (\d+)", line).groups()
    assert tuple(map(int, got)) == (mla + index, mla, index, shared), line
    # The buffers hold what the line states: one row per slot, and no index keys in shared layers.
    assert pool.mla_rows(0).shape[1] * pool.mla_rows(0).element_size() == mla
    assert pool.index_k_buffer[1] is None


def _write(pool, layer_id, loc, latent, rope):
    pool.set_mla_kv_buffer(_Layer(layer_id), loc, latent[:, None, :], rope[:, None, :])


def test_mla_rows_are_flashmla_bytes_and_round_trip_bit_exactly():
    g = torch.Generator().manual_seed(0)
    pool = make_pool(GLM52)
    kv = (torch.randn(40, 576, generator=g) * torch.rand(40, 1, generator=g) * 4).bfloat16()
    kv[3, :128] = 0  # an all-zero scale group
    loc = torch.randperm(2 * layout.INDEX_PAGE, generator=g)[:40] + 1
    _write(pool, 2, loc, kv[:, :512], kv[:, 512:])
    stored = pool.mla_rows(2)[loc]
    assert torch.equal(stored, quantize_kv_fp8(kv))  # byte for byte what the Triton kernel reads
    back = pool.latent_rows(2, loc, torch.float32)
    assert torch.equal(back, dequantize_kv_fp8(stored))  # what the kernel's reference dequantizes
    # Quantizing the dequantized rows again gives the same bytes: the cache is a fixed point.
    assert torch.equal(layout.quantize_mla_rows(back[:, :512], back[:, 512:]), stored)
    assert torch.equal(pool.mla_rows(2)[0], torch.zeros(656, dtype=torch.uint8))  # padding slot untouched


def test_index_keys_are_kernel_pages_and_round_trip_bit_exactly():
    g = torch.Generator().manual_seed(1)
    pool = make_pool(GLM52)
    slots = 2 * layout.INDEX_PAGE + layout.INDEX_PAGE  # size + page: SGLang's padding page included
    k = (torch.randn(slots, 128, generator=g) * 3).bfloat16()
    loc = torch.randperm(slots, generator=g)
    pool.set_index_k(0, loc, k[loc])
    pages = pool.index_k_pages(0, layout.INDEX_PAGE)
    assert torch.equal(pages, quantize_index_k_fp8(k.view(-1, layout.INDEX_PAGE, 128)))
    rows = pool.index_k_rows(0, loc)
    assert torch.equal(rows, kernel_dequantize_index_k(pages).view(slots, 128)[loc])
    codes, scale = layout.quantize_index_k(rows)
    assert torch.equal(layout.dequantize_index_k(codes, scale), rows)
    with pytest.raises(RuntimeError, match="shared layer"):
        pool.index_k_rows(1, loc)


def test_mini_geometry_round_trip_and_error_bound():
    g = torch.Generator().manual_seed(2)
    pool = make_pool(MINI)
    kv = torch.randn(30, 80, generator=g)
    loc = torch.arange(1, 31)
    _write(pool, 0, loc, kv[:, :48], kv[:, 48:])
    back = pool.latent_rows(0, loc, torch.float32)
    assert torch.equal(layout.quantize_mla_rows(back[:, :48], back[:, 48:]), pool.mla_rows(0)[loc])
    assert torch.equal(back[:, 48:], kv[:, 48:].bfloat16().float())  # rope kept in bfloat16
    # e4m3 keeps 3 mantissa bits: relative error at most 2^-4 of each value, plus subnormals
    # (below 2^-6 of the scale) rounded to steps of 2^-9 of it.
    scale = kv[:, :48].abs().amax(-1, keepdim=True) / 448
    err = (back[:, :48] - kv[:, :48]).abs()
    assert (err <= kv[:, :48].abs() * 2**-4 + scale * 2**-9 + 1e-7).all()


def test_kv_dtypes_the_backends_cannot_read_are_refused_by_name():
    pool = make_pool(MINI, torch.float8_e5m2)
    with pytest.raises(ValueError, match=r"glm_dsa_torch .*float8_e5m2: start with --kv-cache-dtype auto, bfloat16 or fp8_e4m3"):
        pool.check_served_by("glm_dsa_torch")
    make_pool(MINI, torch.float8_e4m3fn).check_served_by("glm_dsa_torch")
    make_pool(MINI, torch.float32).check_served_by("glm_dsa_torch")


@pytest.mark.slow
def test_other_mla_models_keep_sglangs_cpu_fp8_refusal(tmp_path):
    # The FP8 hooks are scoped to GLM-DSA on the plugin's backends: a DeepSeek-V3 (MLA) checkpoint
    # with the plugin installed still stops at SGLang's own check.
    from serving import failed_launch
    from test_other_models import tiny_deepseek_v3

    out = failed_launch(tiny_deepseek_v3(tmp_path / "dsv3"), "--kv-cache-dtype", "fp8_e4m3")
    assert "CPU FP8 KV cache is only supported for MHA" in out, out[-3000:]


@pytest.mark.parametrize("geometry", [GLM52, MINI])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("skip, draft", [((False, True, True, True), False), ((False,) * 4, False),
                                         ((False, True), True)])
def test_sglang_sizes_the_pool_by_the_index_keys_it_allocates(geometry, dtype, skip, draft):
    """SGLang divides free memory by its per-token cell size; the index-K part must be the bytes this
    pool really allocates per token (SGLang's own formula is FP8 for every dtype: with BF16 keys the
    bundled model overfilled the H200 at start-up)."""
    from types import SimpleNamespace
    from unittest import mock

    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    from sglang_glm import hooks
    from sglang_glm.hooks import memory

    plan = ["shared" if s else "full" for s in skip]
    hf_config = SimpleNamespace(architectures=["GlmMoeDsaForCausalLM"], indexer_types=plan, index_topk=64,
                                index_head_dim=geometry["index_head_dim"])
    kvc = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config), is_draft_worker=draft,
                          layer_info=SimpleNamespace(start_layer=0), kv_cache_dtype=dtype)
    pool = make_pool(geometry, dtype, skip=(False,) * len(skip) if draft else skip)  # draft pools skip none
    allocated = sum(b.numel() * b.element_size() for b in pool.index_k_buffer if b is not None)
    want = allocated // (pool.size + pool.page_size)

    target = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_dsa_indexer_cell_size"
    assert any(h.target == target and h.fn is memory._plugin_index_k_cell_size for h in hooks.hooks())
    with mock.patch("sglang.srt.runtime_context.attention_backends", return_value=("glm_dsa_triton",) * 2):
        got = memory._plugin_index_k_cell_size(
            DefaultPoolConfigurator._compute_dsa_indexer_cell_size, None, kvc=kvc, num_layers=len(skip),
            allocate_all_layers=draft)
    assert got == want
