"""The moe hook hands SGLang's fused MoE kernel the plugin's tuned configs for an (E, N), in processes that
run the plugin's attention backends, and leaves every other lookup to SGLang."""

import inspect
import json

import pytest

from sglang_glm.hooks import base, moe

CFG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
       "num_stages": 4}


@pytest.fixture
def tuned_dir(tmp_path, monkeypatch):
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config

    monkeypatch.setattr(moe, "TUNED", tmp_path)
    monkeypatch.setattr(fused_moe_triton_config, "get_device_name", lambda: "NVIDIA H200")
    base.tuned_launches.cache_clear()
    yield tmp_path
    base.tuned_launches.cache_clear()


def test_the_hook_takes_sglangs_lookup_arguments():
    """An SGLang whose lookup changed shape would pass arguments the hook misreads: fail here first."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config

    own = inspect.signature(fused_moe_triton_config.get_moe_configs.__wrapped__)
    hook = inspect.signature(moe._glm_moe_configs)
    assert list(hook.parameters)[1:] == list(own.parameters)
    assert [p.default for p in list(hook.parameters.values())[1:]] == [p.default for p in own.parameters.values()]


def test_tuned_experts_come_from_the_plugin_only_in_its_processes(tuned_dir, monkeypatch):
    (tuned_dir / "E=256,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json").write_text(
        json.dumps({"4": CFG}))
    calls = []

    def sglang_lookup(E, N, dtype, block_n=0, block_k=0, per_channel_quant=False, down_moe=False):
        calls.append((E, N, down_moe))
        return None

    monkeypatch.setattr(moe, "plugin_backend_in_use", lambda: True)
    assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128) == {4: CFG}
    assert calls == []
    # no file of its own for the down projection: SGLang's lookup, which then reuses the up config
    assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128, down_moe=True) is None
    assert moe._glm_moe_configs(sglang_lookup, 256, 512, "fp8_w8a8", 128, 128) is None  # another N
    assert calls == [(256, 2048, True), (256, 512, False)]
    monkeypatch.setattr(moe, "plugin_backend_in_use", lambda: False)  # another model's process
    assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128) is None
    assert calls[-1] == (256, 2048, False)


def test_the_package_ships_only_well_formed_configs():
    """Every shipped file parses as SGLang's loader reads it, for block-FP8 experts."""
    keys = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
    for path in moe.TUNED.glob("*.json"):
        assert path.name.startswith("E=") and path.name.endswith("dtype=fp8_w8a8,block_shape=[128, 128].json")
        for m, cfg in json.loads(path.read_text()).items():
            assert int(m) > 0 and set(cfg) == keys and 128 % cfg["BLOCK_SIZE_K"] == 0, (path.name, m, cfg)
