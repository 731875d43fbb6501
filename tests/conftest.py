"""Test set-up: real SGLang on CPU needs the plugin's CPU stand-ins before SGLang is imported."""

import pytest
import torch

if not torch.cuda.is_available():
    from sglang_glm.cpu_compat import activate

    activate()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
