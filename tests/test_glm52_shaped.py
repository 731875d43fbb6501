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
    assert "eagle_3_4_token_map" not in without


def test_deeper_proxies_repeat_the_plan_and_refuse_fewer_than_four_layers(tmp_path):
    make = [sys.executable, str(GPU_BENCH / "make_glm52_shaped.py")]
    subprocess.run([*make, str(tmp_path / "m12"), "--tiny", "--layers", "12"], check=True, capture_output=True)
    config = json.loads((tmp_path / "m12" / "config.json").read_text())
    assert config["num_hidden_layers"] == 12 and config["first_k_dense_replace"] == 3
    assert "".join("F" if t == "full" else "S" for t in config["indexer_types"]) == "FSSS" * 3
    r = subprocess.run([*make, str(tmp_path / "m3"), "--tiny", "--layers", "3"], capture_output=True, text=True)
    assert r.returncode != 0 and "--layers 3" in r.stderr
