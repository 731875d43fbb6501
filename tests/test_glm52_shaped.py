"""The GLM-5.2-shaped benchmark model directory (make_glm52_shaped.py) and the configs bench_gpu serves it with."""

import json
import subprocess
import sys
from pathlib import Path

import torch

GPU_BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "serving" / "gpu"


def test_model_directory_carries_a_token_map_that_bench_gpu_serves(tmp_path):
    model = tmp_path / "glm52"
    subprocess.run([sys.executable, str(GPU_BENCH / "make_glm52_shaped.py"), str(model), "--tiny"], check=True,
                   capture_output=True)
    config = json.loads((model / "config.json").read_text())
    hot = torch.load(model / "hot_vocab.pt")
    assert hot == list(range(32768)) and config["vocab_size"] == 154880
    code = ("import json, sys, bench_gpu as b; from pathlib import Path; "
            "print(json.dumps([b.configs(8, Path(sys.argv[1])), b.configs(8)]))")
    with_map, without = json.loads(subprocess.run([sys.executable, "-c", code, str(model)], cwd=GPU_BENCH,
                                                  capture_output=True, text=True, check=True).stdout)
    assert with_map["eagle_3_4_token_map"] == with_map["eagle_3_4"] + ["--speculative-token-map",
                                                                        str(model / "hot_vocab.pt")]
    assert with_map["eagle_3_4_token_map_fp8_head"] == with_map["eagle_3_4_token_map"] + [
        "--json-model-override-args", json.dumps({"mtp_draft_head_fp8": True})]
    assert "eagle_3_4_token_map" not in without and "eagle_3_4_token_map_fp8_head" not in without


def test_deeper_proxies_repeat_the_plan_and_refuse_fewer_than_four_layers(tmp_path):
    make = [sys.executable, str(GPU_BENCH / "make_glm52_shaped.py")]
    subprocess.run([*make, str(tmp_path / "m12"), "--tiny", "--layers", "12"], check=True, capture_output=True)
    config = json.loads((tmp_path / "m12" / "config.json").read_text())
    assert config["num_hidden_layers"] == 12 and config["first_k_dense_replace"] == 3
    assert "".join("F" if t == "full" else "S" for t in config["indexer_types"]) == "FSSS" * 3
    r = subprocess.run([*make, str(tmp_path / "m3"), "--tiny", "--layers", "3"], capture_output=True, text=True)
    assert r.returncode != 0 and "--layers 3" in r.stderr


def test_deep_proxies_keep_the_widths_with_fewer_experts_and_say_their_size(tmp_path):
    """--experts builds E routed experts a MoE layer (top-8 routing and every width kept), so a deep
    proxy fits one GPU; the script states the weights' size, and the full-width estimate matches the
    67 GB the 8-layer model weighed when served (block scales aside)."""
    make = [sys.executable, str(GPU_BENCH / "make_glm52_shaped.py")]
    full = subprocess.run([*make, str(tmp_path / "m8")], check=True, capture_output=True, text=True).stdout
    assert "256 experts a MoE layer" in full and "64.2 GB of weights" in full
    deep = subprocess.run([*make, str(tmp_path / "m40"), "--layers", "40", "--experts", "64"], check=True,
                          capture_output=True, text=True).stdout
    config = json.loads((tmp_path / "m40" / "config.json").read_text())
    assert config["n_routed_experts"] == 64 and config["num_experts_per_tok"] == 8 and config["hidden_size"] == 6144
    assert config["num_hidden_layers"] == 40 and "104.5 GB of weights" in deep
    r = subprocess.run([*make, str(tmp_path / "m4"), "--experts", "4"], capture_output=True, text=True)
    assert r.returncode != 0 and "--experts 4: a token is routed to 8 experts" in r.stderr


def test_repeated_runs_are_summarised_by_their_median():
    """bench_gpu --repeats: a row's numbers are the median of the runs that reported them."""
    code = ("import json, bench_gpu as b; runs = [{'t': 5.0}, {'t': 4.0, 'i': 2.0}, {'t': 9.0}, {'t': 4.5}]; "
            "print(json.dumps([b.median_of(runs, 't'), b.median_of(runs, 'i'), b.median_of(runs, 'x')]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=GPU_BENCH, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [4.75, 2.0, None]
