"""SGLang plugin entry point (`sglang.srt.plugins`): runs in every SGLang process.

Registers the GLM-DSA model classes (replacing SGLang's built-in ones for the same architecture
names), the plugin's DSA attention backends, its start-up warm-up (`warmup`), and the SGLang
patches in `sglang_glm.hooks` — all of it, or, on an SGLang it was not built for, none of it
(`version_guard`).
"""

from __future__ import annotations

import logging

from sglang_glm import version_guard

logger = logging.getLogger(__name__)

MODELS_PACKAGE = "sglang_glm.models"

# What register() found and did in this process (None until SGLang calls it).
REGISTRATION: version_guard.Registration | None = None


def _backend_factory(name: str):
    """SGLang's factory signature (model_runner -> backend) for a plugin backend name."""
    from sglang_glm.attention.backends import backend_classes

    def create(model_runner):
        return backend_classes(name)[0](model_runner)

    return create


def _register_all(reg: version_guard.Registration) -> None:
    """Check every hook target, then register models, backends and hooks; problems go to `reg`."""
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.server_args import add_attention_backend_choices

    from sglang_glm import hooks as plugin_hooks, warmup
    from sglang_glm.attention.backends import PLUGIN_BACKENDS

    hooks = plugin_hooks.hooks()
    reg.problems += [p for p in map(version_guard.missing_target, (h.target for h in hooks)) if p]
    if reg.problems:
        return
    ModelRegistry.register(MODELS_PACKAGE, overwrite=True, strict=True)
    for name in PLUGIN_BACKENDS:
        register_attention_backend(name)(_backend_factory(name))
    add_attention_backend_choices(list(PLUGIN_BACKENDS))
    plugin_hooks.apply(hooks)
    warmup.register()
    reg.applied = [h.target for h in hooks]


def register() -> None:
    global REGISTRATION
    reg = REGISTRATION = version_guard.Registration(version_guard.installed_sglang_version())
    problem = version_guard.version_problem(reg.sglang_version)
    if problem:
        reg.problems.append(problem)
    else:
        try:
            _register_all(reg)
        except Exception as exc:  # SGLang would log and swallow it, leaving the plugin half applied
            reg.problems.append(f"registration failed ({type(exc).__name__}: {exc})")
    if reg.problems:
        version_guard.refuse_glm_dsa(reg)
        return
    logger.info(
        "sglang-glm active on SGLang %s: models from %s, its attention backends, hooks on %s",
        reg.sglang_version, MODELS_PACKAGE, ", ".join(reg.applied),
    )
