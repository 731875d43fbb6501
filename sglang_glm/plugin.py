"""SGLang plugin entry point (`sglang.srt.plugins`): runs in every SGLang process.

Registers the GLM-DSA model classes (replacing SGLang's built-in ones for the same architecture
names), the plain-PyTorch DSA attention backend, and the few SGLang patches in `sglang_patches`.
"""

import logging

logger = logging.getLogger(__name__)

MODELS_PACKAGE = "sglang_glm.models"
TRITON_BACKEND_NAME = "glm_dsa_triton"


def _create_triton_dsa_backend(model_runner):
    # Imported on use: Triton kernels are for CUDA machines only.
    from sglang_glm.attention.triton_dsa_backend import TritonDSABackend

    return TritonDSABackend(model_runner)


def register() -> None:
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.server_args import add_attention_backend_choices

    from sglang_glm import sglang_patches
    from sglang_glm.attention.torch_dsa_backend import BACKEND_NAME, create_torch_dsa_backend

    ModelRegistry.register(MODELS_PACKAGE, overwrite=True)
    register_attention_backend(BACKEND_NAME)(create_torch_dsa_backend)
    register_attention_backend(TRITON_BACKEND_NAME)(_create_triton_dsa_backend)
    add_attention_backend_choices([BACKEND_NAME, TRITON_BACKEND_NAME])
    sglang_patches.apply()
    logger.info("sglang-glm registered: models from %s, attention backends %s, %s", MODELS_PACKAGE, BACKEND_NAME, TRITON_BACKEND_NAME)
