"""The absorbed-MLA projections around sparse attention, and bench_mla_glue.py's ways of doing them.

`absorbed_query` and `heads_output` write through strided views (the bmm's `out=` is a transpose
of a slice); a wrong stride or slice would put numbers in the wrong columns, which a float64
computation of the formula catches. The benchmark's other ways must compute the same thing, or
its GPU table compares unlike work.
"""

import sys
from pathlib import Path

import pytest
import torch

from sglang_glm.models.attention import absorbed_query, heads_output

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "kernels"))
import bench_mla_glue  # noqa: E402


@pytest.mark.parametrize("rows", [1, 7])
def test_projections_match_the_formula_in_float64(rows):
    x = bench_mla_glue.inputs(rows, "cpu", dtype=torch.float64, seed=rows)
    want_q = torch.einsum("thn,hnc->thc", x["q_nope"], x["w_kc"])
    got_q = absorbed_query(x["q_nope"], x["q_pe"], x["w_kc"])
    assert got_q.shape == (rows, bench_mla_glue.HEADS, bench_mla_glue.LATENT + bench_mla_glue.ROPE)
    torch.testing.assert_close(got_q[..., : bench_mla_glue.LATENT], want_q, rtol=1e-12, atol=1e-12)
    assert torch.equal(got_q[..., bench_mla_glue.LATENT :], x["q_pe"])
    want_o = torch.einsum("thc,hcv->thv", x["out"], x["w_vc"]).reshape(rows, -1)
    torch.testing.assert_close(heads_output(x["out"], x["w_vc"]), want_o, rtol=1e-12, atol=1e-12)


def test_every_benchmarked_way_computes_the_same_thing():
    x = bench_mla_glue.inputs(5, "cpu", dtype=torch.float32)
    errors = bench_mla_glue.check(x, bench_mla_glue.query_ways(), bench_mla_glue.output_ways())
    assert set(errors) == {"query absorbed_query", "query einsum_cat", "query bmm_cat",
                           "output heads_output", "output einsum_reshape"}
    assert max(errors.values()) < 1e-5, errors
