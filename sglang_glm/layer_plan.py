"""IndexCache layer plan: which layers run the indexer ("full") and which reuse top-k ("shared").

The plan is computed once from the HF config (and an optional launch override) and passed to the
model; tools such as the calibration search build their own plans and pass them per forward.

Precedence inside one source, as transformers 5.19 `GlmMoeDsaConfig` resolves it:
`indexer_types` list, else `index_topk_pattern` string of F/S, else `index_topk_freq` with
`index_skip_topk_offset` (layer i is full iff max(i - offset + 1, 0) % freq == 0; offset
defaults to 2, which equals SGLang's offset-less rule max(i - 1, 0) % freq).
A launch override that names any plan field replaces the checkpoint's plan entirely.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FULL, SHARED = "full", "shared"
PLAN_FIELDS = ("indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset")
_PATTERN_CHARS = {"F": FULL, "S": SHARED}


class LayerPlanError(ValueError):
    """A layer plan that cannot be served; the message names the field, the value and the fix."""


@dataclass(frozen=True)
class LayerPlan:
    kinds: tuple[str, ...]
    source: str = "explicit"

    def __post_init__(self):
        for i, kind in enumerate(self.kinds):
            if kind not in (FULL, SHARED):
                raise LayerPlanError(
                    f"{self.source}: layer {i} is {kind!r}; each entry must be 'full' or 'shared'"
                )
        if self.kinds and self.kinds[0] == SHARED:
            raise LayerPlanError(
                f"{self.source}: layer 0 is 'shared' but a shared layer reuses the top-k of an "
                f"earlier full layer and layer 0 has none; make layer 0 full (pattern "
                f"{'F' + self.pattern[1:]!r})"
            )

    @classmethod
    def from_pattern(cls, pattern: str, source: str = "pattern") -> "LayerPlan":
        bad = sorted({c for c in pattern if c not in _PATTERN_CHARS})
        if bad:
            raise LayerPlanError(
                f"{source} = {pattern!r} contains {''.join(bad)!r}; use only 'F' (full: runs the "
                f"indexer) and 'S' (shared: reuses the previous full layer's top-k)"
            )
        return cls(tuple(_PATTERN_CHARS[c] for c in pattern), source)

    @classmethod
    def all_full(cls, num_layers: int) -> "LayerPlan":
        return cls((FULL,) * num_layers, "all full")

    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def pattern(self) -> str:
        return "".join("F" if k == FULL else "S" for k in self.kinds)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.kinds) if k == FULL)

    def is_full(self, layer_id: int) -> bool:
        return self.kinds[layer_id] == FULL

    def source_layer(self, layer_id: int) -> int:
        """The full layer whose top-k `layer_id` uses (itself when full)."""
        return max(i for i in self.full_layers if i <= layer_id)

    def describe(self) -> str:
        return (
            f"IndexCache plan ({self.source}): {self.pattern} "
            f"({len(self.full_layers)} full, {len(self) - len(self.full_layers)} shared "
            f"of {len(self)} layers)"
        )


def is_positive_int(value: Any) -> bool:
    """An integer >= 1; bool is an int in Python and is not one here."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _indexer_types(types: Any, source: str) -> tuple:
    """indexer_types as a list or its JSON text (a launch override passes either)."""
    fix = 'use a list with one entry per layer, e.g. ["full", "shared", "shared", "shared"]'
    if isinstance(types, str):
        try:
            types = json.loads(types)
        except json.JSONDecodeError:
            raise LayerPlanError(f"{source} indexer_types = {types!r} is not a JSON list; {fix}") from None
    if not isinstance(types, (list, tuple)):
        raise LayerPlanError(f"{source} indexer_types = {types!r}; {fix}")
    return tuple(types)


def _plan_from_fields(fields: Mapping[str, Any], num_layers: int, source: str) -> LayerPlan | None:
    """The plan one source (checkpoint or override) states, checking its fields agree."""
    candidates: list[LayerPlan] = []
    if fields.get("indexer_types") is not None:
        candidates.append(LayerPlan(_indexer_types(fields["indexer_types"], source), f"{source} indexer_types"))
    if fields.get("index_topk_pattern") is not None:
        pattern = fields["index_topk_pattern"]
        field = f"{source} index_topk_pattern"
        if isinstance(pattern, str):
            candidates.append(LayerPlan.from_pattern(pattern, field))
        elif isinstance(pattern, (list, tuple)):
            candidates.append(LayerPlan(tuple(pattern), field))
        else:
            raise LayerPlanError(f"{field} = {pattern!r}; use a string of F (full) and S (shared), one per "
                                 f"layer, e.g. 'FSSS'")
    if "index_topk_freq" in fields or "index_skip_topk_offset" in fields:
        freq = fields.get("index_topk_freq", 1)
        offset = fields.get("index_skip_topk_offset", 2)
        if freq is None:
            freq = 1
        if offset is None:
            offset = 2
        if not is_positive_int(freq):
            raise LayerPlanError(
                f"{source} index_topk_freq = {freq!r}; it must be an integer >= 1 "
                f"(1 = every layer full, 4 = one full layer in four)"
            )
        if not is_positive_int(offset):
            raise LayerPlanError(
                f"{source} index_skip_topk_offset = {offset!r}; it must be an integer >= 1 (the first "
                f"layer the frequency counts from; layer 0 is always full)"
            )
        kinds = tuple(
            FULL if max(i - offset + 1, 0) % freq == 0 else SHARED for i in range(num_layers)
        )
        candidates.append(
            LayerPlan(kinds, f"{source} index_topk_freq={freq}, index_skip_topk_offset={offset}")
        )
    if not candidates:
        return None
    for plan in candidates:
        if len(plan) != num_layers:
            raise LayerPlanError(
                f"{plan.source} ({plan.pattern}) has {len(plan)} entries but the model has num_hidden_layers = "
                f"{num_layers}; give exactly one entry per layer (the MTP layer is not listed: "
                f"it always owns an indexer)"
            )
    first = candidates[0]
    for other in candidates[1:]:
        if other.kinds != first.kinds:
            raise LayerPlanError(
                f"{first.source} ({first.pattern}) and {other.source} ({other.pattern}) disagree; "
                f"keep one of them or make them state the same plan"
            )
    return first


def resolve_layer_plan(
    config: Any, override: Mapping[str, Any] | str | None = None
) -> LayerPlan:
    """The plan to serve: the override's if it names a plan field, else the checkpoint's.

    `config` is the checkpoint's HF config (object or dict); `override` is the launch's
    `--json-model-override-args` (dict or JSON string). With no plan field anywhere every layer is
    full (GLM-5 style).
    """
    get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
    num_layers = get("num_hidden_layers")
    if isinstance(override, str):
        override = json.loads(override) if override.strip() else {}
    override = dict(override or {})
    override_fields = {k: override[k] for k in PLAN_FIELDS if k in override}
    if "num_hidden_layers" in override:
        num_layers = override["num_hidden_layers"]
    if override_fields:
        plan = _plan_from_fields(override_fields, num_layers, "override")
        if plan is not None:
            return plan
    ckpt_fields = {k: get(k) for k in PLAN_FIELDS if get(k) is not None}
    if override_fields:
        # SGLang has already merged the override into the config; the checkpoint's own fields
        # are those the override did not name.
        ckpt_fields = {k: v for k, v in ckpt_fields.items() if k not in override_fields}
    return _plan_from_fields(ckpt_fields, num_layers, "checkpoint") or LayerPlan.all_full(num_layers)
