"""round_bytes.py: the bytes a plain step and an EAGLE round read, against sums done by hand."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "serving" / "gpu"))
import round_bytes as rb  # noqa: E402


@pytest.fixture(scope="module")
def glm52(tmp_path_factory):
    out = tmp_path_factory.mktemp("glm52") / "m"
    subprocess.run([sys.executable, str(ROOT / "benchmarks/serving/gpu/make_glm52_shaped.py"), str(out)],
                   check=True, capture_output=True)
    return json.loads((out / "config.json").read_text())


def test_distinct_experts():
    assert rb.distinct_experts(1, 256, 8) == pytest.approx(8)
    assert rb.distinct_experts(4, 256, 8) == pytest.approx(30.53, abs=0.01)  # a 4-token verify, uniform routing
    assert rb.distinct_experts(10_000, 256, 8) == pytest.approx(256)


def test_a_shared_attention_layer_by_hand(glm52):
    # q_a 6144x2048, q_b 2048x(64x256), kv_a 6144x576, o_proj (64x256)x6144 in FP8; w_kc + w_vc in BF16
    weights = 6144 * 2048 + 2048 * 64 * 256 + 6144 * 576 + 64 * 256 * 6144 + 2 * 64 * 512 * (192 + 256)
    kv = 2048 * 656  # one request's top-k rows at 4K context
    dense = 3 * 6144 * 12288
    assert rb.layer_bytes(glm52, 1, 1, 1, 4096, dense=True, full=False) == weights + kv + dense
    # TP 8 splits heads and the MLP, not q_a / kv_a
    split = 6144 * 2048 + 2048 * 8 * 256 + 6144 * 576 + 8 * 256 * 6144 + 2 * 8 * 512 * (192 + 256)
    assert rb.layer_bytes(glm52, 8, 1, 1, 4096, dense=True, full=False) == split + kv + dense // 8


def test_the_round_reads_more_experts_and_heads_than_a_step(glm52):
    one = rb.step_and_round(glm52, 1, 1, 3, 4096)
    head = 2 * 154880 * 6144 / 1e9
    # the verify reads the whole model once plus the experts 4 tokens add; the draft three LM heads
    assert one["phases_gb"]["verify"] > one["plain_step_gb"]
    assert one["phases_gb"]["draft-extend"] + one["phases_gb"]["draft steps"] > 3 * head
    assert 3.0 < one["round_in_plain_steps"] < 3.5  # the 8-layer proxy at batch 1: LM heads and experts
    mapped = rb.step_and_round(glm52, 1, 1, 3, 4096, hot_vocab=32768)
    assert mapped["plain_step_gb"] == one["plain_step_gb"]
    assert one["round_gb"] - mapped["round_gb"] == pytest.approx(3 * 2 * (154880 - 32768) * 6144 / 1e9)
    # an FP8 draft head halves the draft's three heads; the verify keeps the target's BF16 head
    fp8 = rb.step_and_round(glm52, 1, 1, 3, 4096, draft_head_bytes=1)
    assert one["round_gb"] - fp8["round_gb"] == pytest.approx(3 * 154880 * 6144 / 1e9)
    assert fp8["phases_gb"]["verify"] == one["phases_gb"]["verify"]


def test_round_floor_by_hand():
    # 12.86 GB past a 5.77 GB, 3.15 ms plain step, at 4.29 TB/s: 3.0 ms more, 1.95 plain steps
    assert rb.round_floor(5.77, 18.63, 3.15) == pytest.approx(1 + 12.86 / 4.29 / 3.15)
    assert rb.round_floor(5.77, 18.63, 3.15) == pytest.approx(1.95, abs=0.01)
    assert rb.round_floor(5.0, 5.0, 1.0) == 1  # nothing past a plain step: the verify alone
