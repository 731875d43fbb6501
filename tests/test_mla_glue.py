"""The absorbed-MLA glue around sparse attention: RoPE, the query rows, the output projection; and
bench_mla_glue.py's ways of doing them.

`rotate` replaced SGLang's rotary call (a `.contiguous()` copy rotated, then a cat) with the plugin's
own formula over strided views; SGLang's `RotaryEmbedding.forward_native` is the oracle for it, for
both of GLM's rope layouts. `absorbed_query_and_key` and `heads_output` write through strided views (the
bmm's `out=` is a transpose of a slice); a wrong stride or slice would put numbers in the wrong
columns, which a float64 computation of the formula catches. The benchmark's other ways must compute
the same thing, or its GPU table compares unlike work.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_glm.models.attention import _rope, absorbed_query_and_key, heads_output, rotate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "kernels"))
import bench_mla_glue  # noqa: E402

CONFIG = SimpleNamespace(rope_parameters={"rope_theta": 8e6, "rope_type": "default"}, max_position_embeddings=4096)


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("width", [64, 128])  # MLA's rope columns alone; an index head, rope first
def test_rotate_matches_sglangs_rotary(interleave, width):
    rotary = _rope(CONFIG, 64, interleave)
    g = torch.Generator().manual_seed(width + interleave)
    rows = torch.randn(9, 5, width + 192, generator=g)
    q, k = rows[:, :4, 192:], rows[:, 4:, 192:]  # strided views, as the model hands them over
    positions = torch.tensor([0, 1, 5, 77, 1000, 4095, 3, 3, 2048])
    got_q, got_k = rotate(rotary, positions, q, k, torch.full_like(q, float("nan")), torch.full_like(k, float("nan")))
    want_q, want_k = rotary.forward_native(positions, q[..., :64].contiguous(), k[..., :64].contiguous())
    assert torch.equal(got_q[..., :64], want_q.view(9, 4, 64)) and torch.equal(got_k[..., :64], want_k.view(9, 1, 64))
    assert torch.equal(got_q[..., 64:], q[..., 64:]) and torch.equal(got_k[..., 64:], k[..., 64:])
    assert not torch.equal(got_q[..., :64], q[..., :64]) and not torch.equal(got_k[..., :64], k[..., :64])


def test_a_rope_the_cache_cannot_express_stops_the_build():
    config = SimpleNamespace(max_position_embeddings=4096, rope_parameters={
        "rope_theta": 8e6, "rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match=r"rope_parameters .*'dynamic'.*DynamicNTKScalingRotaryEmbedding.*rope_type is default or deepseek_yarn"):
        _rope(config, 64, True)


@pytest.mark.parametrize("rows", [1, 7])
def test_projections_match_the_formula_in_float64(rows):
    x = bench_mla_glue.inputs(rows, "cpu", dtype=torch.float64, seed=rows)
    rotary = bench_mla_glue.rotary("cpu")
    want_q = torch.einsum("thn,hnc->thc", x["q_nope"], x["w_kc"])
    got_q, got_k = absorbed_query_and_key(x["q_nope"], x["q_pe"], x["k_pe"], x["w_kc"], rotary, x["positions"])
    assert got_q.shape == (rows, bench_mla_glue.HEADS, bench_mla_glue.LATENT + bench_mla_glue.ROPE)
    torch.testing.assert_close(got_q[..., : bench_mla_glue.LATENT], want_q, rtol=1e-12, atol=1e-12)
    want_pe, want_k = rotate(rotary, x["positions"], x["q_pe"], x["k_pe"], torch.empty_like(x["q_pe"]),
                             torch.empty_like(x["k_pe"]))
    assert torch.equal(got_q[..., bench_mla_glue.LATENT :], want_pe) and torch.equal(got_k, want_k)
    assert got_k.is_contiguous() and got_k.shape == (rows, 1, bench_mla_glue.ROPE)
    want_o = torch.einsum("thc,hcv->thv", x["out"], x["w_vc"]).reshape(rows, -1)
    torch.testing.assert_close(heads_output(x["out"], x["w_vc"]), want_o, rtol=1e-12, atol=1e-12)


def test_every_benchmarked_way_computes_the_same_thing():
    errors = bench_mla_glue.check(lambda: bench_mla_glue.inputs(5, "cpu", dtype=torch.float32), bench_mla_glue.rotary("cpu"),
                                  bench_mla_glue.query_ways(), bench_mla_glue.output_ways())
    assert set(errors) == {"query plugin", "query einsum_cat", "query bmm_into", "query sglang_style",
                           "output heads_output", "output einsum_reshape"}
    assert max(errors.values()) < 1e-5, errors
