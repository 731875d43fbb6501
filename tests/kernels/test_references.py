"""The plain-PyTorch references against naive loops and the layout round trips (CPU, fast)."""

import torch

from glm_dsa_kernels.indexer import dequantize_index_k, indexer_logits_ref, quantize_index_k_fp8
from glm_dsa_kernels.pool_rows import positions_to_pool_rows_ref
from glm_dsa_kernels.sparse_mla import dequantize_kv_fp8, quantize_kv_fp8, sparse_mla_fwd_ref
from glm_dsa_kernels.topk_compact import compact_topk_rows_ref
from glm_dsa_kernels.topk_select import topk_positions_ref


def test_sparse_mla_ref_matches_loop():
    g = torch.Generator().manual_seed(1)
    T, H, P, topk = 3, 4, 40, 8
    q = torch.randn(T, H, 576, generator=g, dtype=torch.float64)
    kv = torch.randn(P, 576, generator=g, dtype=torch.float64)
    idx = torch.randint(0, P, (T, topk), generator=g, dtype=torch.int32)
    idx[1, 5:] = -1
    idx[2] = -1
    out, lse = sparse_mla_fwd_ref(q, kv, idx, 0.1)
    for t in range(T):
        rows = idx[t][idx[t] >= 0].long()
        for h in range(H):
            if rows.numel() == 0:
                assert lse[t, h] == float("-inf") and out[t, h].abs().max() == 0
                continue
            s = kv[rows] @ q[t, h] * 0.1
            p = torch.softmax(s, 0)
            torch.testing.assert_close(out[t, h], p @ kv[rows, :512])
            torch.testing.assert_close(lse[t, h], torch.logsumexp(s, 0))


def test_fp8_kv_layout_round_trip():
    kv = torch.randn(16, 576).bfloat16()
    packed = quantize_kv_fp8(kv)
    assert packed.shape == (16, 656) and packed.dtype == torch.uint8
    back = dequantize_kv_fp8(packed)
    assert torch.equal(back[:, 512:], kv[:, 512:].float())  # rope stays bf16
    assert ((back[:, :512] - kv[:, :512].float()).norm() / kv[:, :512].float().norm()) < 0.05


def test_index_k_fp8_layout_round_trip():
    k = torch.randn(3, 64, 128).bfloat16()
    packed = quantize_index_k_fp8(k)
    assert packed.shape == (3, 64 * 132)
    assert ((dequantize_index_k(packed) - k.float()).norm() / k.float().norm()) < 0.05


def test_indexer_logits_ref_matches_loop():
    g = torch.Generator().manual_seed(2)
    k = torch.randn(5, 64, 128, generator=g).bfloat16()
    page_table = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    q = torch.randn(3, 32, 128, generator=g).bfloat16()
    w = torch.randn(3, 32, generator=g)
    query_req = torch.tensor([0, 1, 1], dtype=torch.int32)
    key_limit = torch.tensor([100, 1, 128], dtype=torch.int32)
    got = indexer_logits_ref(q, w, k, page_table, query_req, key_limit)
    for t in range(3):
        for j in (0, 63, 64, 99, 127):
            if j >= key_limit[t]:
                assert got[t, j] == float("-inf")
                continue
            key = k[page_table[query_req[t], j // 64], j % 64].double()
            want = (torch.relu(q[t].double() @ key) * w[t].double()).sum()
            torch.testing.assert_close(got[t, j], want)


def test_topk_rule_ties_and_padding():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, -0.0, 0.0], [5.0, 4.0, 0, 0, 0, 0, 0]])
    key_limit = torch.tensor([7, 2], dtype=torch.int32)
    got = topk_positions_ref(logits, key_limit, 3)
    assert got.tolist() == [[1, 2, 4], [0, 1, -1]]
    got = topk_positions_ref(logits, key_limit, 5)  # ties at the cut: lower position wins
    assert got[0].tolist() == [0, 1, 2, 3, 4]


def test_compaction_refs():
    rows = torch.arange(10 * 4, dtype=torch.int32).view(10, 4)
    cu = torch.tensor([0, 3, 4, 10], dtype=torch.int32)
    got = compact_topk_rows_ref(rows, cu, torch.tensor([2, 1, 6], dtype=torch.int32))
    assert got[:, 0].tolist() == [4, 12, 36]


def test_positions_to_pool_rows():
    req_to_token = torch.tensor([[7, 8, 9], [20, 21, 22]], dtype=torch.int32)
    pos = torch.tensor([[2, 0, -1], [1, -1, -1]], dtype=torch.int32)
    got = positions_to_pool_rows_ref(pos, req_to_token, torch.tensor([1, 0], dtype=torch.int32))
    assert got.tolist() == [[22, 20, -1], [8, -1, -1]]
