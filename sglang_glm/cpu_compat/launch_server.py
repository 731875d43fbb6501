"""`python -m sglang_glm.cpu_compat.launch_server <sglang.launch_server args>` on a CPU machine.

Activates the CPU stand-ins, then hands over to SGLang's own `sglang.launch_server`.
"""

import runpy
import sys

from sglang_glm.cpu_compat import activate

if __name__ == "__main__":
    activate()
    sys.argv[0] = "sglang.launch_server"
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
