"""Acceptance of the GPU suite's trained-model MTP test (`tests/gpu/test_mtp_trained_gpu.py`) served on the CPU:
the same model, prompts, draft shapes and 48 new tokens, float32, SGLang's CPU engine. The GPU test's bounds
(above 1.8 tokens a round on average, the first draft accepted in over half of each request's rounds) sit
below these figures.

    python benchmarks/mtp/trained_gpu_test_acceptance.py   # -> benchmarks/mtp/trained_gpu_test_acceptance.json
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("GLM_GPU_TRAINED_MODEL", str(ROOT / "assets" / "glm5-geometry-carry"))
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "gpu")]


def main() -> None:
    from sglang_glm.cpu_compat import activate

    activate()
    import test_mtp_trained_gpu as t
    from gpu_serving import CHAIN, TREE
    from serving import engine

    def flag(args, name):
        return int(args[args.index(name) + 1])

    prompts = t.heldout_prompts()
    params = {"temperature": 0, "max_new_tokens": t.NEW_TOKENS, "ignore_eos": True}
    rows = {}
    for name, args in (("chain", CHAIN), ("tree", TREE)):
        with engine(t.MODEL, speculative_algorithm="EAGLE", speculative_num_steps=flag(args, "--speculative-num-steps"),
                    speculative_eagle_topk=flag(args, "--speculative-eagle-topk"),
                    speculative_num_draft_tokens=flag(args, "--speculative-num-draft-tokens")) as llm:
            outs = llm.generate(input_ids=prompts, sampling_params=params)
            outs += llm.generate(input_ids=prompts[:1], sampling_params=params)  # the test's batch-1 request
        rows[name] = {"spec_accept_length": [o["meta_info"]["spec_accept_length"] for o in outs],
                      "spec_accept_per_position": [o["meta_info"]["spec_accept_per_position"] for o in outs]}
        print(name, json.dumps(rows[name]), flush=True)
    out = Path(__file__).with_suffix(".json")
    out.write_text(json.dumps({"hardware": f"CPU ({os.cpu_count()} cores), float32", "model": str(t.MODEL.name),
                               "prompt_lengths": [len(p) for p in prompts], **rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
