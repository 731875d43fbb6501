"""Shared helpers for tests that run real SGLang (Engine or HTTP server) and the transformers oracle."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
import torch

# Small pools keep several engines within the CPU machine's memory; float32 for exact tokens.
ENGINE_DEFAULTS = dict(
    dtype="float32",
    device="cpu",
    disable_cuda_graph=True,
    max_total_tokens=8192,
    max_running_requests=16,
    log_level="warning",
)


@contextlib.contextmanager
def engine(model_path, **kwargs):
    import sglang as sgl

    args = {**ENGINE_DEFAULTS, **kwargs}
    if "json_model_override_args" in args and not isinstance(args["json_model_override_args"], str):
        args["json_model_override_args"] = json.dumps(args["json_model_override_args"])
    llm = sgl.Engine(model_path=str(model_path), **args)
    try:
        yield llm
    finally:
        llm.shutdown()


def greedy(llm, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    out = llm.generate(
        input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": max_new_tokens}
    )
    return [o["output_ids"] for o in out]


def hf_greedy(model_path, prompts, max_new_tokens: int, **config_overrides) -> list[list[int]]:
    """transformers' GlmMoeDsaForCausalLM, float32, greedy: the oracle."""
    from transformers import GlmMoeDsaForCausalLM

    model = GlmMoeDsaForCausalLM.from_pretrained(
        str(model_path), dtype=torch.float32, **config_overrides
    ).eval()
    outs = []
    for p in prompts:
        ids = model.generate(
            torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )
        outs.append(ids[0, len(p):].tolist())
    return outs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def http_server(model_path, *args: str, timeout: float = 240.0):
    """`python -m sglang_glm.cpu_compat.launch_server` in its own process group; yields the base URL."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "sglang_glm.cpu_compat.launch_server",
        "--model-path", str(model_path), "--port", str(port), "--host", "127.0.0.1",
        "--device", "cpu", "--dtype", "float32", "--disable-cuda-graph",
        "--max-total-tokens", "8192", "--max-running-requests", "16", *args,
    ]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"sglang_server_{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; log: {log.name}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"server not healthy after {timeout}s; log: {log.name}")
            time.sleep(1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def failed_launch(model_path, *args: str, timeout: float = 240.0) -> str:
    """Start the server expecting start-up to fail; returns its output.

    A failed start-up makes SGLang kill its whole process tree, so it runs in a child process,
    never inside the test process.
    """
    cmd = [
        sys.executable, "-m", "sglang_glm.cpu_compat.launch_server",
        "--model-path", str(model_path), "--port", str(free_port()),
        "--device", "cpu", "--dtype", "float32", "--disable-cuda-graph",
        "--max-total-tokens", "8192", *args,
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True
    )
    assert proc.returncode != 0, "server start-up was expected to fail"
    return proc.stdout + proc.stderr
