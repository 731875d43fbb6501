"""Start and stop a real SGLang HTTP server on CPU (`sglang_glm.cpu_compat.launch_server`).

Used by the CPU demo, the tests and the serving benchmarks (the GPU suite and the GPU benchmarks
also run `launched_server` with `sglang.launch_server`). The server runs in its own process group,
because SGLang's scheduler and detokenizer outlive a killed main process.
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
from typing import Callable

from sglang_glm.cpu_compat import CPU_SERVER_ARGS


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


# uvicorn's message when another process took the port between free_port() and the bind; the server
# then waits forever in its shutdown instead of exiting.
PORT_TAKEN = "error while attempting to bind on address"


@contextlib.contextmanager
def launched_server(command: Callable[[int], list[str]], log_path, timeout: float = 300.0, attempts: int = 3,
                    transient: tuple[str, ...] = ()):
    """Runs command(port) in its own process group; yields its base URL once /health answers and
    stops the whole group on exit. A start-up that failed on a neighbour (a port taken before the
    server bound it, or a log line in `transient`) is retried, on a fresh port. Start-up failure:
    RuntimeError (exited) or TimeoutError."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        log = open(log_path, "w")
        proc = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.time() + timeout
            while not _healthy(url):
                text = Path(log_path).read_text(errors="replace")
                cause = next((m for m in (PORT_TAKEN, *transient) if m in text), None)
                if cause and attempt == attempts:
                    raise RuntimeError(f"start-up failed {attempts} times on {cause!r}; log: {log_path}")
                if cause:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}; log: {log_path}")
                if time.time() > deadline:
                    raise TimeoutError(f"server not healthy after {timeout}s; log: {log_path}")
                time.sleep(1)
            else:
                yield url
                return
        finally:
            _stop(proc)
            log.close()
        time.sleep(5 * attempt)  # let the neighbour finish what it was doing


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def cpu_server(model_path, *args: str, timeout: float = 300.0, log_path=None):
    """Yields the base URL of a healthy CPU server; stops the whole process group on exit."""
    log_path = Path(log_path or tempfile.mkstemp(prefix="sglang_server_", suffix=".log")[1])
    with launched_server(lambda port: _command(model_path, port, args), log_path, timeout) as url:
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
