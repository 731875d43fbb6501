"""Serve assets/glm-dsa-mini through `sglang.launch_server` on CPU; query it over HTTP."""

import argparse
import json
import urllib.request
from pathlib import Path

from sglang_glm_tools.server import cpu_server

MODEL = Path(__file__).resolve().parent.parent / "assets" / "glm-dsa-mini"
MTP_ARGS = (
    "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6",
)


def post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--prompt", default="def fibonacci(n):\n")
    ap.add_argument("--no-mtp", action="store_true", help="serve without MTP speculative decoding")
    args = ap.parse_args()
    extra = () if args.no_mtp else MTP_ARGS
    print(f"starting SGLang on CPU: {args.model} {' '.join(extra)}", flush=True)
    with cpu_server(args.model, *extra) as url:
        out = post(f"{url}/generate", {
            "text": args.prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 64},
        })
        print("--- /generate ---\n" + args.prompt + out["text"])
        meta = out["meta_info"]
        print({k: meta[k] for k in ("prompt_tokens", "completion_tokens", "spec_accept_length") if k in meta})
        comp = post(f"{url}/v1/completions", {
            "model": args.model, "prompt": "import os\n", "max_tokens": 32, "temperature": 0,
        })
        print("--- /v1/completions ---\nimport os\n" + comp["choices"][0]["text"])


if __name__ == "__main__":
    main()
