"""Which hidden state the MTP layer carries from draft step k into step k+1.

GLM trains its MTP layer recursively with the hidden AFTER `shared_head.norm` ("post_norm"); some
checkpoints (DeepSeek-style) were trained with the pre-norm residual stream ("pre_norm"). Logits
always come from the normed hidden; only the carried tensor changes.

Selection, first found wins: the config field `mtp_recycle_hidden` (settable at launch with
`--json-model-override-args '{"mtp_recycle_hidden": "pre_norm"}'`), else the model type's default.
"""

from __future__ import annotations

POST_NORM, PRE_NORM = "post_norm", "pre_norm"
FIELD = "mtp_recycle_hidden"
# Model types whose MTP layer was trained with the post-norm carry.
_POST_NORM_MODEL_TYPES = {"glm_moe_dsa"}


class RecyclePolicyError(ValueError):
    pass


def resolve_recycle_policy(config, override: dict | None = None) -> str:
    value = (override or {}).get(FIELD)
    if value is None:
        value = getattr(config, FIELD, None)
    if value is None:
        model_type = getattr(config, "model_type", None)
        value = POST_NORM if model_type in _POST_NORM_MODEL_TYPES else PRE_NORM
    if value not in (POST_NORM, PRE_NORM):
        raise RecyclePolicyError(
            f"{FIELD} = {value!r}; use {POST_NORM!r} (carry shared_head.norm(x), GLM's training) or "
            f"{PRE_NORM!r} (carry x before the norm)"
        )
    return value


def carried_hidden(policy: str, pre_norm):
    """The draft model's `aux_hidden_states` argument to SGLang's LogitsProcessor, which is where
    the carry is decided. The contract: SGLang's EAGLE worker feeds the hidden states the logits
    output stores into the next draft step, and the processor stores `aux_hidden_states` when given,
    else the hidden the logits came from (the post-norm one). So post_norm passes None and pre_norm
    passes the hidden before `shared_head.norm`."""
    return None if policy == POST_NORM else [pre_norm]
