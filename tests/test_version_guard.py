"""The plugin applies whole or not at all (sglang_glm.version_guard, plugin.register).

In-process: `register()` on a simulated wrong SGLang version and with a simulated missing hook
target registers none of its hooks and no model class of its own, only the refusal: a hook on
SGLang's ModelConfig and stand-ins for the GLM-DSA architectures, whose construction raises one
error naming the version, the problem and the fix.
Real SGLang: a server started on a GLM-DSA checkpoint with the version simulated wrong (through a
`sitecustomize` on the server's PYTHONPATH, so every SGLang process sees it) stops at start-up with
that error.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from sglang_glm import hooks, plugin, version_guard
from sglang_glm_tools.checkpoint import make_tiny_checkpoint
from serving import failed_launch

GLM_DSA = version_guard.GLM_DSA_ARCHS


@pytest.fixture
def clean_registries(monkeypatch):
    """SGLang's ModelRegistry and HookRegistry as they were, after the test."""
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(ModelRegistry, "models", dict(ModelRegistry.models))
    monkeypatch.setattr(HookRegistry, "_hooks", type(HookRegistry._hooks)(list))
    monkeypatch.setattr(plugin, "REGISTRATION", None)
    return ModelRegistry, HookRegistry


def assert_refuses(model_registry, *words):
    for arch in GLM_DSA:
        cls, _ = model_registry.resolve_model_cls([arch])
        assert cls.__module__ == version_guard.__name__
        with pytest.raises(RuntimeError) as err:
            cls(config=None)
        message = str(err.value)
        for word in (arch, "Fix:", "sglang==0.5.23", *words):
            assert word in message, f"{word!r} not in {message!r}"


def test_supported_version_applies_everything(clean_registries):
    model_registry, hook_registry = clean_registries
    plugin.register()
    reg = plugin.REGISTRATION
    assert reg.intact and reg.sglang_version == "0.5.23"
    assert reg.applied == [h.target for h in hooks.hooks()]
    assert set(hook_registry._hooks) == set(reg.applied)
    for arch in GLM_DSA:
        assert model_registry.models[arch].__module__.startswith("sglang_glm.models.")


def test_wrong_sglang_version_applies_nothing(clean_registries, monkeypatch):
    model_registry, hook_registry = clean_registries
    monkeypatch.setattr(version_guard, "installed_sglang_version", lambda: "0.6.0")
    plugin.register()
    reg = plugin.REGISTRATION
    assert not reg.intact and reg.applied == []
    assert set(hook_registry._hooks) == {version_guard.REFUSAL_TARGET}, "hooks on an unsupported SGLang"
    assert_refuses(model_registry, "version 0.6.0", "supports SGLang 0.5.23")
    # Other architectures resolve to SGLang's own classes.
    llama, _ = model_registry.resolve_model_cls(["LlamaForCausalLM"])
    assert llama.__module__.startswith("sglang.srt.models.")


def test_missing_hook_target_applies_nothing(clean_registries, monkeypatch):
    model_registry, hook_registry = clean_registries
    gone = "sglang.srt.managers.tokenizer_manager.TokenizerManager._renamed_in_a_later_sglang"
    real_hooks = hooks.hooks
    monkeypatch.setattr(hooks, "hooks",
                        lambda: [*real_hooks(), hooks.Hook(gone, print, "AFTER")])
    plugin.register()
    assert not plugin.REGISTRATION.intact
    assert set(hook_registry._hooks) == {version_guard.REFUSAL_TARGET}
    assert_refuses(model_registry, gone, "not found")


@pytest.mark.parametrize(
    "target,why",
    [("sglang.srt.no_such_module.f", "not found"),
     ("sglang.srt.mem_cache.allocation.no_such_function", "no attribute"),
     ("sglang.srt.models.registry._ModelRegistry", "is a class")],
)
def test_missing_target_says_why(target, why):
    assert why in version_guard.missing_target(target)


def test_every_hook_target_resolves():
    assert [t for t in (h.target for h in hooks.hooks()) if version_guard.missing_target(t)] == []


SITECUSTOMIZE = textwrap.dedent("""
    # Test only: every Python process of the server sees an unsupported SGLang version.
    import sglang_glm.version_guard as guard
    guard.installed_sglang_version = lambda: "0.4.0"
""")


@pytest.mark.slow
def test_glm_dsa_server_refuses_on_wrong_sglang(tmp_path, monkeypatch):
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", seed=2)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", f"{site}:{os.environ.get('PYTHONPATH', '')}")
    out = failed_launch(ckpt, timeout=420)
    assert "sglang-glm cannot serve GlmMoeDsaForCausalLM" in out, out[-3000:]
    assert "version 0.4.0" in out and "Fix:" in out, out[-3000:]
