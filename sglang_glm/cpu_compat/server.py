"""Start and stop a real SGLang HTTP server on CPU (`sglang_glm.cpu_compat.launch_server`).

Used by the CPU demo, the tests and the serving benchmarks (which also run `launched_server`
with `sglang.launch_server` on a GPU machine). The server runs in its own process group, because
SGLang's scheduler and detokenizer outlive a killed main process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# Small pools keep several servers within a small machine's memory; float32 for exact tokens.
CPU_SERVER_ARGS = (
    "--device", "cpu", "--dtype", "float32", "--disable-cuda-graph",
    "--max-total-tokens", "8192",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(model_path, port: int, args) -> list[str]:
    return [
        sys.executable, "-m", "sglang_glm.cpu_compat.launch_server",
        "--model-path", str(model_path), "--host", "127.0.0.1", "--port", str(port),
        *CPU_SERVER_ARGS, *args,
    ]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def launched_server(command: list[str], port: int, log_path, timeout: float = 300.0):
    """Runs a server command in its own process group; yields its base URL once /health answers
    and stops the whole group on exit. Start-up failure: RuntimeError (exited) or TimeoutError."""
    log = open(log_path, "w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while not _healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; log: {log_path}")
            if time.time() > deadline:
                raise TimeoutError(f"server not healthy after {timeout}s; log: {log_path}")
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


@contextlib.contextmanager
def cpu_server(model_path, *args: str, timeout: float = 300.0, log_path=None):
    """Yields the base URL of a healthy CPU server; stops the whole process group on exit."""
    port = free_port()
    log_path = Path(log_path or Path(tempfile.gettempdir()) / f"sglang_server_{port}.log")
    with launched_server(_command(model_path, port, args), port, log_path, timeout) as url:
        yield url


def failed_launch(model_path, *args: str, timeout: float = 300.0) -> str:
    """Start a server expecting start-up to fail; returns its output.

    A failed start-up makes SGLang kill its whole process tree, so it runs in a child process
    group; a server that starts after all is ended as a group and reported as an AssertionError.
    """
    proc = subprocess.Popen(
        _command(model_path, free_port(), args),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"server still running after {timeout}s: {out[-2000:]}") from None
    if proc.returncode == 0:
        raise AssertionError(f"server start-up was expected to fail: {out[-2000:]}")
    return out
