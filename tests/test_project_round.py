"""benchmarks/serving/gpu/project_round.py scales the GLM-5.2-shaped round to 78 layers (issue 29)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serving" / "gpu" / "project_round.py"


def profile(config, step_us, experts_us, phases=None):
    kernels = [{"name": "lm_head_gemm", "us": 500.0, "launches": 1.0},
               {"name": "small_once", "us": 5.0, "launches": 1.0},
               {"name": "fused_moe_kernel", "us": experts_us, "launches": 10.0}]
    out = {"config": config, "num_hidden_layers": 8, "gpu_busy_us_per_step": step_us,
           "top_kernels_us_per_step": kernels, "families_us_per_step": {"MoE experts": {"us": experts_us}}}
    if phases:
        out["spec_round"] = {"phases_per_round": {k: {"gpu_us": v} for k, v in phases.items()}}
    return out


def run(tmp_path, layers, dense=3):
    (tmp_path / "profile_indexcache_b1_ctx4096.json").write_text(json.dumps(profile("indexcache", 4500.0, 1000.0)))
    (tmp_path / "profile_eagle_3_4_b1_ctx4096.json").write_text(json.dumps(profile("eagle_3_4", 0, 0, {
        "target verify": 5500.0, "draft steps": 2000.0, "draft-extend": 1400.0, "verify/accept (eager ops)": 100.0})))
    out = tmp_path / "projection.json"
    subprocess.run([sys.executable, str(SCRIPT), "--profiles", str(tmp_path), "--out", str(out), "--batches", "1",
                    "--layers", str(layers), "--dense", str(dense), "--accept", "3.5"], check=True, capture_output=True)
    return json.loads(out.read_text())["batch"]["1"]


def test_same_depth_reproduces_the_measured_round(tmp_path):
    p = run(tmp_path, layers=8)
    measured = (5500 + 3500) / 4500
    assert p["measured_8_layers"]["lm_head_us"] == 500.0
    assert p["measured_8_layers"]["round_in_plain_steps"] == round(measured, 3)
    assert p["uniform"]["round_in_plain_steps"] == round(measured, 3)
    assert p["moe_weighted"]["round_in_plain_steps"] == round(measured, 3)


def test_the_draft_side_stops_growing_with_depth(tmp_path):
    p = run(tmp_path, layers=78)
    # uniform: the round tends to H + verify body * 78/8 + D over H + body * 78/8
    plain = 500 + 4000 * 78 / 8
    assert p["uniform"]["plain_step_us"] == round(plain)
    assert p["uniform"]["round_us"] == round(500 + 5000 * 78 / 8 + 3500)
    # MoE-weighted: 75 MoE layers, each a dense layer + 200 us of experts + the verify's 200 us excess
    dense_layer = (4000 - 5 * 200) / 8
    moe_plain = 500 + 78 * dense_layer + 75 * 200
    assert p["moe_weighted"]["plain_step_us"] == round(moe_plain)
    assert p["moe_weighted"]["round_us"] == round(moe_plain + 75 * 200 + 3500)
    lo, hi = p["speedup"]["3.5"]
    assert lo <= hi and abs(hi - 3.5 * plain / p["uniform"]["round_us"]) < 0.01
