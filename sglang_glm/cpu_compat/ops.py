"""Plain-PyTorch versions of the `sgl_kernel` CPU ops SGLang calls on the CPU path."""
