"""Runs the tiny "interp" cases of test_kernels.py and test_warmup.py on CPU under TRITON_INTERPRET=1, in a subprocess
because the variable must be set before triton decorates the kernels."""

import os
import re
import subprocess
import sys
from pathlib import Path


def test_kernels_under_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    here = Path(__file__).parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-k", "interp", str(here / "test_kernels.py"), str(here / "test_warmup.py")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) > 0, proc.stdout[-2000:]  # not every case skipped
