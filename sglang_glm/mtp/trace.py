"""Opt-in trace of MTP draft forwards, for tests and the benchmark (never on by default).

Set `SGLANG_GLM_MTP_TRACE=/some/dir` before starting SGLang: the draft model then saves one file
per draft forward (kind "extend" = draft-extend / draft step 0, kind "step" = draft step i >= 1)
with whether the MTP indexer ran, the request slots, positions and the logits it produced.
SGLang's scheduler runs in a sub-process, so a file is the simplest channel back to the test.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import torch

ENV = "SGLANG_GLM_MTP_TRACE"
_counter = itertools.count()


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def record(**fields) -> None:
    out = Path(os.environ[ENV])
    out.mkdir(parents=True, exist_ok=True)
    fields = {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
    fields["seq"] = next(_counter)
    torch.save(fields, out / f"{os.getpid()}_{fields['seq']:08d}.pt")


def load(directory) -> list[dict]:
    files = sorted(Path(directory).glob("*.pt"), key=lambda p: (p.name.split("_")[0], p.name))
    return [torch.load(f, weights_only=False) for f in files]
