"""Triton kernels for GLM-DSA (MLA + DeepSeek sparse attention), each with a plain-PyTorch reference.

Imported as `glm_dsa_kernels` (the wheel maps it onto this folder).
"""
