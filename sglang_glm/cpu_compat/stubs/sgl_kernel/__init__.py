"""CPU stand-in for the CUDA-only `sgl_kernel` package (on sys.path only in CPU mode).

SGLang's CPU path imports `*_cpu` symbols from `sgl_kernel` at import time. Symbols the plugin
implements in plain PyTorch come from `sglang_glm.cpu_compat.ops`; any other symbol imports but
raises when called, so an unexpected call fails loudly instead of computing something wrong.
Submodules (e.g. `sgl_kernel.scalar_type`) stay ImportError so SGLang picks its own fallbacks.
"""

from sglang_glm.cpu_compat import ops as _ops


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    impl = getattr(_ops, name, None)
    if impl is not None:
        return impl

    def _missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} has no CPU implementation in sglang_glm.cpu_compat; "
            "SGLang reached a CUDA-only kernel on the CPU path"
        )

    _missing.__name__ = name
    return _missing
