"""Test-only SGLang plugin (tests/gpu, and `bench_mtp.py --compile-probe`): every Triton compile.

Put this folder on the server's PYTHONPATH and set GLM_COMPILE_PROBE_LOG; SGLang loads the plugin in
each of its processes through its entry point. Triton's JIT hooks then append one JSON line per
kernel variant a process builds (a miss of its in-memory cache; the build itself may come from
Triton's disk cache): {"time", "pid", "kernel", "variant", "seconds"}. Compare "time" with the
moment the server answered /health to tell start-up builds from builds inside requests.
"""

import json
import os
import time

_started: dict = {}


def _before(*, key, repr, fn, **_):
    _started[(fn.name, str(key))] = time.perf_counter()
    return False  # never skip the compile


def _after(*, key, repr, fn, **_):
    t0 = _started.pop((fn.name, str(key)), None)
    with open(os.environ["GLM_COMPILE_PROBE_LOG"], "a") as f:
        f.write(json.dumps({"time": time.time(), "pid": os.getpid(), "kernel": fn.name, "variant": repr[:400],
                            "seconds": None if t0 is None else round(time.perf_counter() - t0, 4)}) + "\n")


def register():
    if not os.environ.get("GLM_COMPILE_PROBE_LOG"):
        return
    from triton import knobs

    knobs.runtime.jit_cache_hook = _before
    knobs.runtime.jit_post_compile_hook = _after
