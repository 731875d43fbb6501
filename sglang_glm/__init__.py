"""sglang-glm: GLM-DSA (GLM-5 / 5.1 / 5.2) serving for SGLang.

Importing this package imports no SGLang module, so the plain-PyTorch reference model and the
kernels can be used on machines without SGLang. SGLang loads the plugin through the
``sglang.srt.plugins`` entry point (`sglang_glm.plugin.register`).
"""

__version__ = "0.1.0"
