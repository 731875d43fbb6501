"""sglang-glm: GLM-DSA (GLM-5 / 5.1 / 5.2) serving for SGLang.

The runtime plugin: what an SGLang server imports. SGLang loads it through the
``sglang.srt.plugins`` entry point (`sglang_glm.plugin.register`); importing this package itself
imports no SGLang module. Tools (calibration, the float64 reference, the checkpoint writer) are in
`sglang_glm_tools`, the kernels in `glm_dsa_kernels`.
"""

__version__ = "0.1.0"
