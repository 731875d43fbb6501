"""The server helper retries a start-up that failed on a neighbour: a port another process took before
the server bound it, or a failure the caller names (on the shared GPU, a KV-pool size misread while
another server loaded).

In a CI run a CPU server lost its port between free_port() and uvicorn's bind; uvicorn logged the
bind error and hung in shutdown, so the test waited 300 s for a health check that could not come.
A stand-in server here: a small HTTP process that plays uvicorn's failure on the taken port.
"""

import socket
import sys
import time
from unittest import mock

import pytest
import requests

from sglang_glm_tools import server

FAKE = r"""
import http.server, sys, time
port = int(sys.argv[1])
if port == int(sys.argv[2]):
    print("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', %d): address already in use" % port, flush=True)
    time.sleep(600)  # uvicorn waits in its shutdown
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_taken_port_is_retried_on_a_fresh_one(tmp_path):
    taken = server.free_port()
    ports = iter([taken, server.free_port()])
    log = tmp_path / "server.log"
    t0 = time.time()
    with mock.patch.object(server, "free_port", lambda: next(ports)):
        with server.launched_server(lambda port: [sys.executable, "-c", FAKE, str(port), str(taken)], log, 60) as url:
            assert requests.get(url + "/health", timeout=5).status_code == 200
            assert not url.endswith(f":{taken}")
    assert time.time() - t0 < 30, "the taken port was waited on, not retried"


def test_a_port_taken_every_time_fails_with_the_reason(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        taken = s.getsockname()[1]
    with mock.patch.object(server, "free_port", lambda: taken):
        with pytest.raises(RuntimeError, match="start-up failed 2 times on 'error while attempting to bind"):
            with server.launched_server(lambda port: [sys.executable, "-c", FAKE, str(port), str(taken)],
                                        tmp_path / "server.log", 60, attempts=2):
                pass


FAILS_ONCE = r"""
import http.server, pathlib, sys
marker = pathlib.Path(sys.argv[2])
if not marker.exists():
    marker.write_text("")
    print("ValueError: Loaded weights leave no GPU memory for the KV cache", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_named_transient_failure_is_retried_and_others_are_not(tmp_path):
    cmd = lambda port: [sys.executable, "-c", FAILS_ONCE, str(port), str(tmp_path / "failed_once")]
    with server.launched_server(cmd, tmp_path / "a.log", 60, transient=("leave no GPU memory",)) as url:
        assert requests.get(url + "/health", timeout=5).status_code == 200
    (tmp_path / "failed_once").unlink()
    with pytest.raises(RuntimeError, match="server exited with 1"):
        with server.launched_server(cmd, tmp_path / "b.log", 60):
            pass
