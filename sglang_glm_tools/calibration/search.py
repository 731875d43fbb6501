"""Greedy IndexCache search (in the spirit of arXiv 2603.12201) with a resumable log.

Start from every layer that has indexer weights full; at each step evaluate, for every full layer
but layer 0, the current plan with that layer shared, and share the one whose sharing gives the
lowest calibration loss; stop when `budget` full layers remain. The plans are nested, so one run
down to N also gives the searched pattern for every budget above N.

The loss comes from an evaluator (`Evaluator` below); the search itself needs no SGLang, which
keeps it testable with a synthetic loss. Ties go to the higher layer index.

The log is JSON lines: a header (what the run computes on), then `base`, `candidate` and `commit`
events. `--resume` replays it: committed steps are not recomputed, and candidates already
evaluated in the step that was interrupted are not evaluated again.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

from sglang_glm_tools.calibration import CalibrationError
from sglang_glm.layer_plan import SHARED, LayerPlan


class Evaluator(Protocol):
    def set_base(self, plan: LayerPlan) -> float:
        """Loss of `plan`; it becomes the plan candidates are derived from."""

    def candidate(self, layer: int) -> float:
        """Loss of the base plan with `layer` shared (the base plan is unchanged)."""

    def commit(self, layer: int) -> float:
        """Share `layer` in the base plan; the new base plan's loss."""


def share(plan: LayerPlan, layer: int) -> LayerPlan:
    if layer == 0:
        raise ValueError("layer 0 cannot be shared")
    kinds = list(plan.kinds)
    kinds[layer] = SHARED
    return LayerPlan(tuple(kinds), "search")


@dataclass
class Step:
    num_full: int
    pattern: str
    loss: float
    shared_layer: Optional[int]  # the layer this step made shared (None for the start)
    candidates: dict[int, float]  # loss of each candidate evaluated in this step


class SearchLog:
    """Append-only JSON-lines log; `header` identifies what the losses were computed on."""

    def __init__(self, path: Path, header: dict, resume: bool):
        self.path = Path(path)
        self.events: list[dict] = []
        existing = self.path.read_text().splitlines() if self.path.exists() else []
        if len([l for l in existing if l.strip()]) > 1:  # more than a header: losses logged
            if not resume:
                raise CalibrationError(
                    f"{self.path} already holds a search log; pass --resume to continue it or "
                    f"choose another --out directory"
                )
            lines = [json.loads(l) for l in existing if l.strip()]
            old = lines[0] if lines and lines[0].get("event") == "header" else None
            if old is None or old["run"] != header:
                differing = sorted(
                    k for k in set(header) | set((old or {}).get("run", {}))
                    if (old or {}).get("run", {}).get(k) != header.get(k)
                )
                raise CalibrationError(
                    f"--resume: {self.path} was written for a different run (differs in "
                    f"{differing}); rerun with the same --model/--data/--seq-len/--max-tokens/"
                    f"--objective, or start afresh in another --out directory"
                )
            self.events = lines[1:]
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
            self._append({"event": "header", "run": header})

    def _append(self, event: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(event) + "\n")

    def record(self, event: dict) -> None:
        self.events.append(event)
        self._append(event)

    def find(self, event: str, **match) -> Optional[dict]:
        for e in self.events:
            if e["event"] == event and all(e.get(k) == v for k, v in match.items()):
                return e
        return None


def greedy_search(
    evaluator: Evaluator,
    start: LayerPlan,
    budget: int,
    log: SearchLog,
    progress: Callable[[str], None] = print,
) -> list[Step]:
    """Steps from `start` down to `budget` full layers (steps[0] is `start` itself)."""
    if not 1 <= budget <= len(start.full_layers):
        raise CalibrationError(
            f"--full-layers {budget} is out of range: the search starts from "
            f"{len(start.full_layers)} full layers, so the budget must be 1..{len(start.full_layers)}"
        )
    plan = start
    base = log.find("base", pattern=plan.pattern)
    steps = [Step(len(plan.full_layers), plan.pattern, None, None, {})]
    # Replay committed steps.
    while (done := log.find("commit", from_pattern=plan.pattern)) is not None and len(
        plan.full_layers
    ) > budget:
        steps[-1].candidates = _logged_candidates(log, plan.pattern)
        plan = share(plan, done["shared_layer"])
        steps.append(Step(len(plan.full_layers), plan.pattern, done["loss"], done["shared_layer"], {}))
    if base is not None:
        steps[0].loss = base["loss"]
    if len(steps) > 1:
        progress(f"resumed: {len(steps) - 1} committed steps replayed, now at {plan.pattern}")
    if len(plan.full_layers) == budget and steps[0].loss is not None:
        return steps

    t0 = time.time()
    loss = evaluator.set_base(plan)
    if steps[0].loss is None:
        steps[0].loss = loss
        log.record({"event": "base", "pattern": plan.pattern, "loss": loss})
    elif abs(steps[-1].loss - loss) > 1e-6 * max(1.0, abs(loss)):
        raise CalibrationError(
            f"--resume: the logged loss of {plan.pattern} is {steps[-1].loss:.6f} but it now "
            f"evaluates to {loss:.6f}; the model or data changed since the log was written. "
            f"Start afresh in another --out directory"
        )
    progress(
        f"start {plan.pattern}: {len(plan.full_layers)} full layers, loss {loss:.5f} "
        f"({time.time() - t0:.1f} s per forward)"
    )
    total_steps = len(start.full_layers) - budget
    while len(plan.full_layers) > budget:
        step_no = len(start.full_layers) - len(plan.full_layers) + 1
        candidates = [layer for layer in plan.full_layers if layer != 0]
        results = _logged_candidates(log, plan.pattern)
        current = steps[-1].loss
        for n, layer in enumerate(candidates, 1):
            if layer in results:
                continue
            t = time.time()
            results[layer] = evaluator.candidate(layer)
            log.record({"event": "candidate", "pattern": plan.pattern, "layer": layer,
                        "loss": results[layer]})
            progress(
                f"[step {step_no}/{total_steps}] {len(plan.full_layers)} -> "
                f"{len(plan.full_layers) - 1} full, candidate {n}/{len(candidates)}: share layer "
                f"{layer}: loss {results[layer]:.5f} ({results[layer] - current:+.5f}) "
                f"[{time.time() - t:.1f} s]"
            )
        best = min(candidates, key=lambda layer: (results[layer], -layer))
        steps[-1].candidates = results
        new_loss = evaluator.commit(best)
        if abs(new_loss - results[best]) > 1e-6 * max(1.0, abs(new_loss)):
            raise RuntimeError(
                f"committing layer {best} gave loss {new_loss} but its candidate evaluation gave "
                f"{results[best]}: the cached evaluation is inconsistent"
            )
        log.record({"event": "commit", "from_pattern": plan.pattern, "shared_layer": best,
                    "pattern": share(plan, best).pattern, "loss": new_loss,
                    "num_full": len(plan.full_layers) - 1})
        plan = share(plan, best)
        steps.append(Step(len(plan.full_layers), plan.pattern, new_loss, best, {}))
        progress(
            f"[step {step_no}/{total_steps}] shared layer {best}: {plan.pattern} "
            f"({len(plan.full_layers)} full) loss {new_loss:.5f}"
        )
    return steps


def _logged_candidates(log: SearchLog, pattern: str) -> dict[int, float]:
    return {
        e["layer"]: e["loss"]
        for e in log.events
        if e["event"] == "candidate" and e["pattern"] == pattern
    }


def steps_as_dicts(steps: list[Step]) -> list[dict]:
    out = []
    for s in steps:
        d = asdict(s)
        d["candidates"] = {str(k): v for k, v in sorted(s.candidates.items())}
        out.append(d)
    return out

