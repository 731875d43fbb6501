"""Import-only stand-in for the `sgl-flash-mla` wheel (see ../README.md): every function raises."""


def _missing(name):
    def call(*args, **kwargs):
        raise NotImplementedError(f"flash_mla.{name}: FlashMLA is not installed (test-side import stand-in)")

    return call


def has_legacy():
    return False  # glm_dsa_triton asks whether FlashMLA's SM90 kernels are here: none are, so it runs Triton


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
