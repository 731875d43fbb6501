"""The MTP draft trace of the tests: a test-only SGLang plugin (mtp_trace_plugin/) that records
every draft forward of the served model into a directory, and the loader for its files."""

from __future__ import annotations

import os
from pathlib import Path

import torch

PLUGIN_DIR = Path(__file__).resolve().parent / "mtp_trace_plugin"
ENV = "SGLANG_GLM_MTP_TRACE"


def enable(monkeypatch, directory: Path) -> None:
    """Engines started after this (their processes spawned from this one) record into `directory`."""
    monkeypatch.setenv(ENV, str(directory))
    paths = [str(PLUGIN_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))


def load(directory: Path) -> list[dict]:
    files = sorted(Path(directory).glob("*.pt"), key=lambda p: (p.name.split("_")[0], p.name))
    return [torch.load(f, weights_only=False) for f in files]
