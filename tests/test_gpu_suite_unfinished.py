"""scripts/gpu_suite_unfinished.py: which GPU-suite tests a timeout left without a result, on xdist's log format."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_suite_unfinished.py"
spec = importlib.util.spec_from_file_location("gpu_suite_unfinished", SCRIPT)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)

A, B, C, D = (f"tests/gpu/test_serving_gpu.py::{name}" for name in ("test_a[x-args0]", "test_b", "test_c", "test_d"))
# as session 37's cut run logged it: a started id at a line's start (once with a warning after it), results by -rA
LOG = f"""\
{A} 
[gw0] [ 25%] PASSED {A} 
{B} 
[gw1] [ 50%] SKIPPED {B} 
{C} /opt/torch/.venv/lib/python3.12/site-packages/_pytest/main.py:365: PluggyTeardownRaisedWarning: ...
PASSED {A}
"""


def test_started_and_never_started_tests_are_both_named():
    reported, missing = mod.unfinished(LOG, [A, B, C, D])
    assert reported == 2
    assert missing == [f"{C} (started)", f"{D} (not started)"]


def test_a_finished_run_leaves_nothing():
    assert mod.unfinished(LOG + f"FAILED {C}\nPASSED {D}\n", [A, B, C, D]) == (4, [])
