"""SGLang-format launch-config files ({batch: launch}) as the tuners write them."""

from __future__ import annotations

import json
from pathlib import Path


def merge_into(path: Path, entries: dict[int, dict], anchors: list[int], sglang_launch) -> None:
    """Write `entries` ({batch: launch}) into the config file at `path`, over what it holds, and SGLang's
    own launch at each anchor batch the file lacks (SGLang takes the entry nearest a call's batch, so
    without them a prefill chunk would run the largest tuned batch's launch)."""
    merged = {**(json.loads(path.read_text()) if path.exists() else {}), **{str(m): c for m, c in entries.items()}}
    for M in anchors:
        merged.setdefault(str(M), sglang_launch(M))
    path.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: int(kv[0]))), indent=1) + "\n")
