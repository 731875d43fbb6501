"""Every change the plugin makes to SGLang internals that SGLang offers no registry for.

Each patch goes through SGLang's own `HookRegistry`, says why in one line, and applies only where
it is needed (the CPU path), so GPU deployments run SGLang's code unchanged.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def apply() -> None:
    """Register the plugin's hooks; SGLang's `load_plugins` applies them after all plugins ran."""
