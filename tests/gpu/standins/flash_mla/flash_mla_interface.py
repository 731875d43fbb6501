"""Import-only stand-in (see ../README.md)."""


class FlashMLASchedMeta:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("FlashMLA is not installed (test-side import stand-in)")
