"""MTP pieces without an engine: top-k compaction and the shared table, recycling policy,
acceptance statistics, start-up validation, the EAGLE CPU ops, the draft's checkpoint mapping."""

import pytest
import torch

from sglang_glm.mtp.acceptance import AcceptanceStats
from sglang_glm.mtp.index_share import SharedTopkTable, compact_last_accepted
from sglang_glm.mtp.recycle import POST_NORM, PRE_NORM, RecyclePolicyError, resolve_recycle_policy
from sglang_glm.launch_policy import UnsupportedSpecConfig, check_spec_args


# ---- index share: compaction to each request's last accepted token ---------------------------


def _rows_for(batch_rows: list[int], topk: int) -> torch.Tensor:
    """Row r holds values 1000 * r + (0..topk-1): every row is recognisable."""
    n = sum(batch_rows)
    return (torch.arange(n)[:, None] * 1000 + torch.arange(topk)[None, :]).to(torch.int32)


def test_compaction_picks_last_accepted_row_with_mixed_accept_lengths():
    # Draft-extend after verify: 6 rows per request (num_draft_tokens), accepted 1, 6, 3, 2.
    num_draft, accept = 6, torch.tensor([1, 6, 3, 2])
    rows = _rows_for([num_draft] * 4, topk=8)
    start = torch.arange(0, 4 * num_draft, num_draft)
    out = compact_last_accepted(rows, start, accept)
    want_rows = [0 * 6 + 0, 1 * 6 + 5, 2 * 6 + 2, 3 * 6 + 1]
    assert out.tolist() == rows[want_rows].tolist()
    # No request reads another request's rows.
    for b, r in enumerate(want_rows):
        assert start[b] <= r < start[b] + num_draft


def test_compaction_ragged_prefill_rows_and_kernel_reference():
    # After prefill: ragged extend lengths, the last prompt token of each request.
    lens = torch.tensor([5, 1, 9, 3])
    cu = torch.zeros(5, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    rows = _rows_for(lens.tolist(), topk=4)
    out = compact_last_accepted(rows, cu[:-1], lens)
    assert out[:, 0].tolist() == [4000, 5000, 14000, 17000]
    from glm_dsa_kernels.topk_compact import compact_topk_rows_ref

    accept = torch.tensor([2, 1, 7, 3], dtype=torch.int32)
    assert torch.equal(compact_last_accepted(rows, cu[:-1], accept), compact_topk_rows_ref(rows, cu, accept))


def test_shared_table_per_request_slot_and_tree_rows():
    table = SharedTopkTable(num_slots=6, topk=3)
    table.store(torch.tensor([5, 1]), torch.tensor([[1, 2, 3], [4, 5, 6]]))
    table.store(torch.tensor([0]), torch.tensor([[7, 8, 9]]))  # a later draft-extend, other request
    # A draft batch mixing requests from different draft-extend passes, topk 2 rows each.
    got = table.rows_for_draft(torch.tensor([1, 0, 5]), per_request=2)
    assert got.tolist() == [[4, 5, 6], [4, 5, 6], [7, 8, 9], [7, 8, 9], [1, 2, 3], [1, 2, 3]]
    # A slot never written holds no keys (-1), never another request's positions.
    assert table.rows_for_draft(torch.tensor([3])).tolist() == [[-1, -1, -1]]


# ---- recycling policy ---------------------------------------------------------------------------


class _Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_recycle_policy_default_and_overrides():
    assert resolve_recycle_policy(_Cfg(model_type="glm_moe_dsa")) == POST_NORM
    assert resolve_recycle_policy(_Cfg(model_type="deepseek_v3")) == PRE_NORM
    assert resolve_recycle_policy(_Cfg(model_type="glm_moe_dsa", mtp_recycle_hidden="pre_norm")) == PRE_NORM
    assert resolve_recycle_policy(_Cfg(model_type="glm_moe_dsa"), {"mtp_recycle_hidden": "pre_norm"}) == PRE_NORM
    with pytest.raises(RecyclePolicyError, match="post_norm"):
        resolve_recycle_policy(_Cfg(model_type="glm_moe_dsa", mtp_recycle_hidden="postnorm"))


# ---- acceptance statistics ----------------------------------------------------------------------


def test_per_position_acceptance_from_histogram():
    s = AcceptanceStats()
    s.add_meta_info({"spec_correct_drafts_histogram": [1, 0, 1, 1, 0, 4]})
    s.add_histogram([0, 1])
    # Summed histogram [1, 1, 1, 1, 0, 4]: 8 rounds; >= k accepted: 7, 6, 5, 4, 4.
    assert s.rounds == 8
    assert s.per_position(5) == [7 / 8, 6 / 8, 5 / 8, 4 / 8, 4 / 8]
    assert s.mean_accept_length == pytest.approx(1 + (1 + 2 + 3 + 20) / 8)
    assert s.mean_accept_length == pytest.approx(1 + sum(s.per_position(5)))
    # Accepted drafts / drafted tokens: 26 of 8 rounds x 5 drafts.
    assert s.accept_rate(5) == pytest.approx(26 / 40)


# ---- start-up validation ------------------------------------------------------------------------


def _spec(**kw):
    base = dict(speculative_algorithm="EAGLE", speculative_num_steps=5, speculative_eagle_topk=1,
                speculative_num_draft_tokens=6, page_size=64)
    base.update(kw)
    return _Cfg(**base)


def test_validation_accepts_issue_flags_and_trees():
    for on_cpu in (True, False):
        check_spec_args(_spec(), on_cpu=on_cpu)
        check_spec_args(_Cfg(speculative_algorithm=None), on_cpu=on_cpu)
    check_spec_args(_spec(speculative_eagle_topk=4, speculative_num_draft_tokens=8, page_size=1), on_cpu=True)
    # SGLang's GPU path verifies sampled requests itself.
    check_spec_args(_spec(speculative_use_rejection_sampling=True), on_cpu=False)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(speculative_algorithm="EAGLE3"), "EAGLE or NEXTN"),
        (dict(enable_multi_layer_eagle=True), "one MTP layer"),
        (dict(speculative_use_rejection_sampling=True), "greedily"),
        (dict(speculative_eagle_topk=2, speculative_num_draft_tokens=8), "--page-size 1"),
        (dict(speculative_num_draft_tokens=4), "num_steps \\+ 1 = 6"),
    ],
)
def test_validation_refuses_unsupported_combinations(kw, message):
    with pytest.raises(UnsupportedSpecConfig, match=message):
        check_spec_args(_spec(**kw), on_cpu=True)


def test_validation_tree_drafts_on_cuda_need_a_bfloat16_cache():
    tree = dict(speculative_eagle_topk=2, speculative_num_draft_tokens=8, page_size=1)
    check_spec_args(_spec(**tree), on_cpu=False)
    with pytest.raises(UnsupportedSpecConfig, match="64-token pages"):
        check_spec_args(_spec(kv_cache_dtype="fp8_e4m3", **tree), on_cpu=False)


# ---- EAGLE CPU ops ------------------------------------------------------------------------------


def test_chain_tree_build_and_greedy_verify_ops():
    from sglang_glm.cpu_compat import ops

    bs, steps, n = 2, 3, 4
    parent_list = torch.zeros((bs, 0), dtype=torch.int64)  # unused when every parent is the root chain
    # topk 1 chain: selected index i -> parent i (i // topk), SGLang's topk-1 chain layout.
    selected = torch.tensor([[0, 1, 2], [0, 1, 2]])
    parent_list = torch.tensor([[-1, 0, 1, 2], [-1, 0, 1, 2]])
    seq_lens = torch.tensor([10, 3])
    mask = torch.ones(bs * n * n, dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.int64)
    r_idx, r_next, r_sib = torch.full((3, bs, n), -1, dtype=torch.long)
    ops.build_tree_kernel_efficient_cpu(parent_list, selected, seq_lens, mask, positions, r_idx, r_next,
                                        r_sib, 1, steps, n, 1)
    assert positions.tolist() == [10, 11, 12, 13, 3, 4, 5, 6]
    assert r_idx.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert r_next.tolist() == [[1, 2, 3, -1]] * 2
    assert torch.equal(mask.view(bs, n, n), torch.ones(n, n, dtype=torch.bool).tril().expand(bs, n, n))

    # Greedy verify: request 0 accepts 2 drafts, request 1 none.
    candidates = torch.tensor([[7, 8, 9, 5], [1, 2, 3, 4]])
    target = torch.tensor([[8, 9, 6, 0], [9, 9, 9, 9]])
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
    accept_num = torch.empty(bs, dtype=torch.int32)
    ops.verify_tree_greedy_cpu(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
                               candidates=candidates, retrive_index=r_idx, retrive_next_token=r_next,
                               retrive_next_sibling=r_sib, target_predict=target)
    assert accept_num.tolist() == [2, 0]
    assert accept_index.tolist() == [[0, 1, 2, -1], [4, -1, -1, -1]]
    assert predicts.tolist() == [8, 9, 6, 0, 9, 0, 0, 0]


def test_cache_slot_ops():
    from sglang_glm.cpu_compat import ops

    req_to_token = torch.arange(40, dtype=torch.int32).view(4, 10)
    out = torch.empty(6, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous_cpu(torch.tensor([2, 0]), req_to_token, torch.tensor([3, 7]),
                                               out, 10, 1, 3)
    assert out.tolist() == [23, 24, 25, 7, 8, 9]
    gathered = torch.empty(5, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(torch.tensor([1, 3]), req_to_token, torch.tensor([2, 0]),
                                     torch.tensor([4, 3]), gathered, 10)
    assert gathered.tolist() == [12, 13, 30, 31, 32]
    ops.assign_req_to_token_pool_cpu(torch.tensor([0]), req_to_token, torch.tensor([1]), torch.tensor([3]),
                                     torch.tensor([100, 101]), 10)
    assert req_to_token[0, :4].tolist() == [0, 100, 101, 3]
    bonus = torch.empty(2, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.tensor([2, 3]), bonus, 3)
    assert bonus.tolist() == [6, 10]
    acc = torch.zeros(4, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(torch.tensor([[0, 2, -1], [3, -1, -1]]), torch.tensor([50, 51, 52, 53]), acc)
    assert acc.tolist() == [50, 52, 53, 0]


# ---- draft checkpoint mapping -------------------------------------------------------------------


def test_draft_reads_only_the_mtp_layer_and_builds_a_full_moe_layer():
    from sglang_glm.models.glm_dsa_nextn import GlmMoeDsaForCausalLMNextN, _mtp_layer_config

    fake = GlmMoeDsaForCausalLMNextN.__new__(GlmMoeDsaForCausalLMNextN)
    fake.config = _Cfg(num_hidden_layers=8)
    name = fake._draft_name
    assert name("model.layers.8.self_attn.indexer.wk.weight") == "model.decoder.self_attn.indexer.wk.weight"
    assert name("model.layers.8.mlp.experts.3.up_proj.weight") == "model.decoder.mlp.experts.3.up_proj.weight"
    assert name("model.layers.8.eh_proj.weight") == "model.eh_proj.weight"
    assert name("model.layers.8.shared_head.norm.weight") == "model.shared_head.norm.weight"
    assert name("model.layers.8.shared_head.head.weight") is None  # the target's lm head is shared
    assert name("model.layers.8.embed_tokens.weight") is None
    assert name("model.layers.7.self_attn.q_a_proj.weight") is None  # a target layer
    assert name("lm_head.weight") is None
    # The draft layer is layer 0 of its own model; its MLP is MoE like GLM's MTP layer, even though
    # the target's layer 0 is dense (first_k_dense_replace).
    cfg = _mtp_layer_config(_Cfg(n_routed_experts=8, first_k_dense_replace=3, mlp_layer_types=["dense"] * 3 + ["sparse"] * 5))
    assert cfg.mlp_layer_types == ["sparse"] and cfg.first_k_dense_replace == 0


def test_finished_request_report_meta_info_log_and_counters(caplog):
    import logging

    from prometheus_client import REGISTRY

    from sglang_glm.mtp.acceptance import report_finished_request

    meta = {"id": "r1", "spec_correct_drafts_histogram": [1, 0, 2, 3]}
    before = REGISTRY.get_sample_value("sglang_glm:spec_verify_rounds_total") or 0.0
    before_p3 = REGISTRY.get_sample_value("sglang_glm:spec_draft_accepted_total", {"position": "3"}) or 0.0
    with caplog.at_level(logging.INFO):
        report_finished_request(meta, 3, enable_metrics=True, log=logging.getLogger("mtp-test"))
    assert meta["spec_accept_per_position"] == [5 / 6, 5 / 6, 3 / 6]
    assert "MTP acceptance of request r1" in caplog.text and "p3=0.50" in caplog.text
    assert REGISTRY.get_sample_value("sglang_glm:spec_verify_rounds_total") == before + 6
    assert REGISTRY.get_sample_value("sglang_glm:spec_draft_accepted_total", {"position": "3"}) == before_p3 + 3
