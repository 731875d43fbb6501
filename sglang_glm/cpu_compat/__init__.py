"""Everything that lets real SGLang run GLM-DSA on a CPU-only machine, in one place.

`activate()` is called by the tests and the CPU demo before SGLang is imported. It refuses to run
where CUDA is available, so none of these stand-ins can be active on a GPU machine.
"""

import os
import sys
from pathlib import Path

from sglang_glm.attention.backends import CPU_ENGINE_ENV

STUBS_DIR = Path(__file__).parent / "stubs"

# What SGLang's CPU path needs (see README "Quick start on a CPU machine"): the CPU engine switch, no
# torch.compile of the MoE top-k (needs a compiler; tokens are identical), and the stand-in
# `sgl_kernel` importable in every process SGLang spawns.
CPU_ENV = {
    CPU_ENGINE_ENV: "1",
    "TORCHDYNAMO_DISABLE": "1",
}

# sgl.Engine arguments for the CPU path: float32 for exact tokens, no CUDA graphs, a small pool
# (several engines side by side in a small machine's memory); CPU_SERVER_ARGS: the same as
# `launch_server` flags.
CPU_ENGINE_ARGS = {"dtype": "float32", "device": "cpu", "disable_cuda_graph": True, "max_total_tokens": 8192}
CPU_SERVER_ARGS = (
    "--device", "cpu", "--dtype", "float32", "--disable-cuda-graph",
    "--max-total-tokens", "8192",
)


def activate() -> None:
    import torch

    if torch.cuda.is_available():
        raise RuntimeError(
            "sglang_glm.cpu_compat.activate() is for CPU-only machines; this machine has CUDA. "
            "On a GPU, install the real sgl-kernel and do not activate the CPU stand-ins."
        )
    os.environ.update(CPU_ENV)
    stubs = str(STUBS_DIR)
    # The stand-in `sgl_kernel` must import in this process too; PYTHONPATH below reaches only its children.
    if stubs not in sys.path:
        sys.path.insert(0, stubs)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if stubs not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([stubs, *paths])
