"""The plugin applies whole or not at all: the SGLang version and every hook target are checked first.

SGLang logs and swallows an exception raised by a plugin's `register()`, skips hook targets it
cannot resolve and ignores import errors in model modules, so a plugin built for another SGLang
would apply in part, silently. `register()` therefore checks before it changes anything; when a
check fails it registers nothing but the refusal: a GLM-DSA model stops start-up with one error
(SGLang version, what is missing, the fix) as soon as SGLang reads its config, and, should that
hook target be gone too, when SGLang builds the model (a stand-in class per GLM-DSA architecture).
Every other model serves as it would without the plugin.
"""

from __future__ import annotations

import importlib.metadata
import logging
import pkgutil
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

SUPPORTED_SGLANG = ("0.5.23",)
GLM_DSA_ARCHS = ("GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN")
# Where the refusal stops a GLM-DSA start-up first: SGLang reads the model config while it resolves
# the server arguments, before its GLM-DSA defaults (which fail on CPU without the plugin) run.
REFUSAL_TARGET = "sglang.srt.configs.model_config.ModelConfig.__init__"
FIX = (
    f"install a supported SGLang (pip install 'sglang=={SUPPORTED_SGLANG[-1]}', or "
    "pip install 'sglang-glm[sglang]'), or uninstall sglang-glm to serve GLM-DSA with SGLang's "
    "own model classes"
)


@dataclass
class Registration:
    """What `register()` found and did in this process."""

    sglang_version: str
    problems: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # hook targets registered

    @property
    def intact(self) -> bool:
        return not self.problems


def installed_sglang_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def version_problem(version: str) -> str | None:
    if version in SUPPORTED_SGLANG:
        return None
    return f"SGLang {version} is installed; sglang-glm supports SGLang {', '.join(SUPPORTED_SGLANG)}"


def missing_target(target: str) -> str | None:
    """Why a hook target cannot be patched (as SGLang's HookRegistry would resolve it), or None."""
    owner_path, _, attr = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_path)
    except Exception as exc:  # an import error of SGLang's module counts as missing too
        return f"hook target {target} not found ({type(exc).__name__}: {exc})"
    if not hasattr(owner, attr):
        return f"hook target {target} not found ({owner_path} has no attribute {attr!r})"
    if isinstance(getattr(owner, attr), type):
        return f"hook target {target} is a class, expected a function"
    return None


def refusal_message(reg: Registration, arch: str) -> str:
    return (
        f"sglang-glm cannot serve {arch} on this SGLang (version {reg.sglang_version}): "
        + "; ".join(reg.problems)
        + f". Fix: {FIX}."
    )


def refusing_model_class(reg: Registration, arch: str) -> type:
    """A stand-in model class for `arch` that stops start-up with the refusal message."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(refusal_message(reg, arch))

    return type(arch, (), {"__init__": __init__, "__module__": __name__})


def _refusing_model_config(reg: Registration):
    def refuse_glm_dsa_config(result, model_config, *args, **kwargs):
        archs = getattr(model_config.hf_config, "architectures", None) or []
        glm_dsa = [a for a in archs if a in GLM_DSA_ARCHS]
        if glm_dsa:
            raise RuntimeError(refusal_message(reg, glm_dsa[0]))
        return result

    return refuse_glm_dsa_config


def refuse_glm_dsa(reg: Registration) -> None:
    """Register the refusal (config hook, stand-in model classes) and say why in the log."""
    logger.error(
        "sglang-glm is NOT active: %s. GLM-DSA models will refuse to load; other models are "
        "unaffected. Fix: %s.", "; ".join(reg.problems), FIX,
    )
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for arch in GLM_DSA_ARCHS:
        ModelRegistry.models[arch] = refusing_model_class(reg, arch)
    if missing_target(REFUSAL_TARGET) is None:
        HookRegistry.register(REFUSAL_TARGET, _refusing_model_config(reg), HookType.AFTER)
