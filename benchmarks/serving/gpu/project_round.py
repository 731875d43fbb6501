"""Project the GLM-5.2-shaped speculative round (8 layers) to the full 78-layer GLM-5.2 (issue 29).

Reads profile_decode.py's JSON for the plain step (`indexcache`) and the EAGLE round (`eagle_3_4`) at
each batch, both on make_glm52_shaped.py's model, and scales what grows with depth. GPU kernel time is
used, not wall time: at 78 layers a round is ~50 ms of GPU work and the ~4 ms of host work per round
seen at 8 layers hides behind it.

    plain(N)  = H + body(N)               H: the LM head (the one GEMM launched once per plain step)
    verify(N) = H + verify_body(N)        the target verify of steps+1 tokens per request
    round(N)  = verify(N) + D             D: draft steps + draft-extend + accept ops; one MTP layer,
                                          so it does not grow with N

Two ways to grow the body, which bracket the answer:
- uniform: every layer costs the 8-layer model's average (its mix is 3 dense + 5 MoE);
- MoE-weighted: GLM-5.2 is 3 dense + 75 MoE; a MoE layer costs a dense one plus the measured
  "MoE experts" time per MoE layer, and the verify's whole excess over the plain step is charged to
  the MoE layers (4 tokens per request route to up to 4x the experts; the pessimistic reading).

    python project_round.py --profiles results/round_profile_glm52 --out results/glm52_projection.json

Speedup = acceptance x plain(N) / round(N); acceptance 3.48 is SGLang's published GLM-5-FP8 EAGLE
3/1/4 figure (glm-dsa-facts), 3.65 the trained carry model's here.

Checked against a measurement (session 24, results/glm52_deep_proxy.json): a 40-layer proxy served a
batch-1 round at 1.73 plain steps where session 15's profiles project 1.34-1.41 for 40 layers. Those
profiles predate the tuned block-FP8 GEMM configs, which sped the plain step up more than the verify:
profile the tree being projected (`gpu_bench.sh rounds`) before reading a projection.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DRAFT_PHASES = ("draft steps", "draft-extend", "verify/accept (eager ops)")


def load(profiles: Path, config: str, batch: int) -> dict:
    (path,) = profiles.glob(f"profile_{config}_b{batch}_ctx*.json")
    return json.loads(path.read_text())


def lm_head_us(plain: dict) -> float:
    """The largest kernel launched exactly once per plain step: the LM head GEMM."""
    once = [k for k in plain["top_kernels_us_per_step"] if abs(k["launches"] - 1.0) < 1e-6]
    return max(once, key=lambda k: k["us"])["us"]


def project(plain: dict, eagle: dict, layers: int, dense: int) -> dict:
    n = plain["num_hidden_layers"]
    moe_layers = n - dense
    head = lm_head_us(plain)
    step = plain["gpu_busy_us_per_step"]
    phases = eagle["spec_round"]["phases_per_round"]
    verify = phases["target verify"]["gpu_us"]
    draft = sum(phases[p]["gpu_us"] for p in DRAFT_PHASES)
    body, verify_body = step - head, verify - head

    uniform_plain = head + body * layers / n
    uniform_round = head + verify_body * layers / n + draft

    experts = plain["families_us_per_step"]["MoE experts"]["us"] / moe_layers
    dense_layer = (body - moe_layers * experts) / n        # body = n dense-layer costs + experts
    excess = (verify - step) / moe_layers
    moe_plain = head + layers * dense_layer + (layers - dense) * experts
    moe_round = moe_plain + (layers - dense) * excess + draft

    return {
        "measured_8_layers": {"plain_step_us": step, "round_us": verify + draft, "verify_us": verify,
                              "draft_side_us": round(draft, 1), "lm_head_us": head,
                              "round_in_plain_steps": round((verify + draft) / step, 3)},
        "uniform": {"plain_step_us": round(uniform_plain), "round_us": round(uniform_round),
                    "round_in_plain_steps": round(uniform_round / uniform_plain, 3)},
        "moe_weighted": {"plain_step_us": round(moe_plain), "round_us": round(moe_round),
                         "round_in_plain_steps": round(moe_round / moe_plain, 3)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--dense", type=int, default=3, help="leading dense layers (first_k_dense_replace)")
    ap.add_argument("--accept", type=float, nargs="+", default=[3.48, 3.65])
    args = ap.parse_args()

    result = {"layers": args.layers, "basis": "GPU kernel time per step/round, one H200, profile_decode.py",
              "batch": {}}
    lines = [f"| batch | 8 layers: round in plain steps | {args.layers} layers: uniform | MoE-weighted | "
             + " | ".join(f"speedup at accept {a}" for a in args.accept) + " |",
             "|---|---|---|---|" + "---|" * len(args.accept)]
    for b in args.batches:
        plain, eagle = load(args.profiles, "indexcache", b), load(args.profiles, "eagle_3_4", b)
        p = project(plain, eagle, args.layers, args.dense)
        steps = (p["uniform"]["round_in_plain_steps"], p["moe_weighted"]["round_in_plain_steps"])
        p["speedup"] = {str(a): [round(a / s, 2) for s in sorted(steps, reverse=True)] for a in args.accept}
        result["batch"][str(b)] = p
        lines.append(f"| {b} | {p['measured_8_layers']['round_in_plain_steps']:.2f} | {steps[0]:.2f} | {steps[1]:.2f} | "
                     + " | ".join(f"{lo:.2f}-{hi:.2f}x" for lo, hi in p["speedup"].values()) + " |")
    args.out.write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
