"""The GPU-only paths as far as their plumbing can be checked on CPU (tests/gpu runs them on the H200):
which indexer and KV pool each attention backend gets, which models the Triton backend refuses, and
how it lays out the batch for its kernels."""

from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from transformers import GlmMoeDsaConfig

from sglang_glm.hooks import memory, speculative
from sglang_glm.attention.kv_pool import TorchDSAKVPool
from sglang_glm.models.attention import GlmDsaIndexer, build_indexer
from sglang_glm.settings import GLM_INDEXER, SGLANG_INDEXER, GlmDsaSettings

BACKENDS = "sglang.srt.runtime_context.attention_backends"


def _config():
    return GlmMoeDsaConfig(
        num_hidden_layers=2, hidden_size=64, q_lora_rank=32, index_n_heads=32, index_head_dim=128,
        qk_rope_head_dim=64, index_topk=2048, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 8e6},
    )


def test_sglang_dsa_backend_gets_sglang_indexer_with_glm_geometry():
    from sglang_glm.attention.sglang_dsa import SGLangDsaIndexer

    captured = {}

    def fake_init(self, **kwargs):
        captured.update(kwargs)

    config = _config()
    settings = GlmDsaSettings.from_config(config, {}, ("dsa", "dsa"))
    assert settings.indexer == SGLANG_INDEXER
    with mock.patch("sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.__init__", fake_init):
        indexer = build_indexer(config, settings, 6, None, "model.layers.6.self_attn.indexer")
    assert isinstance(indexer, SGLangDsaIndexer)
    assert captured["layer_id"] == 6 and captured["index_topk"] == 2048
    assert (captured["index_n_heads"], captured["index_head_dim"], captured["rope_head_dim"]) == (32, 128, 64)
    assert captured["rope_theta"] == 8e6 and captured["rope_scaling"] is None
    assert captured["is_neox_style"] is False  # GLM's indexer rope is interleaved
    assert captured["prefix"] == "model.layers.6.self_attn.indexer"


def test_plugin_backends_get_the_plugin_indexer_with_its_layer_id():
    config = _config()
    for backends in [("glm_dsa_torch",) * 2, ("glm_dsa_triton",) * 2]:
        settings = GlmDsaSettings.from_config(config, {}, backends)
        assert settings.indexer == GLM_INDEXER
        indexer = build_indexer(config, settings, 1, None, "model.layers.1.self_attn.indexer")
        assert isinstance(indexer, GlmDsaIndexer) and indexer.layer_id == 1


def test_kv_pool_follows_the_attention_backend():
    def sglang_choice(configurator, *, kind, default):
        return default

    def configurator(architecture):
        return SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(architectures=[architecture])))

    glm, deepseek = configurator("GlmMoeDsaForCausalLM"), configurator("DeepseekV32ForCausalLM")
    for backends in [("glm_dsa_torch",) * 2, ("glm_dsa_triton",) * 2]:
        with mock.patch(BACKENDS, return_value=backends):
            assert memory._plugin_kv_pool(sglang_choice, glm, kind="dsa", default=object) is TorchDSAKVPool
            # another DSA model keeps SGLang's pool whatever the backend
            assert memory._plugin_kv_pool(sglang_choice, deepseek, kind="dsa", default=object) is object
    with mock.patch(BACKENDS, return_value=("dsa", "dsa")):
        assert memory._plugin_kv_pool(sglang_choice, glm, kind="dsa", default=object) is object
    with mock.patch(BACKENDS, return_value=("glm_dsa_torch",) * 2):
        assert memory._plugin_kv_pool(sglang_choice, glm, kind="mla", default=int) is int


def test_triton_geometry_is_the_kernels_and_glm5s():
    from glm_dsa_kernels import indexer, sparse_mla

    from sglang_glm.attention.backends import triton_geometry, triton_geometry_problem

    g = triton_geometry()
    assert (g["index_n_heads"], g["index_head_dim"]) == (indexer.N_HEADS, indexer.HEAD_DIM)
    assert (g["kv_lora_rank"] + g["qk_rope_head_dim"], g["kv_lora_rank"]) == (sparse_mla.D_QK, sparse_mla.D_V)
    assert triton_geometry_problem(_config()) is None


def test_triton_backend_refuses_other_geometries_at_launch():
    """The bundled model (latent 48, rope 32, indexer 8 x 48) stopped the H200 scheduler at its first
    forward with a bare kernel assert; the launch must refuse it by field, value and fix instead."""
    from serving import failed_launch

    mini = Path(__file__).resolve().parents[1] / "assets" / "glm-dsa-mini"
    log = failed_launch(mini, "--attention-backend", "glm_dsa_triton")
    for text in ("kv_lora_rank=48", "qk_rope_head_dim=32", "index_n_heads=8", "index_head_dim=48",
                 "kv_lora_rank=512", "--attention-backend glm_dsa_torch"):
        assert text in log, (text, log[-3000:])


def _runner(req_to_token, page_size=64, draft=False, **spec):
    """spec: speculative_algorithm / _eagle_topk / _num_draft_tokens server args (none by default)."""
    server_args = SimpleNamespace(speculative_algorithm=None, speculative_eagle_topk=None,
                                  speculative_num_draft_tokens=None)
    vars(server_args).update(spec)
    return SimpleNamespace(device="cpu", page_size=page_size,  # SGLang's ModelRunner holds a string
                           model_config=SimpleNamespace(context_len=req_to_token.shape[1]),
                           req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                           token_to_kv_pool=SimpleNamespace(check_served_by=lambda backend: None),
                           server_args=server_args, is_draft_worker=draft)


def _on_h200(build, *args):
    with mock.patch("torch.cuda.get_device_properties", return_value=SimpleNamespace(multi_processor_count=132)):
        return build(*args)


def _triton_backend(req_to_token, page_size=64, **runner):
    from sglang_glm.attention.triton_dsa_backend import TritonDSABackend

    return _on_h200(TritonDSABackend, _runner(req_to_token, page_size, **runner))


def test_triton_backend_batch_layout():
    req_to_token = torch.arange(4 * 256, dtype=torch.int32).view(4, 256) + 64
    backend = _triton_backend(req_to_token)
    # Request slots 2 and 0: 3 new tokens after 100 cached, and 2 new tokens from scratch.
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        batch_size=2,
        seq_lens=torch.tensor([103, 2]),
        seq_lens_cpu=torch.tensor([103, 2]),
        extend_seq_lens=torch.tensor([3, 2]),
        req_pool_indices=torch.tensor([2, 0]),
        positions=torch.tensor([100, 101, 102, 0, 1]),
    )
    backend.init_forward_metadata(batch)
    meta = backend.forward_metadata
    assert meta.query_batch.tolist() == [0, 0, 0, 1, 1]
    assert meta.query_req.tolist() == [2, 2, 2, 0, 0]
    assert meta.key_limit.tolist() == [101, 102, 103, 1, 2]
    # Slot row 2 starts at token 576 = page 9; pages are read through req_to_token.
    assert meta.page_table.tolist() == [[9, 10], [1, 2]]


def test_triton_backend_graph_buffers_verify_and_draft_steps():
    from sglang_glm.attention.triton_dsa_backend import TritonDSAMultiStepDraftBackend

    req_to_token = torch.arange(4 * 256, dtype=torch.int32).view(4, 256) + 64
    backend = _triton_backend(req_to_token)
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=16)
    fields = ("query_req", "query_batch", "key_limit", "page_table", "slot_table", "draft_start")
    buffers = [getattr(backend.graph_metadata, f).data_ptr() for f in fields]
    # Target verify, 3 draft tokens per request: fixed layout, written into the static buffers.
    verify = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=2, seq_lens=torch.tensor([10, 70]),
        req_pool_indices=torch.tensor([3, 1]), positions=torch.tensor([10, 11, 12, 70, 71, 72]),
        spec_info=SimpleNamespace(topk=1, custom_mask=None),
    )
    backend.init_forward_metadata_in_graph(verify)
    meta = backend.forward_metadata
    assert [getattr(meta, f).data_ptr() for f in fields] == buffers and meta.tree_mask is None
    assert meta.query_batch.tolist() == [0, 0, 0, 1, 1, 1]
    assert meta.query_req.tolist() == [3, 3, 3, 1, 1, 1]
    assert meta.key_limit.tolist() == [11, 12, 13, 71, 72, 73]
    assert meta.page_table.shape == (2, 4) and meta.page_table[0, :2].tolist() == [13, 14]

    # Draft steps 1.. of a chain: step i sees seq_lens + i + 1 keys, whatever positions say.
    draft = _on_h200(TritonDSAMultiStepDraftBackend, _runner(req_to_token), 1, 3)
    step_batch = SimpleNamespace(
        forward_mode=ForwardMode.DECODE, batch_size=2, seq_lens=torch.tensor([10, 70]),
        seq_lens_cpu=torch.tensor([10, 70]), req_pool_indices=torch.tensor([3, 1]), positions=torch.tensor([10, 70]),
    )
    draft.init_forward_metadata(step_batch)
    assert [b.forward_metadata.key_limit.tolist() for b in draft.attn_backends] == [[11, 71], [12, 72]]


def test_triton_backend_tree_verify_and_tree_draft_rows():
    from sglang_glm.attention.triton_dsa_backend import TritonDSAMultiStepDraftBackend

    req_to_token = torch.arange(3 * 64, dtype=torch.int32).view(3, 64) + 1000
    backend = _triton_backend(req_to_token, page_size=1)
    # Two requests (prefix 5 and 2), 3 draft slots each: slot 0 root, slot 1 child of 0, slot 2
    # child of 0 (a sibling of 1). EAGLE's FULL_MASK: per request a 3 x (prefix + 3) block.
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    mask = torch.cat([torch.cat([torch.ones(3, p, dtype=torch.bool), tree], 1).flatten() for p in (5, 2)])
    verify = SimpleNamespace(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=2, seq_lens=torch.tensor([5, 2]),
        req_pool_indices=torch.tensor([2, 0]), positions=torch.tensor([5, 6, 6, 2, 3, 3]),
        seq_lens_cpu=torch.tensor([5, 2]), spec_info=SimpleNamespace(topk=2, custom_mask=mask),
    )
    backend.init_forward_metadata(verify)
    meta = backend.forward_metadata
    assert meta.key_limit.tolist() == [6, 7, 8, 3, 4, 5]  # by draft slot, not by depth
    assert meta.draft_start.tolist() == [5, 5, 5, 2, 2, 2]
    assert meta.tree_mask.tolist() == tree.tolist() * 2
    assert meta.page_table[0, :5].tolist() == (req_to_token[2, :5]).tolist()  # page size 1: token slots

    # Tree draft step 1 (i = 1), 2 branches, 3 steps: branch j's drafts at prefix + 3 j + (0, 1).
    draft = _on_h200(TritonDSAMultiStepDraftBackend, _runner(req_to_token, page_size=1), 2, 3)
    step = SimpleNamespace(
        forward_mode=ForwardMode.DECODE, batch_size=1, seq_lens=torch.tensor([4]), seq_lens_cpu=torch.tensor([4]),
        req_pool_indices=torch.tensor([1]), positions=torch.tensor([4, 4]),
    )
    draft.init_forward_metadata(step)
    meta = draft.attn_backends[1].forward_metadata
    assert meta.key_limit.tolist() == [6, 6] and meta.query_req.tolist() == [0, 1]
    row = req_to_token[1]
    assert meta.slot_table[0, :6].tolist() == row[[0, 1, 2, 3, 4, 5]].tolist()
    assert meta.slot_table[1, :6].tolist() == row[[0, 1, 2, 3, 7, 8]].tolist()


def test_triton_backend_draft_extend_layout_eager_and_graph_replay():
    """Draft-extend (the MTP layer over each request's verified window) eagerly and as a graph replay.

    A replay hands the backend SGLang's view of the runner's static buffers: whole-capacity
    req_pool_indices and seq_lens, no positions, the batch padded to a captured size. Its real rows
    must be laid out as the eager pass lays them out; padded rows see key 0 only."""
    req_to_token = torch.arange(4 * 256, dtype=torch.int32).view(4, 256) + 64
    backend = _triton_backend(req_to_token)
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=16)
    window = SimpleNamespace(num_tokens_per_req=4)
    # Windows of 4 after 10 and 70 cached tokens: seq_lens counts the window, positions do not.
    eager = SimpleNamespace(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=2, seq_lens=torch.tensor([14, 74]),
        seq_lens_cpu=torch.tensor([14, 74]), req_pool_indices=torch.tensor([3, 1]),
        positions=torch.tensor([10, 11, 12, 13, 70, 71, 72, 73]), spec_info=window,
    )
    backend.init_forward_metadata(eager)
    want = backend.forward_metadata
    assert want.key_limit.tolist() == (eager.positions + 1).tolist()
    assert want.query_req.tolist() == [3] * 4 + [1] * 4 and want.query_batch.tolist() == [0] * 4 + [1] * 4

    replay = SimpleNamespace(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=3, seq_lens=torch.tensor([14, 74, 1, 1]),
        req_pool_indices=torch.tensor([3, 1, 0, 0]), spec_info=window,
    )
    backend.init_forward_metadata_in_graph(replay)
    got = backend.forward_metadata
    assert got.key_limit.data_ptr() == backend.graph_metadata.key_limit.data_ptr()
    assert got.key_limit.tolist() == want.key_limit.tolist() + [1] * 4
    assert got.query_req.tolist() == want.query_req.tolist() + [0] * 4
    assert got.page_table.shape[0] == 3 and got.page_table[:2, :2].tolist() == want.page_table[:, :2].tolist()

    widened = SimpleNamespace(**{**vars(eager), "positions": torch.arange(10)})
    with pytest.raises(ValueError, match="fixed windows only"):
        backend.init_forward_metadata(widened)


def test_graph_served_modes_are_laid_out_inside_the_graph():
    """Decode, target verify, draft-extend and the draft steps lay their batch out in
    `init_forward_metadata_in_graph`, which SGLang records into the captured graph: a replay then
    refills the static buffers from the runner's static req_pool_indices / seq_lens on the GPU, and
    the host's `init_forward_metadata_out_graph` before the replay does nothing. Simulated here: the
    capture runs the in-graph call on static inputs (seq_lens, req_pool_indices, positions: the
    runners' buffers), the replay writes new inputs into them, calls
    out_graph (no buffer may change), then runs the recorded call again; the layout must then equal
    the eager one of the new batch. Prefill (extend) stays laid out on the host."""
    from sglang_glm.attention.triton_dsa_backend import TritonDSAMultiStepDraftBackend

    req_to_token = torch.arange(4 * 256, dtype=torch.int32).view(4, 256) + 64
    fields = ("query_req", "query_batch", "key_limit", "page_table", "draft_start")

    def snapshot(meta):
        return [getattr(meta, f).clone() for f in fields]

    def batch(mode, seq_lens, req, per_request, **kw):
        seq_lens, req = torch.tensor(seq_lens), torch.tensor(req)
        positions = (seq_lens[:, None] - (per_request if mode.is_draft_extend_v2() else 0)
                     + torch.arange(per_request)).flatten()
        return SimpleNamespace(forward_mode=mode, batch_size=len(req), seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
                               req_pool_indices=req, positions=positions, **kw)

    cases = [
        (ForwardMode.DECODE, 1, {}),
        (ForwardMode.TARGET_VERIFY, 4, {"spec_info": SimpleNamespace(topk=1, custom_mask=None)}),
        (ForwardMode.DRAFT_EXTEND_V2, 4, {"spec_info": SimpleNamespace(num_tokens_per_req=4)}),
    ]
    for mode, per_request, kw in cases:
        backend = _triton_backend(req_to_token)
        backend.init_cuda_graph_state(max_bs=4, max_num_tokens=16)
        static = batch(mode, [10, 70], [3, 1], per_request, **kw)
        backend.init_forward_metadata_out_graph(static, in_capture=True)
        backend.init_forward_metadata_in_graph(static)  # recorded into the graph
        # The next replay: SGLang writes the new batch into the static inputs, then prepares.
        new = batch(mode, [130, 20], [0, 2], per_request, **kw)
        for name in ("seq_lens", "req_pool_indices", "positions"):
            getattr(static, name).copy_(getattr(new, name))
        before = snapshot(backend.graph_metadata)
        backend.init_forward_metadata_out_graph(static)
        assert all(torch.equal(a, b) for a, b in zip(before, snapshot(backend.graph_metadata))), mode
        backend.init_forward_metadata_in_graph(static)  # the graph replays
        got = backend.forward_metadata
        backend.init_forward_metadata(new)
        want = backend.forward_metadata
        assert got.key_limit.tolist() == want.key_limit.tolist(), mode
        assert got.query_req.tolist() == want.query_req.tolist(), mode
        pages = want.page_table.shape[1]
        assert got.page_table[:, :pages].tolist() == want.page_table.tolist(), mode

    draft = _on_h200(TritonDSAMultiStepDraftBackend, _runner(req_to_token), 1, 3)
    draft.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    static = batch(ForwardMode.DECODE, [10, 70], [3, 1], 1)
    draft.init_forward_metadata_out_graph(static, in_capture=True)
    draft.init_forward_metadata_in_graph(static)
    static.seq_lens.copy_(torch.tensor([40, 7]))
    before = [snapshot(b.graph_metadata) for b in draft.attn_backends]
    draft.init_forward_metadata_out_graph(static)
    assert all(torch.equal(x, y) for b, s in zip(draft.attn_backends, before)
               for x, y in zip(s, snapshot(b.graph_metadata)))
    draft.init_forward_metadata_in_graph(static)
    assert [b.forward_metadata.key_limit.tolist() for b in draft.attn_backends] == [[41, 8], [42, 9]]

    prefill = _triton_backend(req_to_token)
    prefill.init_cuda_graph_state(max_bs=4, max_num_tokens=16)
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1, seq_lens=torch.tensor([3]),
                             seq_lens_cpu=torch.tensor([3]), extend_seq_lens=torch.tensor([3]),
                             req_pool_indices=torch.tensor([2]), positions=torch.tensor([0, 1, 2]))
    prefill.init_forward_metadata_out_graph(extend)
    assert prefill.forward_metadata.key_limit.tolist() == [1, 2, 3]


def test_chain_target_offers_sglang_an_unread_qlen_only_verify_mask():
    """A chain's verify reads no tree mask: the target hands SGLang an unread QLEN_ONLY one (so SGLang skips
    filling a full mask each round and takes its chain-tree path); a tree target, whose verify reads the
    mask, and the draft worker's backends offer none."""
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    req_to_token = torch.zeros(8, 256, dtype=torch.int32)
    chain = dict(speculative_algorithm="EAGLE", speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    target = _triton_backend(req_to_token, **chain)
    assert target.verify_mask is None  # sized by the captured batch: none before the graphs' state
    target.init_cuda_graph_state(max_bs=8, max_num_tokens=32)
    mask = target.verify_mask
    assert mask.mode == TreeMaskMode.QLEN_ONLY and not mask.is_read
    assert mask.max_bs == 8 and mask.buffer.numel() == 8 * 4 * 4 and mask.fits(8) and not mask.fits(9)

    tree = dict(chain, speculative_eagle_topk=2, speculative_num_draft_tokens=6)
    draft = _triton_backend(req_to_token, draft=True, **chain)
    for backend in (_triton_backend(req_to_token, page_size=1, **tree), draft, _triton_backend(req_to_token)):
        backend.init_cuda_graph_state(max_bs=8, max_num_tokens=32)
        assert backend.verify_mask is None


def test_draft_extend_graph_hook_acts_for_the_plugin_backend_only():
    from sglang_glm.attention.triton_dsa_backend import TritonDSABackend

    plugin_backend = _triton_backend(torch.zeros(2, 64, dtype=torch.int32))
    captured = []

    class Runner:
        def __init__(self, worker):
            captured.append(worker)

    def worker(backend):
        return SimpleNamespace(cuda_graph_runner_for_draft_extend=None, draft_extend_attn_backend=backend,
                               _specialized_graph_time_usage={})

    with mock.patch("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner",
                    Runner), \
            mock.patch("sglang.srt.model_executor.cuda_graph_config.check_cuda_graph_backend", return_value=False):
        other = worker(object())
        speculative._capture_draft_extend_graph(None, other)
        assert other.cuda_graph_runner_for_draft_extend is None and not captured
        ours = worker(plugin_backend)
        speculative._capture_draft_extend_graph(None, ours)
        assert isinstance(ours.cuda_graph_runner_for_draft_extend, Runner) and captured == [ours]
        assert "draft_extend" in ours._specialized_graph_time_usage
    assert isinstance(plugin_backend, TritonDSABackend) and TritonDSABackend.needs_cpu_seq_lens is False


def test_sglang_in_tree_mtp_seed_is_off_for_the_plugin_draft_only():
    from sglang_glm.models.glm_dsa_nextn import GlmMoeDsaForCausalLMNextN

    def worker(model):
        return SimpleNamespace(draft_runner=SimpleNamespace(model=model), index_share_for_mtp_iteration=True,
                               seed_dsa_topk_from_draft_extend=True, dsa_seed_topk_width=2048)

    ours = worker(object.__new__(GlmMoeDsaForCausalLMNextN))
    speculative._plugin_draft_shares_its_own_topk(None, ours)
    assert not ours.seed_dsa_topk_from_draft_extend and not ours.index_share_for_mtp_iteration
    other = worker(object())
    speculative._plugin_draft_shares_its_own_topk(None, other)
    assert other.seed_dsa_topk_from_draft_extend and other.dsa_seed_topk_width == 2048
