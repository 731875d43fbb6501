"""Everything the GLM-DSA model and its MTP draft decide from the checkpoint and the launch, once.

`GlmDsaSettings.from_config(hf_config, override, attention_backends)` resolves the IndexCache plan,
the MTP carry policy and index share, the top-k, and which attention backend API the layers talk to
(the plugin's backends or SGLang's own `dsa`, which decides the indexer class). Inside SGLang,
`for_this_process(hf_config)` reads the launch override and the backends from SGLang's runtime
context; the models take the result as an argument and read nothing else.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from sglang_glm.attention.backends import SGLANG_DSA_BACKEND
from sglang_glm.layer_plan import LayerPlan, is_positive_int, resolve_layer_plan
from sglang_glm.mtp.recycle import FIELD as RECYCLE_FIELD, resolve_recycle_policy

# Which indexer module a full layer owns.
GLM_INDEXER = "glm"  # the plugin's `GlmDsaIndexer`, which asks the backend (`DsaIndexBackend`)
SGLANG_INDEXER = "sglang"  # SGLang's CUDA `Indexer` (FP8 index-K pool only its own indexer writes)

# Launch key: the MTP draft's prefill pass (its draft-extend over the prompt) replays SGLang's
# breakable prefill graphs; the GPU suite served it (session 18), off by default until its speed is measured.
DRAFT_PREFILL_GRAPHS = "mtp_draft_prefill_graphs"

# Launch key: the MTP draft's logits from a block-FP8 copy of the LM head (sglang_glm.mtp.draft_head); the
# verify keeps the BF16 head, so tokens are unchanged. Off by default until its speed and acceptance are measured.
DRAFT_HEAD_FP8 = "mtp_draft_head_fp8"

INDEX_SHARE = "index_share_for_mtp_iteration"
# The config fields the plugin reads, settable at launch with --json-model-override-args.
PLUGIN_FIELDS = ("index_topk", "indexer_types", "index_topk_pattern", "index_topk_freq",
                 "index_skip_topk_offset", INDEX_SHARE, RECYCLE_FIELD, DRAFT_PREFILL_GRAPHS, DRAFT_HEAD_FP8)

# MoE routing fields SGLang's DeepseekV2MoE reads and transformers' GlmMoeDsaConfig omits.
_MOE_ROUTING_DEFAULTS = (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid"))


@dataclass(frozen=True)
class GlmDsaSettings:
    plan: LayerPlan
    recycle: str  # MTP carry: "post_norm" or "pre_norm" (sglang_glm.mtp.recycle)
    index_share: bool  # index_share_for_mtp_iteration: draft steps 1+ reuse the draft-extend top-k
    index_topk: int
    indexer: str  # GLM_INDEXER or SGLANG_INDEXER
    attention_backends: tuple[Optional[str], ...]  # SGLang's (prefill, decode) backend names
    draft_prefill_graphs: bool = False  # DRAFT_PREFILL_GRAPHS: the draft exposes `layers` to SGLang
    draft_head_fp8: bool = False  # DRAFT_HEAD_FP8: the draft's logits from an FP8 copy of the LM head

    @classmethod
    def from_config(
        cls,
        hf_config: Any,
        override: Mapping[str, Any] | str | None = None,
        attention_backends: tuple[Optional[str], ...] = (),
    ) -> "GlmDsaSettings":
        """`override`: the launch's `--json-model-override-args` (dict or JSON string)."""
        override = parse_override(override)
        check_override_keys(override)
        return cls(
            plan=resolve_layer_plan(hf_config, override),
            recycle=resolve_recycle_policy(hf_config, override),
            index_share=_field(hf_config, override, INDEX_SHARE, bool, False,
                               "true (MTP draft steps 1+ reuse the draft-extend top-k) or false"),
            index_topk=_field(hf_config, override, "index_topk", int, None,
                              "a positive integer (the keys each query attends, 2048 for GLM-5)"),
            indexer=SGLANG_INDEXER if SGLANG_DSA_BACKEND in attention_backends else GLM_INDEXER,
            attention_backends=tuple(attention_backends),
            draft_prefill_graphs=resolve_draft_prefill_graphs(hf_config, override),
            draft_head_fp8=resolve_draft_head_fp8(hf_config, override),
        )

    @classmethod
    def for_this_process(cls, hf_config: Any) -> "GlmDsaSettings":
        """From SGLang's runtime context, which SGLang publishes before it builds a model."""
        from sglang.srt.runtime_context import attention_backends, get_server_args

        return cls.from_config(
            hf_config, get_server_args().json_model_override_args, attention_backends()
        )


def check_override_keys(override: Mapping[str, Any]) -> None:
    """A launch override key one typo away from a plugin field would be set on the config and read by
    nothing, serving the checkpoint's own value; refused with the name it most likely meant."""
    for key in override:
        if key in PLUGIN_FIELDS:
            continue
        close = difflib.get_close_matches(key, PLUGIN_FIELDS, n=1, cutoff=0.85)
        if close:
            raise ValueError(f"--json-model-override-args key {key!r} is not a GLM-DSA field the plugin "
                             f"reads; did you mean {close[0]!r}?")


def _field(hf_config: Any, override: Mapping[str, Any], name: str, kind: type, default: Any, use: str) -> Any:
    """A plugin field from the override, else the config, checked for its type (bool is not an int,
    and "false" is not a bool)."""
    value = override.get(name, getattr(hf_config, name, default))
    if not (isinstance(value, bool) if kind is bool else is_positive_int(value)):
        raise ValueError(f"{name} = {value!r}; use {use}")
    return value


def parse_override(override: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """The launch's `--json-model-override-args` as a dict (SGLang keeps the JSON string)."""
    if isinstance(override, str):
        return json.loads(override) if override.strip() else {}
    return dict(override or {})


def resolve_draft_prefill_graphs(hf_config: Any, override: Mapping[str, Any] | None = None) -> bool:
    """`mtp_draft_prefill_graphs` from the launch override, else the config; False when absent."""
    return _field(hf_config, override or {}, DRAFT_PREFILL_GRAPHS, bool, False,
                  "true (the MTP draft's prefill replays SGLang's breakable prefill graphs, with "
                  "--cuda-graph-backend-prefill breakable) or false")


def resolve_draft_head_fp8(hf_config: Any, override: Mapping[str, Any] | None = None) -> bool:
    """`mtp_draft_head_fp8` from the launch override, else the config; False when absent."""
    return _field(hf_config, override or {}, DRAFT_HEAD_FP8, bool, False,
                  "true (the MTP draft's logits from a block-FP8 copy of the LM head; the verify keeps BF16) "
                  "or false")


def module_config(hf_config: Any) -> Any:
    """The config the model's modules are built from: SGLang's, copied, with the MoE routing
    defaults GLM-DSA implies filled in, so SGLang's own config object is left as loaded."""
    cfg = copy.copy(hf_config)
    for name, value in _MOE_ROUTING_DEFAULTS:
        if getattr(cfg, name, None) is None:
            setattr(cfg, name, value)
    return cfg
