"""What the GPU suite shares: GLM-5.2-geometry checkpoints, an HTTP server on the GPU, and the
agreement rule that compares bfloat16 served tokens with the float64 reference.

The agreement rule (issue 11). SGLang keeps DSA KV in bfloat16 on Hopper, so served tokens are
not float32-exact. For each generated token we run the float64 reference teacher-forced on the
served sequence and look at its top-2 logit margin at that position:
  - reference argmax == served token                 -> agree
  - different, margin <= MARGIN                       -> near-tie: counted apart, never a failure
  - different, margin >  MARGIN                       -> disagree: a failure
MARGIN rests on the rounding error measured against the same reference: the served log-prob of
each generated token against the reference's (`max_logprob_error`). A margin above twice the
largest error cannot be flipped by rounding, so each run asserts the error stays under margin / 2
(measured on the H200: 0.06-0.18 for bfloat16 weights, BF16 or FP8 KV; 0.26-0.35 for the controls)
and that near-ties stay a small fraction, so the rule cannot pass by calling everything a tie.
FP8 weights are served by w8a8 GEMMs whose e4m3 activations round further (0.12-0.24, H200 and
H100, sessions 18-28, the reference rounding them too): an FP8 checkpoint is judged at FP8_MARGIN.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sglang_glm_tools.server import launched_server

MARGIN = 0.4  # nats of the reference's top-2 logit gap
FP8_MARGIN = 0.6  # an FP8-weight checkpoint's: half of it stays above its rounding error
MAX_NEAR_TIE_FRACTION = 0.25

# GLM-5.2's per-layer attention geometry (MLA 512 + 64 rope, 192/256 head dims, 32 x 128 indexer)
# on a small residual stream, 4 layers (GLM-5.2 plan rule: layers 0-2 full, 3 shared), MoE with a
# shared expert, one MTP layer. index_topk 128 so that prompts of a few hundred tokens are sparse.
GLM52_TINY = dict(
    vocab_size=512, hidden_size=512, intermediate_size=512, moe_intermediate_size=128,
    num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=256,
    kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256,
    index_n_heads=32, index_head_dim=128, index_topk=128, index_topk_freq=4, index_skip_topk_offset=3,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
    n_group=1, topk_group=1, routed_scaling_factor=2.5, max_position_embeddings=8192,
    rope_parameters={"rope_type": "default", "rope_theta": 8e6}, bos_token_id=0, eos_token_id=0,
    index_share_for_mtp_iteration=True,
)
PLAN = "FFFS"

# Ragged prompts, three longer than index_topk; one prompt longer than the chunk size below.
PROMPTS = [[(7 * i + 3) % 500 + 2 for i in range(n)] for n in (700, 321, 97, 19)]
LONG_PROMPT = [(5 * i + 7) % 500 + 2 for i in range(1300)]
ALL_PROMPTS = PROMPTS + [LONG_PROMPT]
NEW_TOKENS = 24

# EAGLE through the MTP layer: a chain (3 steps, 4 verified tokens) and a tree (top-2 per step, 6 tokens)
CHAIN = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")
TREE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "6")

# Servers share the one GPU: small pools, a few CUDA-graph batch sizes.
GPU_SERVER_ARGS = (
    "--dtype", "bfloat16", "--mem-fraction-static", "0.06", "--max-total-tokens", "32768",
    "--max-running-requests", "16", "--cuda-graph-max-bs-decode", "16", "--chunked-prefill-size", "512",
    "--sampling-backend", "pytorch", "--grammar-backend", "none", "--log-level", "info",
)


# SGLang sizes its KV pool from the free memory it sees after loading weights; a neighbour server
# loading at the same moment on the shared GPU can make that look like no room at all.
MEMORY_RACE = "leave no GPU memory for the KV cache"

# Servers and engines started from the suite import the test-side stand-ins (standins/README.md).
STANDINS = Path(__file__).parent / "standins"
if torch.cuda.is_available():
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDINS), os.environ.get("PYTHONPATH")) if p)


def results_dir() -> Path:
    path = Path(os.environ.get("GLM_GPU_RESULTS", "/tmp/glm_gpu_results"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def make_model(root: Path, name: str, **kw) -> Path:
    """A GLM-5.2-geometry checkpoint, made once per run (pytest-xdist workers share it)."""
    from filelock import FileLock

    from sglang_glm_tools.checkpoint import make_tiny_checkpoint

    path = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (path / "config.json").exists():
            overrides = dict(GLM52_TINY)
            overrides.update(kw.pop("overrides", {}))
            make_tiny_checkpoint(path, config_overrides=overrides, **kw)
    return path


@contextlib.contextmanager
def gpu_server(model_path, name: str, *args: str, timeout: float = 420.0, env: dict | None = None):
    """`python -m sglang.launch_server` with the plugin, on the GPU; its log goes to the results."""
    def command(port):
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
                "--host", "127.0.0.1", "--port", str(port), *GPU_SERVER_ARGS, *args]

    log = results_dir() / f"server_{name}.log"
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with launched_server(command, log, timeout, transient=(MEMORY_RACE,)) as url:
            yield url
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def post(url: str, path: str, body: dict, timeout: float = 300.0):
    import requests

    r = requests.post(url + path, json=body, timeout=timeout)
    r.raise_for_status()
    return r.json()


def generate(url: str, prompts: list[list[int]], max_new_tokens: int = NEW_TOKENS, **sampling) -> list[dict]:
    """One batched /generate, greedy unless told; with each generated token's log-prob."""
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True, **sampling}
    out = post(url, "/generate", {"input_ids": prompts, "sampling_params": params, "return_logprob": True})
    return out if isinstance(out, list) else [out]


def tokens(outs: list[dict]) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


# ---- the oracle -------------------------------------------------------------------------------


_REFERENCES: dict = {}


def reference(path, dense: bool = False):
    from sglang_glm_tools.reference import load_reference_model

    key = (str(path), dense)
    if key not in _REFERENCES:
        _REFERENCES[key] = load_reference_model(path, dtype=torch.float64, device="cuda", fp8_activations=True)
    return _REFERENCES[key]


@dataclass
class Agreement:
    positions: int = 0
    agree: int = 0
    near_ties: int = 0
    disagree: list = field(default_factory=list)  # (request, position, served, reference, margin)
    max_logprob_error: float = 0.0
    margin: float = MARGIN

    def as_dict(self) -> dict:
        return {"positions": self.positions, "agree": self.agree, "near_ties": self.near_ties,
                "disagree": len(self.disagree), "first_disagreements": self.disagree[:5],
                "max_logprob_error": self.max_logprob_error, "margin": self.margin}

    def __add__(self, other: "Agreement") -> "Agreement":
        """Two judgments of one server as one: the near-tie bound is a fraction of all its positions."""
        assert self.margin == other.margin, (self.margin, other.margin)
        return Agreement(self.positions + other.positions, self.agree + other.agree,
                         self.near_ties + other.near_ties, self.disagree + other.disagree,
                         max(self.max_logprob_error, other.max_logprob_error), self.margin)

    def assert_agrees(self) -> None:
        assert self.positions > 0, "nothing was judged"
        assert not self.disagree, f"served tokens disagree with the reference above the margin: {self.as_dict()}"
        assert self.near_ties <= MAX_NEAR_TIE_FRACTION * self.positions, self.as_dict()
        assert self.max_logprob_error <= self.margin / 2, (
            f"rounding error {self.max_logprob_error:.3f} exceeds half the margin, the bound the rule "
            f"rests on: {self.as_dict()}"
        )


@torch.no_grad()
def agreement(path, prompts, outs: list[dict], dense: bool = False) -> Agreement:
    """Teacher-forced float64 reference over each served sequence, judged by the margin rule at the
    checkpoint's margin."""
    model = reference(path, dense)
    result = Agreement(margin=FP8_MARGIN if model.fp8_weights else MARGIN)
    for r, (prompt, out) in enumerate(zip(prompts, outs)):
        served = out["output_ids"]
        ids = torch.tensor([prompt + served], device="cuda")
        logits = model(ids, dense=dense).logits[0, len(prompt) - 1 : -1].double()  # predicts served
        logprobs = torch.log_softmax(logits, -1)
        top2 = logits.topk(2, dim=-1)
        served_lp = [lp for lp, *_ in out["meta_info"].get("output_token_logprobs") or []]
        for i, token in enumerate(served):
            result.positions += 1
            if served_lp:
                err = abs(served_lp[i] - float(logprobs[i, token]))
                result.max_logprob_error = max(result.max_logprob_error, err)
            ref_token = int(top2.indices[i, 0])
            margin = float(top2.values[i, 0] - top2.values[i, 1])
            if ref_token == token:
                result.agree += 1
            elif margin <= result.margin:
                result.near_ties += 1
            else:
                result.disagree.append((r, i, token, ref_token, round(margin, 3)))
    return result


def record(name: str, **data) -> None:
    """One JSON line per check in the run's results (the committed log shows them)."""
    with open(results_dir() / "records.jsonl", "a") as f:
        f.write(json.dumps({"check": name, **data}, default=str) + "\n")
    print(f"RECORD {name}: {json.dumps(data, default=str)[:2000]}", flush=True)


def assert_per_position_acceptance(outs: list[dict], args) -> None:
    """Each request's `spec_accept_per_position` is what SGLang's histogram of correct drafts says:
    position k is accepted in a round iff at least k drafts were."""
    steps = int(args[args.index("--speculative-num-steps") + 1])
    for o in outs:
        rates, hist = o["meta_info"].get("spec_accept_per_position"), o["meta_info"]["spec_correct_drafts_histogram"]
        assert rates == [sum(hist[k:]) / sum(hist) for k in range(1, steps + 1)], (rates, hist)


def serve_and_judge(url, path, name):
    """The request set every configuration serves; returns (tokens, agreement, outputs)."""
    first = generate(url, PROMPTS)
    long = generate(url, [LONG_PROMPT])
    again = generate(url, PROMPTS[:2])  # the same prefixes again: radix-cache hits
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in again), [o["meta_info"] for o in again]
    # A hit shrinks the batch, and with it the kernels' launch shapes, so bfloat16 sums may round
    # differently. The repeat is judged by the same margin rule: where two runs part, at most one
    # matches the reference, so a parting anywhere but at a near tie fails.
    outs = first + long
    result = agreement(path, ALL_PROMPTS + PROMPTS[:2], outs + again)
    record(name, identical_after_cache_hit=tokens(again) == tokens(first[:2]), **result.as_dict())
    return tokens(outs), result, outs
