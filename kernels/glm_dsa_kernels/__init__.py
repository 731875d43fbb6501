"""Triton kernels for GLM-DSA (MLA + DeepSeek sparse attention), each with a plain-PyTorch reference.

The package folder is the import name: `import glm_dsa_kernels` after `pip install -e .`, or
with `kernels/` on PYTHONPATH in a plain checkout.
"""
