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
    monkeypatch.setattr(moe, "deterministic", lambda: False)
    monkeypatch.setattr(fused_moe_triton_config, "get_device_name", lambda: "NVIDIA H200")
    base.announce_tuned.cache_clear()
    moe.plugin_configs.cache_clear()
    yield tmp_path
    base.announce_tuned.cache_clear()
    moe.plugin_configs.cache_clear()


def test_the_hook_takes_sglangs_lookup_arguments():
    """An SGLang whose lookup changed shape would pass arguments the hook misreads: fail here first."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config

    own = inspect.signature(fused_moe_triton_config.get_moe_configs.__wrapped__)
    hook = inspect.signature(moe._glm_moe_configs)
    assert list(hook.parameters)[1:] == list(own.parameters)
    assert [p.default for p in list(hook.parameters.values())[1:]] == [p.default for p in own.parameters.values()]


def test_tuned_experts_come_from_the_plugin_only_in_its_processes(tuned_dir, monkeypatch, caplog):
    (tuned_dir / "E=256,N=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json").write_text(
        json.dumps({"4": CFG}))
    calls = []

    def sglang_lookup(E, N, dtype, block_n=0, block_k=0, per_channel_quant=False, down_moe=False):
        calls.append((E, N, down_moe))
        return None

    monkeypatch.setattr(moe, "plugin_backend_in_use", lambda: False)  # another model's process, same (E, N)
    assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128) is None
    assert "tuned launch configs" not in caplog.text
    calls.clear()
    monkeypatch.setattr(moe, "plugin_backend_in_use", lambda: True)
    with caplog.at_level("INFO"):
        assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128) == {4: CFG}
    assert caplog.text.count("fused MoE E=256,N=2048,") == 1
    # no `_down` file: the down projection runs the up launch, the pair the tuner timed
    assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128, down_moe=True) == {4: CFG}
    assert calls == []
    assert moe._glm_moe_configs(sglang_lookup, 256, 512, "fp8_w8a8", 128, 128) is None  # another N
    assert calls == [(256, 512, False)]
    monkeypatch.setattr(moe, "deterministic", lambda: True)  # SGLang's batch-invariant launch stays
    assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128) is None
    monkeypatch.setattr(moe, "deterministic", lambda: False)
    monkeypatch.setattr(moe, "plugin_backend_in_use", lambda: False)  # another model's process
    assert moe._glm_moe_configs(sglang_lookup, 256, 2048, "fp8_w8a8", 128, 128) is None
    assert calls == [(256, 512, False), (256, 2048, False), (256, 2048, False)]


def test_the_package_ships_only_well_formed_configs():
    """Every shipped file parses as SGLang's loader reads it, for block-FP8 experts."""
    keys = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
    shipped = sorted(moe.TUNED.glob("*.json"))
    if not shipped:
        pytest.skip("sglang_glm/moe_configs ships no tuned file yet (scripts/gpu_bench.sh moe writes them)")
    for path in shipped:
        assert path.name.startswith("E=") and path.name.endswith("dtype=fp8_w8a8,block_shape=[128, 128].json")
        for m, cfg in json.loads(path.read_text()).items():
            assert int(m) > 0 and set(cfg) == keys and 128 % cfg["BLOCK_SIZE_K"] == 0, (path.name, m, cfg)
        # SGLang takes the entry nearest a call's batch: a prefill chunk must not land on a decode launch
        assert max(map(int, json.loads(path.read_text()))) >= 256, path.name


THROUGH_SGLANG = """
import json, sys
from pathlib import Path
from sglang_glm.cpu_compat import activate; activate()
from sglang.srt.runtime_context import get_context
from sglang.srt.server_args import ServerArgs
get_context().set_server_args(ServerArgs(model_path="x", device="cpu", attention_backend="glm_dsa_torch"))
from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as lookup
lookup.get_device_name = lambda: "NVIDIA H200"  # SGLang names its files by GPU
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang_glm.hooks import moe

def resolve(N, M):  # what SGLang's fused MoE takes for the up and the down projection
    up, (down, _) = lookup.try_get_optimal_moe_config((256, 2 * N, 6144), (256, 6144, N), 8, "fp8_w8a8", M,
                                                       block_shape=[128, 128], return_down_config=True)
    return up, down

print(json.dumps({"sglang_512": resolve(512, 4)}))  # before the plugin: SGLang's own files
moe.TUNED = Path(sys.argv[1])
for N in (2048, 512):
    (moe.TUNED / lookup.get_config_file_name(256, N, "fp8_w8a8", [128, 128])).write_text(
        json.dumps({"1": json.loads(sys.argv[2]), "4096": json.loads(sys.argv[3])}))
for hook in moe.HOOKS:
    HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
HookRegistry.apply_hooks()
print(json.dumps({f"plugin_{N}_{M}": resolve(N, M) for N in (2048, 512) for M in (4, 8192)}))
"""


def test_the_plugin_pair_reaches_sglangs_fused_moe_through_its_registry(tmp_path):
    """Through SGLang's HookRegistry and its own config resolution: the plugin's file gives both
    projections their launch at a decode batch and at a prefill chunk, also for an (E, N) where SGLang
    ships a `_down` file of its own (E=256, N=512: a TMA launch tuned beside SGLang's up config)."""
    import subprocess
    import sys

    big = dict(CFG, BLOCK_SIZE_M=64, GROUP_SIZE_M=32, num_stages=3)
    proc = subprocess.run([sys.executable, "-c", THROUGH_SGLANG, str(tmp_path), json.dumps(CFG), json.dumps(big)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    sglang, plugin = lines[0], lines[1]
    assert sglang["sglang_512"][1].get("USE_TMA"), sglang  # SGLang's own down launch for N=512 (the contrast)
    for N in (2048, 512):
        assert plugin[f"plugin_{N}_4"] == [CFG, CFG], plugin
        assert plugin[f"plugin_{N}_8192"] == [big, big], plugin
