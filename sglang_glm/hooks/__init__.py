"""Every change the plugin makes to SGLang internals that SGLang offers no registry for.

Each patch goes through SGLang's own `HookRegistry` and says why in one line; each changes
behaviour only for GLM-DSA models or the plugin's own attention backends and passes everything
else to SGLang untouched. One module per concern, each with its `HOOKS`: `launch` (server-arg
defaults, prefill graphs, speculative flag checks), `memory` (KV pool class and size, the top-k
buffer), `requests` (400s for requests that would crash SGLang), `chat` (OpenAI chat fixes),
`speculative` (draft backends, the draft-extend graph, the top-k seed, per-position acceptance),
`gemm` and `moe` (tuned block-FP8 GEMM and fused-MoE configs for GLM-5.2's shapes);
the CPU path's own hooks are `sglang_glm.cpu_compat.hooks`. `plugin.register()` checks every
target exists before `apply()` registers any.
"""

from __future__ import annotations

from sglang_glm.attention.backends import on_cpu_engine
from sglang_glm.hooks import chat, gemm, launch, memory, moe, requests, speculative
from sglang_glm.hooks.base import Hook, is_glm_dsa

__all__ = ["Hook", "apply", "hooks", "is_glm_dsa"]


def hooks() -> list[Hook]:
    """Every hook this process needs: the CPU path's own only on the CPU engine."""
    everywhere = [*memory.HOOKS, *requests.HOOKS, *chat.HOOKS, *launch.HOOKS, *speculative.HOOKS, *gemm.HOOKS,
                  *moe.HOOKS]
    if not on_cpu_engine():
        return everywhere
    from sglang_glm.cpu_compat import hooks as cpu_hooks

    return everywhere + cpu_hooks.HOOKS


def apply(hook_list: list[Hook]) -> None:
    """Register the hooks; SGLang's `load_plugins` applies them after all plugins ran."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for hook in hook_list:
        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
