"""Everything the GLM-DSA model and its MTP draft decide from the checkpoint and the launch, once.

`GlmDsaSettings.from_config(hf_config, override, attention_backends)` resolves the IndexCache plan,
the MTP carry policy and index share, the top-k, and which attention backend API the layers talk to
(the plugin's backends or SGLang's own `dsa`, which decides the indexer class). Inside SGLang,
`for_this_process(hf_config)` reads the launch override and the backends from SGLang's runtime
context; the models take the result as an argument and read nothing else.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from sglang_glm.attention.backends import SGLANG_DSA_BACKEND
from sglang_glm.layer_plan import LayerPlan, resolve_layer_plan
from sglang_glm.mtp.recycle import resolve_recycle_policy

# Which indexer module a full layer owns.
GLM_INDEXER = "glm"  # the plugin's `GlmDsaIndexer`, which asks the backend (`DsaIndexBackend`)
SGLANG_INDEXER = "sglang"  # SGLang's CUDA `Indexer` (FP8 index-K pool only its own indexer writes)

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

    @classmethod
    def from_config(
        cls,
        hf_config: Any,
        override: Mapping[str, Any] | str | None = None,
        attention_backends: tuple[Optional[str], ...] = (),
    ) -> "GlmDsaSettings":
        """`override`: the launch's `--json-model-override-args` (dict or JSON string)."""
        if isinstance(override, str):
            override = json.loads(override) if override.strip() else {}
        override = dict(override or {})
        return cls(
            plan=resolve_layer_plan(hf_config, override),
            recycle=resolve_recycle_policy(hf_config, override),
            index_share=bool(getattr(hf_config, "index_share_for_mtp_iteration", False)),
            index_topk=hf_config.index_topk,
            indexer=SGLANG_INDEXER if SGLANG_DSA_BACKEND in attention_backends else GLM_INDEXER,
            attention_backends=tuple(attention_backends),
        )

    @classmethod
    def for_this_process(cls, hf_config: Any) -> "GlmDsaSettings":
        """From SGLang's runtime context, which SGLang publishes before it builds a model."""
        from sglang.srt.runtime_context import attention_backends, get_server_args

        return cls.from_config(
            hf_config, get_server_args().json_model_override_args, attention_backends()
        )


def module_config(hf_config: Any) -> Any:
    """The config the model's modules are built from: SGLang's, copied, with the MoE routing
    defaults GLM-DSA implies filled in, so SGLang's own config object is left as loaded."""
    cfg = copy.copy(hf_config)
    for name, value in _MOE_ROUTING_DEFAULTS:
        if getattr(cfg, name, None) is None:
            setattr(cfg, name, value)
    return cfg
