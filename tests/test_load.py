"""Load and faults with MTP on: more concurrent clients than the server runs at once, 5 rounds.

Asserts, against one SGLang HTTP server (the plugin's CPU launcher, a tiny GLM-DSA checkpoint, MTP
drafting on: the bundled trained model is twice as deep and this test is about the server, not
the model):
- every request of every round completes, under the rid it was sent with (nothing lost or mixed);
- each greedy output equals the output the same request got alone, before the load;
- requests aborted mid-stream, by client disconnect (also streamed n=3 requests, dropped after
  the first chunk) and by SGLang's /abort_request, end (the server returns to zero running and
  queued requests well before they could have finished) and the server keeps serving;
- in each round, `/abort_request {"abort_all": true}` in a loop while requests decode and new ones
  arrive: every request it did not abort has its single-request tokens, every aborted one a
  prefix of them;
- the resident memory of the server's whole process group (launcher, scheduler, detokenizer) after
  round 5 is within 5% of after round 2;
- requests SGLang retracts mid-speculation (8 concurrent ~1,900-token prompts, 140 new tokens each,
  in an 8,192-token KV pool, on a server that also retracts every 10 decode steps) each still get
  their single-request tokens; past a flip at a float64 near-tie (top-2 logits within 1e-3), the
  float64 reference's greedy tokens.
Bounded loops, loopback only; the server is stopped by the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import psutil
import pytest
import requests

from sglang_glm_tools.checkpoint import make_tiny_checkpoint
from serving import assert_same_up_to_near_tie, http_server

pytestmark = pytest.mark.slow

# MTP speculative decoding (issue 3) on; False serves without drafting.
MTP_ON = True
MTP_ARGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "benchmarks" / "train" / "data" / "heldout.txt"

MAX_RUNNING = 8
N_CLIENTS = 16  # > MAX_RUNNING: requests queue
N_DISCONNECT = 2  # per round, clients that drop the connection mid-stream
ROUNDS = 5
NEW_TOKENS = 8
TIMEOUT = 900  # per request; generous: CI machines are shared
LONG_TOKENS = 1500  # aborted requests ask for this many: they cannot finish on their own in time
IDLE_TIMEOUT = 120.0
RSS_TOLERANCE = 0.05
ABORT_ALL_FOR_S = 6.0  # per round: abort_all this long, every ABORT_ALL_EVERY_S: some requests
ABORT_ALL_EVERY_S = 1.5  # complete between two aborts, some are caught by one
STORM_CLIENTS = 4  # each sends requests back to back while abort_all fires
# Retraction: 8 concurrent ~1,900-token prompts, 70 new tokens each, 8,192-token KV pool. SGLang
# admits requests so that their growth fits (a 2,048-token context fills at most 4 x 32 pages), so
# this load alone rarely retracts; the retracting server also retracts every RETRACT_EVERY decode
# steps through SGLang's own test switch, which takes the same path as a full pool
# (ScheduleBatch.retract_decode).
# 70 new tokens: at 140 the slowest retracted request took 876 s of the 900 s request timeout on an
# idle 2-core machine (a 32-minute test) and timed out on a busy one. At 70 the switch below still
# retracts (every RETRACT_EVERY decode steps; the test asserts retractions happened).
PRESSURE_PROMPTS, PRESSURE_LEN, PRESSURE_NEW = 8, 1880, 70
RETRACT_EVERY = 10


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("load"), config_overrides={"index_topk": 16}, seed=6
    )


@pytest.fixture(scope="module")
def prompts(model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    vocab = len(tok)
    if TEXT.exists():
        ids = tok(TEXT.read_text()[:40000])["input_ids"]
    else:
        ids = [(7 * i + 3) % (vocab - 2) + 1 for i in range(8000)]
    # Ragged lengths 10..69, most above index_topk (16).
    return [ids[300 * i: 300 * i + 10 + (37 * i) % 60] for i in range(N_CLIENTS + N_DISCONNECT + 1)]


@pytest.fixture(scope="module")
def server(model):
    args = ["--max-running-requests", str(MAX_RUNNING), "--enable-metrics"]
    if MTP_ON:
        args += MTP_ARGS
    with http_server(model, *args) as url:
        yield url


def process_group_rss(url) -> int:
    """Sum of RSS over the server's process group (found from the launcher's --port)."""
    port = str(urlparse(url).port)
    launcher = None
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "sglang_glm.cpu_compat.launch_server" in cmd and port in cmd:
            launcher = p
            break
    assert launcher is not None, "server launcher process not found"
    pgid = os.getpgid(launcher.pid)
    total = 0
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                total += p.memory_info().rss
        except (psutil.Error, ProcessLookupError):
            pass
    return total


def metrics(url) -> dict[str, float]:
    text = requests.get(f"{url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(sglang:[a-z_]+)(?:\{[^}]*\})?\s+([-0-9.e+]+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def wait_idle(url, timeout=IDLE_TIMEOUT) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        m = metrics(url)
        if m.get("sglang:num_running_reqs", 0) == 0 and m.get("sglang:num_queue_reqs", 0) == 0:
            return time.time() - t0
        time.sleep(0.5)
    pytest.fail(f"server still busy {timeout}s after the round: {metrics(url)}")


GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def run_client(url, i, prompt, rid):
    """One client, by kind: /generate, /generate streamed, /v1/completions. Returns (rid, ids)."""
    kind = i % 3
    if kind == 0:
        r = requests.post(f"{url}/generate", timeout=TIMEOUT,
                          json={"input_ids": prompt, "sampling_params": GREEDY, "rid": rid})
        r.raise_for_status()
        out = r.json()
        return out["meta_info"]["id"], out["output_ids"]
    if kind == 1:
        last = None
        with requests.post(f"{url}/generate", stream=True, timeout=TIMEOUT,
                           json={"input_ids": prompt, "sampling_params": GREEDY, "rid": rid,
                                 "stream": True}) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    last = json.loads(line[6:])
        return last["meta_info"]["id"], last["output_ids"]
    r = requests.post(f"{url}/v1/completions", timeout=TIMEOUT,
                      json={"model": "default", "prompt": prompt, "max_tokens": NEW_TOKENS,
                            "temperature": 0, "ignore_eos": True, "return_token_ids": True,
                            "rid": rid})
    r.raise_for_status()
    out = r.json()
    return out["id"], out["choices"][0]["token_ids"]


@contextlib.contextmanager
def long_stream(url, prompt, rid):
    """An open streaming /generate of LONG_TOKENS greedy tokens (closed on exit, read or not)."""
    with requests.post(f"{url}/generate", stream=True, timeout=TIMEOUT,
                       json={"input_ids": prompt, "rid": rid, "stream": True,
                             "sampling_params": {"temperature": 0, "max_new_tokens": LONG_TOKENS,
                                                 "ignore_eos": True}}) as r:
        r.raise_for_status()
        yield r


def disconnecting_client(url, prompt, rid, start: threading.Event):
    """Streams a long request, reads a few chunks, then drops the connection."""
    start.wait()
    chunks = 0
    with long_stream(url, prompt, rid) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                chunks += 1
                if chunks >= 3:
                    break
    return chunks  # leaving the with-block closes the socket mid-stream


def parallel_disconnecting_client(url, prompt, rid, start: threading.Event):
    """Streams a greedy n=3 request and drops the connection after the first chunk."""
    start.wait()
    with requests.post(f"{url}/generate", stream=True, timeout=TIMEOUT,
                       json={"input_ids": prompt, "rid": rid, "stream": True, "sampling_params": {
                           "temperature": 0, "max_new_tokens": LONG_TOKENS, "ignore_eos": True,
                           "n": 3}}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                return 1
    return 0


def abort_api_client(url, prompt, rid, start: threading.Event):
    """Streams a long request and aborts it through /abort_request after the first chunk."""
    start.wait()
    last, aborted = None, False
    with long_stream(url, prompt, rid) as r:
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                last = json.loads(line[6:])
                if not aborted:
                    a = requests.post(f"{url}/abort_request", json={"rid": rid}, timeout=30)
                    assert a.status_code == 200, a.text
                    aborted = True
    return last


def test_load_rounds(server, prompts):
    regular = prompts[:N_CLIENTS]
    extra = prompts[N_CLIENTS:]

    # Each request alone first: the reference every loaded answer must equal.
    alone = []
    for i, p in enumerate(regular):
        _, ids = run_client(server, i, p, f"alone-{i}-{uuid.uuid4().hex[:8]}")
        assert len(ids) == NEW_TOKENS
        alone.append(ids)
    assert len({tuple(a) for a in alone}) > N_CLIENTS // 2, "degenerate model: outputs all alike"

    rss = {}
    storm = []  # (completed, aborted) per round
    for rnd in range(1, ROUNDS + 1):
        start = threading.Event()
        rids = [f"r{rnd}-c{i}-{uuid.uuid4().hex[:8]}" for i in range(N_CLIENTS)]

        def regular_client(i):
            start.wait()
            return run_client(server, i, regular[i], rids[i])

        t0 = time.time()
        with ThreadPoolExecutor(max_workers=N_CLIENTS + N_DISCONNECT + 1) as pool:
            futs = [pool.submit(regular_client, i) for i in range(N_CLIENTS)]
            drops = [pool.submit(disconnecting_client, server, extra[k],
                                 f"r{rnd}-drop{k}-{uuid.uuid4().hex[:8]}", start)
                     for k in range(N_DISCONNECT)]
            abort = pool.submit(abort_api_client, server, extra[-1],
                                f"r{rnd}-abort-{uuid.uuid4().hex[:8]}", start)
            parallel_drop = pool.submit(parallel_disconnecting_client, server, extra[0],
                                        f"r{rnd}-n3drop-{uuid.uuid4().hex[:8]}", start)
            start.set()
            results = [f.result(timeout=2 * TIMEOUT) for f in futs]
            drop_chunks = [f.result(timeout=2 * TIMEOUT) for f in drops]
            abort_last = abort.result(timeout=2 * TIMEOUT)
            assert parallel_drop.result(timeout=2 * TIMEOUT) == 1
        elapsed = time.time() - t0

        # Every request completed under its own rid, with its single-request tokens.
        got_rids = [r for r, _ in results]
        assert len(results) == N_CLIENTS
        for i, (rid, ids) in enumerate(results):
            assert rids[i] in rid, f"round {rnd} client {i}: answer for {rid}, sent {rids[i]}"
            assert ids == alone[i], f"round {rnd} client {i}: {ids} != alone {alone[i]}"
        assert len(set(got_rids)) == N_CLIENTS
        assert all(c >= 3 for c in drop_chunks)
        assert abort_last is not None
        assert abort_last["meta_info"]["finish_reason"]["type"] == "abort", abort_last["meta_info"]
        assert abort_last["meta_info"]["completion_tokens"] < LONG_TOKENS

        # Aborted requests are gone: the server goes idle, not after LONG_TOKENS decode steps.
        wait_idle(server)
        storm.append(abort_all_storm(server, rnd, regular, alone))
        wait_idle(server)
        # And it still serves, with the same tokens.
        assert run_client(server, 0, regular[0], f"after-{rnd}-{uuid.uuid4().hex[:8]}")[1] == alone[0]
        time.sleep(2)
        rss[rnd] = process_group_rss(server)
        print(f"round {rnd}: {elapsed:.1f}s, process-group RSS {rss[rnd] / 2**20:.1f} MiB")

    completed, aborted = map(sum, zip(*storm))
    assert completed > 0 and aborted > 0, f"abort_all storms: {completed} completed, {aborted} aborted"
    drift = abs(rss[ROUNDS] - rss[2]) / rss[2]
    assert drift <= RSS_TOLERANCE, (
        f"process-group RSS after round {ROUNDS} is {rss[ROUNDS] / 2**20:.1f} MiB, after round 2 "
        f"{rss[2] / 2**20:.1f} MiB ({drift:.1%} apart, limit {RSS_TOLERANCE:.0%})"
    )


def storm_client(url, k, regular, alone, stop: threading.Event, rnd) -> tuple[int, int]:
    """Sends /generate requests back to back until `stop`; (completed, aborted) counts."""
    completed = aborted = 0
    i = k
    while not stop.is_set():
        idx = i % len(regular)
        r = requests.post(f"{url}/generate", timeout=TIMEOUT, json={
            "input_ids": regular[idx], "sampling_params": GREEDY,
            "rid": f"r{rnd}-storm{k}-{i}-{uuid.uuid4().hex[:8]}"})
        out = r.json()
        meta = out.get("meta_info") if r.status_code == 200 else None
        if meta is None or meta["finish_reason"]["type"] == "abort":
            # An abort may answer with an error body; a partial output is a prefix of the real one.
            partial = out.get("output_ids", []) if isinstance(out, dict) else []
            assert alone[idx][:len(partial)] == partial, (idx, partial, alone[idx])
            aborted += 1
        else:
            assert out["output_ids"] == alone[idx], (idx, out["output_ids"], alone[idx])
            completed += 1
        i += STORM_CLIENTS
    return completed, aborted


def abort_all_storm(url, rnd, regular, alone):
    """abort_all every ABORT_ALL_EVERY_S for ABORT_ALL_FOR_S while STORM_CLIENTS keep sending."""
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=STORM_CLIENTS) as pool:
        clients = [pool.submit(storm_client, url, k, regular, alone, stop, rnd)
                   for k in range(STORM_CLIENTS)]
        t_end = time.time() + ABORT_ALL_FOR_S
        while time.time() < t_end:
            time.sleep(ABORT_ALL_EVERY_S)
            a = requests.post(f"{url}/abort_request", json={"abort_all": True}, timeout=30)
            assert a.status_code == 200, a.text
        stop.set()
        counts = [c.result(timeout=2 * TIMEOUT) for c in clients]
    completed, aborted = map(sum, zip(*counts))
    print(f"round {rnd}: abort_all storm: {completed} completed, {aborted} aborted")
    return completed, aborted


@pytest.fixture(scope="module")
def retracting_server(model):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SGLANG_TEST_RETRACT", "1")
        env.setenv("SGLANG_TEST_RETRACT_INTERVAL", str(RETRACT_EVERY))
        with http_server(model, "--max-running-requests", str(MAX_RUNNING), "--enable-metrics",
                         *MTP_ARGS) as url:
            yield url


def test_retraction_mid_speculation(server, retracting_server, model):
    """Requests retracted mid-speculation and run again end with their single-request tokens
    (single-request tokens from the server that does not retract)."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(model)))
    # Within the tiny checkpoint's 2,048-token context with the new tokens.
    prompts = [[(31 * i + 17 * k) % (vocab - 2) + 1 for k in range(PRESSURE_LEN + 2 * i)]
               for i in range(PRESSURE_PROMPTS)]
    params = {"temperature": 0, "max_new_tokens": PRESSURE_NEW, "ignore_eos": True}

    def generate(url, prompt):
        r = requests.post(f"{url}/generate", timeout=TIMEOUT,
                          json={"input_ids": prompt, "sampling_params": params})
        r.raise_for_status()
        return r.json()

    alone = [generate(server, p)["output_ids"] for p in prompts]
    with ThreadPoolExecutor(max_workers=PRESSURE_PROMPTS) as pool:
        together = list(pool.map(lambda p: generate(retracting_server, p), prompts))
    retractions = [o["meta_info"]["num_retractions"] for o in together]
    print(f"retractions per request: {retractions}")
    assert sum(retractions) > 0, "no request was retracted: the test does not exercise retraction"
    # Batching changes float32 rounding: a near-tie may flip, and the rest is then checked against
    # the float64 reference instead of the single-request tokens.
    ties = [assert_same_up_to_near_tie(model, prompts[i], out["output_ids"], alone[i],
                                       f"prompt {i} after {retractions[i]} retractions")
            for i, out in enumerate(together)]
    print(f"near-tie flips: {sum(ties)} of {len(ties)} requests")
    wait_idle(retracting_server)
    assert generate(retracting_server, prompts[0])["output_ids"] == alone[0]
