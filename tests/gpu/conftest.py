"""The GPU suite's checkpoints, made once per run and shared by the pytest-xdist workers."""

import os

import pytest

from gpu_serving import make_model, results_dir


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    root = tmp_path_factory.getbasetemp().parent / "models"
    root.mkdir(exist_ok=True)
    return {
        "glm52": make_model(root, "glm52", seed=3),
        "glm52_fp8": make_model(root, "glm52_fp8", seed=3, fp8=True),
        # a hidden width no other checkpoint has: its GEMM shapes are the tuned-config test's own
        "glm52_fp8_h384": make_model(root, "glm52_fp8_h384", seed=6, fp8=True, overrides={"hidden_size": 384}),
        "all_full": make_model(root, "all_full", seed=4, overrides={"indexer_types": ["full"] * 4}),
        # GLM-5.2's 64 attention heads on one rank (TP 1 or DP attention)
        "glm52_64h": make_model(root, "glm52_64h", seed=5,
                                overrides={"num_attention_heads": 64, "num_key_value_heads": 64}),
    }


# The longest tests (two servers in turn, torch eager, load): started first, they no longer end a
# 7-worker run alone (session 28: mtp_tree_torch began last and the run passed 440 s)
SLOW_FIRST = ("mtp_tree_torch", "test_64_heads_served_on_flashmla", "test_mtp_under_load", "graph_phases",
              "draft_prefill", "sglang_own_path", "test_engine_with_cuda_graphs")


def pytest_collection_modifyitems(items):
    def slow(item):
        return item.nodeid.startswith("tests/gpu/") and any(name in item.nodeid for name in SLOW_FIRST)

    items.sort(key=lambda item: not slow(item))  # stable: every other test keeps its place


def pytest_runtest_logreport(report):
    """Each failure, as it happens, into failures.log beside the records: a suite cut off by its
    call's time limit never prints pytest's summary, and the failure would go unnamed."""
    if report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # the controller sees every worker's reports
        with (results_dir() / "failures.log").open("a") as f:
            f.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
