"""The gemm hook hands SGLang's block-FP8 GEMM the plugin's tuned configs for a shape, in processes that
run the plugin's attention backends, and leaves every other lookup to SGLang."""

import json

import pytest

from sglang_glm.hooks import base, gemm


@pytest.fixture
def tuned_dir(tmp_path, monkeypatch):
    from sglang.kernels.ops.gemm import fp8_kernel

    monkeypatch.setattr(gemm, "TUNED", tmp_path)
    monkeypatch.setattr(fp8_kernel, "get_device_name", lambda device_id=0: "NVIDIA H200")
    base.announce_tuned.cache_clear()
    gemm.plugin_configs.cache_clear()
    yield tmp_path
    base.announce_tuned.cache_clear()
    gemm.plugin_configs.cache_clear()


def test_file_name_is_sglangs():
    assert gemm.config_file_name(2048, 6144, "NVIDIA H200", 128, 128) == \
        "N=2048,K=6144,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


def test_tuned_shapes_come_from_the_plugin_only_in_its_processes(tuned_dir, monkeypatch):
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
           "num_stages": 4, "SWAP_AB": True, "SPLIT_K": 8}
    (tuned_dir / gemm.config_file_name(2048, 6144, "NVIDIA H200", 128, 128)).write_text(json.dumps({"1": cfg}))
    calls = []

    def sglang_lookup(N, K, block_n, block_k):
        calls.append((N, K))
        return None

    monkeypatch.setattr(gemm, "plugin_backend_in_use", lambda: True)
    assert gemm._glm_block_fp8_configs(sglang_lookup, 2048, 6144, 128, 128) == {1: cfg}
    assert calls == []
    assert gemm._glm_block_fp8_configs(sglang_lookup, 7168, 2048, 128, 128) is None  # no file: SGLang's own
    assert calls == [(7168, 2048)]
    monkeypatch.setattr(gemm, "plugin_backend_in_use", lambda: False)  # another model's process
    assert gemm._glm_block_fp8_configs(sglang_lookup, 2048, 6144, 128, 128) is None
    assert calls == [(7168, 2048), (2048, 6144)]


def test_the_package_ships_only_well_formed_configs():
    """Every shipped file parses as SGLang's loader reads it, for 128 x 128 blocks."""
    keys = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
    shipped = sorted(gemm.TUNED.glob("*.json"))
    # GLM-5.2's nine block-FP8 linear shapes at TP 1, for each GPU tuned on
    by_gpu = {gpu: [p for p in shipped if f"device_name={gpu}," in p.name] for gpu in ("NVIDIA_H200", "NVIDIA_H100_80GB_HBM3")}
    assert {gpu: len(files) for gpu, files in by_gpu.items()} == {"NVIDIA_H200": 9, "NVIDIA_H100_80GB_HBM3": 9}
    assert len(shipped) == 18, [p.name for p in shipped]
    for path in shipped:
        assert path.name.endswith("dtype=fp8_w8a8,block_shape=[128, 128].json"), path.name
        for m, cfg in json.loads(path.read_text()).items():
            assert int(m) > 0 and keys <= set(cfg) and 128 % cfg["BLOCK_SIZE_K"] == 0, (path.name, m, cfg)
            assert set(cfg) <= keys | {"SWAP_AB", "SPLIT_K"}, (path.name, m, cfg)
        # SGLang takes the entry nearest a call's batch: a prefill chunk must not land on a decode launch
        assert max(map(int, json.loads(path.read_text()))) >= 256, path.name
