"""Where a server's start-up time goes, read from its log (issue 31): SGLang's own "Engine startup
timings" line (weights, KV cache, CUDA-graph capture per phase, scheduler and tokenizer process
totals), the plugin's two warm-ups (its kernel variants when its backend starts, its prefill
warm-up requests before the server reports ready), and the wall time from the first log line to
"ready to roll". The plugin's own share: its warm-ups and the draft-extend graph its hook captures.

    python benchmarks/serving/gpu/startup_breakdown.py OUT/server_*.log     # one JSON object per log
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")
TIMINGS = re.compile(r"Engine startup timings \(s\): (.*)$")
KERNELS = re.compile(r"glm_dsa_triton: (\d+) kernel launch configurations built or loaded in ([\d.]+) s")
PREFILLS = re.compile(r"glm_dsa_prefill_shapes: (\d+) prompts of 1-(\d+) tokens served in ([\d.]+) s")


def _timings(text: str) -> dict:
    """'load_weight=0.32, cuda_graph={decode=1.0, draft_extend=2.2}, x=3' -> nested dict of floats."""
    out, stack, key = {}, [], ""
    for token in re.findall(r"[\w]+=\{|[\w]+=[\d.]+|\}", text):
        if token == "}":
            out = stack.pop()
        elif token.endswith("{"):
            inner: dict = {}
            out[token[:-2]] = inner
            stack.append(out)
            out = inner
        else:
            key, value = token.split("=")
            out[key] = float(value)
    return out


def breakdown(log: str) -> dict:
    stamps = [m.group(1) for line in log.splitlines() if (m := STAMP.match(line))]
    ready = next((STAMP.match(line).group(1) for line in log.splitlines()
                  if "ready to roll" in line and STAMP.match(line)), None)
    result: dict = {}
    if stamps and ready:
        parse = lambda s: datetime.datetime.strptime(s, "%Y-%m-%d %H:%M:%S")  # noqa: E731
        result["log_to_ready_s"] = (parse(ready) - parse(stamps[0])).total_seconds()
    engines = [_timings(m.group(1)) for line in log.splitlines() if (m := TIMINGS.search(line))]
    if engines:
        result["sglang"] = engines[0] if len(engines) == 1 else engines
    kernels = [(int(n), float(s)) for n, s in KERNELS.findall(log)]
    if kernels:
        result["plugin_kernel_warmup"] = {"launch_configs": kernels[0][0], "seconds": sum(s for _, s in kernels)}
    prefills = PREFILLS.search(log)
    if prefills:
        result["plugin_prefill_warmup"] = {"prompts": int(prefills.group(1)), "longest": int(prefills.group(2)),
                                          "seconds": float(prefills.group(3))}
    graphs = [e.get("cuda_graph", {}) for e in engines]
    result["plugin_share_s"] = round(
        result.get("plugin_kernel_warmup", {}).get("seconds", 0.0)
        + result.get("plugin_prefill_warmup", {}).get("seconds", 0.0)
        + sum(g.get("draft_extend", 0.0) for g in graphs), 2)
    return result


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(json.dumps({"log": Path(path).name, **breakdown(Path(path).read_text(errors="replace"))}))
