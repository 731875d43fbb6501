"""Held-out loss of calibrated patterns served by sglang.Engine (the plugin), vs the tool's figure.

    python benchmarks/calibration/serve_check.py --result DIR/result.json --heldout FILE \
        --budgets 4 2 [--uniform]

For each budget it starts sglang.Engine with `json_model_override_args={"index_topk_pattern": P}`
(P = the searched pattern, and with --uniform also the uniform every-k one), sends the held-out
windows the tool used (same tokenizer, windows and token cap) with `return_logprob=True,
logprob_start_len=0`, and averages the negative input-token logprobs. Writes serve_check.json
next to result.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def served_nll(model: str, pattern: str, windows, max_tokens: int) -> float:
    import sglang as sgl

    llm = sgl.Engine(
        model_path=model, dtype="float32", device="cpu", disable_cuda_graph=True,
        skip_tokenizer_init=True, max_total_tokens=max_tokens, max_running_requests=len(windows),
        log_level="warning", json_model_override_args=json.dumps({"index_topk_pattern": pattern}),
    )
    try:
        outs = llm.generate(
            input_ids=[list(w) for w in windows],
            sampling_params={"temperature": 0, "max_new_tokens": 1},
            return_logprob=True, logprob_start_len=0,
        )
    finally:
        llm.shutdown()
    nll = [-lp for o in outs for lp, _, _ in o["meta_info"]["input_token_logprobs"][1:]]
    assert len(nll) == sum(len(w) - 1 for w in windows), "missing input logprobs"
    return sum(nll) / len(nll)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", required=True, type=Path)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--budgets", type=int, nargs="+", required=True)
    ap.add_argument("--uniform", action="store_true", help="also serve the uniform patterns")
    a = ap.parse_args()

    if not torch.cuda.is_available():
        from sglang_glm.cpu_compat import activate

        activate()
    from sglang_glm_tools.calibration.inputs import inspect_model, load_sequences, load_tokenizer

    result = json.loads(a.result.read_text())
    model = result["data"]["model"]  # absolute path (the log header's)
    info = inspect_model(model)
    windows = load_sequences(
        a.heldout, load_tokenizer(info.path), info, seq_len=result["data"]["seq_len"],
        max_tokens=result["data"]["max_tokens"], what="--heldout",
    ).token_ids
    pool = sum(len(w) for w in windows) + 64 * (len(windows) + 2)
    rows = []
    for budget in a.budgets:
        row = next(r for r in result["comparison"] if r["num_full"] == budget)
        kinds = [("searched", row["searched"], row["searched_heldout"])]
        if a.uniform:
            kinds.append(("uniform", row["uniform"], row["uniform_heldout"]))
        for kind, pattern, tool in kinds:
            t = time.time()
            served = served_nll(model, pattern, windows, pool)
            rows.append({"num_full": budget, "kind": kind, "pattern": pattern,
                         "tool_heldout": tool, "served_heldout": served,
                         "abs_diff": abs(served - tool), "seconds": round(time.time() - t, 1)})
            print(json.dumps(rows[-1]), flush=True)
    out = a.result.parent / "serve_check.json"
    out.write_text(json.dumps({"heldout": a.heldout, "windows": len(windows),
                               "tokens": sum(len(w) for w in windows), "rows": rows}, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
