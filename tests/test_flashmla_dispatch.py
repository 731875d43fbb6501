"""Which kernel `glm_dsa_triton` runs sparse MLA on (issue 30, item 4), checked on CPU: the dispatch
rule, Triton where sgl-flash-mla is absent, and, with a stand-in `flash_mla` module (this file's
only; tests/gpu/test_flashmla_gpu.py runs the real one), the shapes `_attend` hands FlashMLA and the
argument layouts it hands them in."""

import logging
import sys
import types
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from glm_dsa_kernels.pool_rows import positions_to_pool_rows_ref
from glm_dsa_kernels.warmup import WarmUpShapes

from sglang_glm.attention import flashmla as fm
from sglang_glm.attention import triton_dsa_backend as tb

TOPK, POOL = 128, 1024  # pool rows: a multiple of the FP8 pool's 64-token pages


@pytest.mark.parametrize(
    "tokens, heads, fp8, served",
    [
        (1, 64, True, False), (64, 64, True, False), (65, 64, True, True), (512, 64, True, True),
        (513, 64, True, False), (1, 128, True, True), (512, 128, True, True), (513, 128, True, False),
        (4096, 64, True, False),
        (256, 64, False, True), (4096, 64, False, True), (4096, 128, False, True), (255, 64, False, False),
        (1, 64, False, False),
        (1, 32, True, False), (1, 16, True, False), (4096, 32, False, False), (4096, 256, False, False),
        (0, 64, True, False), (0, 64, False, False),
    ],
)
def test_dispatch_rule(tokens, heads, fp8, served):
    assert fm.FlashMLA.serves(tokens, heads, fp8) is served


class FakeFlashMLA(types.ModuleType):
    """Records each call; returns zeros shaped as sgl-flash-mla 1.0.0 documents."""

    def __init__(self, legacy=True):
        super().__init__("flash_mla")
        self.legacy, self.calls, self.fail = legacy, [], False

    def has_legacy(self):
        return self.legacy

    def get_mla_metadata(self, *args, **kwargs):
        return SimpleNamespace(tile_scheduler_metadata=None, num_splits=None), None

    def get_mla_decoding_metadata(self, seqlens_k, num_q_tokens_per_head_k, h_k, h_q=None, is_fp8_kvcache=False,
                                  topk=None, use_legacy=False):
        self.calls.append(("plan", seqlens_k.clone(), num_q_tokens_per_head_k, h_k, h_q, is_fp8_kvcache, topk, use_legacy))
        return torch.zeros(4, 8, dtype=torch.int32), torch.zeros(seqlens_k.shape[0] + 1, dtype=torch.int32)

    def flash_mla_with_kvcache(self, q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits=None, **kw):
        if self.fail:
            raise RuntimeError("kernel failed")
        self.calls.append(("decode", q, k_cache, head_dim_v, tile_scheduler_metadata, kw))
        return torch.full((*q.shape[:3], head_dim_v), 2.0, dtype=torch.bfloat16), None

    def flash_mla_sparse_fwd(self, q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,
                             use_legacy=False, return_log2_lse=None):
        self.calls.append(("prefill", q, kv, indices, sm_scale, d_v, use_legacy, return_log2_lse))
        return torch.full((*q.shape[:2], d_v), 3.0, dtype=torch.bfloat16), None, None


@pytest.fixture
def on_sm90(monkeypatch):
    """An SM90 device as far as the dispatch can tell; fresh FlashMLA objects before and after."""
    monkeypatch.setattr(fm, "compute_capability", lambda device: (9, 0))
    monkeypatch.setenv(fm.SWITCH_ENV, "1")
    fm.flashmla_on.cache_clear()
    yield monkeypatch
    fm.flashmla_on.cache_clear()


@pytest.fixture
def fake(on_sm90):
    module = FakeFlashMLA()
    on_sm90.setitem(sys.modules, "flash_mla", module)
    return module


@pytest.fixture(autouse=True)
def pool_rows_on_cpu(monkeypatch):
    """The pool-rows launcher needs a GPU; its torch reference maps the same rows."""
    monkeypatch.setattr(tb, "positions_to_pool_rows", positions_to_pool_rows_ref)


@pytest.fixture
def triton_calls(monkeypatch):
    """The Triton launcher, recorded instead of run (it needs a GPU)."""
    calls = []

    def sparse_mla_fwd(q, kv, rows, scale, d_v, config):
        calls.append((q.shape, kv.dtype, config))
        return torch.ones(q.shape[0], q.shape[1], d_v, dtype=torch.bfloat16), None

    monkeypatch.setattr(tb, "sparse_mla_fwd", sparse_mla_fwd)
    return calls


def _backend(kv):
    req_to_token = torch.arange(POOL, dtype=torch.int32).roll(7).view(1, POOL)
    pool = SimpleNamespace(check_served_by=lambda name: None, mla_rows=lambda layer_id: kv, fp8=kv.dtype == torch.uint8)
    no_spec = SimpleNamespace(speculative_algorithm=None, speculative_eagle_topk=None, speculative_num_draft_tokens=None)
    runner = SimpleNamespace(device="cpu", page_size=64, model_config=SimpleNamespace(context_len=POOL),
                             req_to_token_pool=SimpleNamespace(req_to_token=req_to_token), token_to_kv_pool=pool,
                             server_args=no_spec, is_draft_worker=False)
    with mock.patch("torch.cuda.get_device_properties", return_value=SimpleNamespace(multi_processor_count=132)):
        return tb.TritonDSABackend(runner)


def _attend(backend, tokens, heads):
    """One layer's sparse MLA over positions 0..TOPK-1 (the last 10 of each query masked)."""
    backend.forward_metadata = SimpleNamespace(slot_table=backend.req_to_token,
                                               query_req=torch.zeros(tokens, dtype=torch.int32))
    positions = torch.arange(TOPK, dtype=torch.int32).repeat(tokens, 1)
    positions[:, -10:] = -1
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=heads, qk_head_dim=576, v_head_dim=512, scaling=0.07)
    q = torch.randn(tokens, heads * 576, dtype=torch.float32)
    return backend._attend(q, layer, positions), backend.req_to_token[0, :TOPK]


def _fp8_pool():
    return torch.zeros(POOL, 656, dtype=torch.uint8)


def _bf16_pool():
    return torch.zeros(POOL, 576, dtype=torch.bfloat16)


def test_triton_where_flash_mla_is_not_installed(on_sm90, triton_calls):
    on_sm90.setitem(sys.modules, "flash_mla", None)  # import flash_mla raises ImportError
    for kv in (_fp8_pool(), _bf16_pool()):
        backend = _backend(kv)
        assert not backend.flashmla.available
        assert backend.flashmla.describe(64, True) == "sparse MLA on Triton (FlashMLA not used: sgl-flash-mla is not installed)"
        out, _ = _attend(backend, 300 if kv.dtype == torch.bfloat16 else 1, 64)
        assert out.shape[1] == 64 * 512 and len(triton_calls) and triton_calls[-1][1] == kv.dtype


def test_triton_on_cpu_and_other_gpus(triton_calls, monkeypatch):
    monkeypatch.setenv(fm.SWITCH_ENV, "1")
    fm.flashmla_on.cache_clear()
    backend = _backend(_fp8_pool())
    assert not backend.flashmla.available and "SM90" in backend.flashmla.why_not
    _attend(backend, 1, 128)  # a shape FlashMLA would serve
    assert len(triton_calls) == 1
    fm.flashmla_on.cache_clear()


def test_flashmla_by_default_and_off_with_0(fake, triton_calls, monkeypatch):
    """SGLang's own install brings the wheel: FlashMLA serves unless SGLANG_GLM_FLASHMLA=0."""
    monkeypatch.delenv(fm.SWITCH_ENV)
    fm.flashmla_on.cache_clear()
    backend = _backend(_fp8_pool())
    assert backend.flashmla.available
    _attend(backend, 128, 64)  # a shape FlashMLA serves
    served = [c[0] for c in fake.calls if c[0] != "plan"]
    assert not triton_calls and served == ["decode"]
    monkeypatch.setenv(fm.SWITCH_ENV, "0")
    fm.flashmla_on.cache_clear()
    backend = _backend(_fp8_pool())
    assert backend.flashmla.describe(64, True) == (
        "sparse MLA on Triton (FlashMLA not used: switched off by SGLANG_GLM_FLASHMLA=0)")
    _attend(backend, 128, 64)
    assert len(triton_calls) == 1 and [c[0] for c in fake.calls if c[0] != "plan"] == served
    fm.flashmla_on.cache_clear()


def test_triton_without_legacy_kernels(on_sm90):
    on_sm90.setitem(sys.modules, "flash_mla", FakeFlashMLA(legacy=False))
    assert not fm.FlashMLA(torch.device("cpu")).available


@pytest.mark.parametrize("tokens, heads", [(65, 64), (512, 64), (1, 128), (64, 128)])
def test_fp8_pool_decodes_on_flashmla_with_its_layouts(fake, triton_calls, tokens, heads):
    kv = _fp8_pool()
    backend = _backend(kv)
    out, pool_rows = _attend(backend, tokens, heads)
    assert not triton_calls
    (plan_call,) = [c for c in fake.calls if c[0] == "plan"]
    _, lengths, q_per_head_k, h_k, h_q, is_fp8, topk, legacy = plan_call
    assert lengths.tolist() == [TOPK] * tokens and (q_per_head_k, h_k, h_q) == (heads, 1, heads)
    assert is_fp8 and topk == TOPK and legacy
    (_, q, k_cache, d_v, sched, kw) = [c for c in fake.calls if c[0] == "decode"][0]
    assert q.shape == (tokens, 1, heads, 576) and q.dtype == torch.bfloat16
    assert k_cache.shape == (POOL // 64, 64, 1, 656) and k_cache.data_ptr() == kv.data_ptr() and d_v == 512
    indices = kw["indices"]
    assert indices.shape == (tokens, 1, TOPK) and indices.dtype == torch.int32
    assert indices[0, 0, :-10].tolist() == pool_rows[:-10].tolist() and (indices[:, :, -10:] == -1).all()
    assert kw["is_fp8_kvcache"] is True and kw["use_legacy"] is True and kw["kv_format"] == "V32"
    assert kw["softmax_scale"] == 0.07
    assert sched.num_splits.shape == (tokens + 1,)  # the plan, on a fresh schedule object
    assert out.shape == (tokens, heads * 512) and out.dtype == torch.float32 and (out == 2).all()


def test_fp8_plans_are_made_once_per_shape(fake):
    backend = _backend(_fp8_pool())
    for _ in range(3):
        _attend(backend, 8, 128)
    assert len([c for c in fake.calls if c[0] == "plan"]) == 1
    decodes = [c for c in fake.calls if c[0] == "decode"]
    assert len({id(c[4]) for c in decodes}) == 3  # each call its own schedule object, the same plan tensors
    assert len({c[4].tile_scheduler_metadata.data_ptr() for c in decodes}) == 1


@pytest.mark.parametrize("tokens, heads", [(256, 64), (1024, 64), (300, 128)])
def test_bf16_pool_prefills_on_flashmla_with_its_layouts(fake, triton_calls, tokens, heads):
    kv = _bf16_pool()
    out, pool_rows = _attend(_backend(kv), tokens, heads)
    assert not triton_calls
    ((_, q, kv3, indices, scale, d_v, legacy, log2_lse),) = [c for c in fake.calls if c[0] == "prefill"]
    assert q.shape == (tokens, heads, 576) and q.dtype == torch.bfloat16
    assert kv3.shape == (POOL, 1, 576) and kv3.data_ptr() == kv.data_ptr()
    assert indices.shape == (tokens, 1, TOPK) and indices.dtype == torch.int32
    assert indices[-1, 0, :-10].tolist() == pool_rows[:-10].tolist() and (indices[:, :, -10:] == -1).all()
    assert (scale, d_v, legacy, log2_lse) == (0.07, 512, True, False)
    assert out.shape == (tokens, heads * 512) and (out == 3).all()


@pytest.mark.parametrize("kv, tokens, heads", [
    (_fp8_pool(), 513, 64), (_fp8_pool(), 1, 64), (_fp8_pool(), 64, 64), (_fp8_pool(), 1, 32), (_bf16_pool(), 255, 64), (_bf16_pool(), 1, 64), (_bf16_pool(), 512, 16),
])
def test_other_shapes_stay_on_triton(fake, triton_calls, kv, tokens, heads):
    out, _ = _attend(_backend(kv), tokens, heads)
    assert [c[0] for c in fake.calls] == [] and len(triton_calls) == 1
    assert triton_calls[0][0] == (tokens, heads, 576) and (out == 1).all()


def test_a_failing_flashmla_call_raises(fake, triton_calls):
    fake.fail = True
    with pytest.raises(RuntimeError, match="kernel failed"):
        _attend(_backend(_fp8_pool()), 1, 128)
    assert not triton_calls  # no silent fall-back to another kernel


def test_no_plan_is_made_inside_a_graph_capture(fake, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    flashmla = fm.FlashMLA(torch.device("cuda"))
    with pytest.raises(RuntimeError, match="before CUDA-graph capture"):
        flashmla._plan(4, 64, TOPK)


def test_start_up_line_and_plans(fake, caplog, monkeypatch):
    monkeypatch.setattr(tb, "_LOGGED", set())
    shapes = WarmUpShapes(heads=64, topk=TOPK, page=64, max_keys=POOL, num_sms=132, warp_specialized=False)
    with caplog.at_level(logging.INFO, logger=tb.__name__):
        for kv in (_fp8_pool(), _fp8_pool(), _bf16_pool()):
            _backend(kv)._prepare_flashmla(shapes)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["sparse MLA on FlashMLA for FP8 KV at 65-512 query rows, Triton otherwise (64 heads)",
                     "sparse MLA on FlashMLA for BF16 KV from 256 query rows, Triton below (64 heads)"]
    plans = [c for c in fake.calls if c[0] == "plan"]
    assert [len(c[1]) for c in plans] == list(range(65, 513))  # every FP8 row count served, once per process
    assert fm.flashmla_on(torch.device("cpu")).describe(32, True).startswith("sparse MLA on Triton")


def test_the_switch_takes_1_or_0_only(monkeypatch):
    for value, on, asked in [("1", True, True), ("0", False, False), ("", True, False)]:
        monkeypatch.setenv(fm.SWITCH_ENV, value)
        assert (fm.switched_on(), fm.asked_for()) == (on, asked)
    monkeypatch.setenv(fm.SWITCH_ENV, "true")  # would be neither
    with pytest.raises(ValueError, match="SGLANG_GLM_FLASHMLA='true'; use 0"):
        fm.switched_on()
