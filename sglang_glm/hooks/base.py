"""What every hook module shares: the hook record, and the checks that scope a hook to GLM-DSA
models and the plugin's attention backends."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Callable, NamedTuple

from sglang_glm.attention.backends import PLUGIN_BACKENDS


logger = logging.getLogger(__name__)


class Hook(NamedTuple):
    target: str  # dotted path, as SGLang's HookRegistry resolves it
    fn: Callable
    kind: str  # HookType member name: BEFORE, AFTER, AROUND, REPLACE


def is_glm_dsa(hf_config) -> bool:
    return any(a.startswith("GlmMoeDsaForCausalLM") for a in hf_config.architectures or [])


def spec_server_args():
    """This process's server args when it serves with speculative decoding, else None."""
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
    except ValueError:  # SGLang's "Global server args is not set yet!": none in this process
        return None
    return args if getattr(args, "speculative_algorithm", None) else None


def plugin_backend_in_use() -> bool:
    """Whether this process runs one of the plugin's attention backends (GLM-DSA's on CPU)."""
    try:
        from sglang.srt.runtime_context import attention_backends

        return bool(set(attention_backends()) & set(PLUGIN_BACKENDS))
    except ValueError:  # SGLang's "config namespace 'exec' not published": no runtime context yet
        return False


def tuned_launches(path: Path) -> dict[int, dict] | None:
    """The launch configs the plugin ships in `path` ({batch: config}, SGLang's file format), or None
    where it ships none (read once per lookup by the hooks' own caches)."""
    if not path.exists():
        return None
    return {int(m): cfg for m, cfg in json.loads(path.read_text()).items()}


@functools.lru_cache(maxsize=None)
def announce_tuned(kernel: str, file_name: str) -> None:
    """One log line per tuned file a process hands SGLang."""
    logger.info("%s %s: the plugin's tuned launch configs", kernel, file_name)
