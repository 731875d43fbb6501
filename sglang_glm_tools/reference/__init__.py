"""Plain-PyTorch GLM-DSA (target + MTP layer): transformers-exact target math, float64-capable, no SGLang."""

from .config import DsaConfig, resolve_indexer_types
from .layers import select_topk
from .model import GlmDsaForCausalLM, MtpOutput, TargetOutput, load_reference_model
from .mtp import DraftRound, accepted_length, draft_round, greedy_continuation, reference_draft_round

__all__ = [
    "DsaConfig", "DraftRound", "GlmDsaForCausalLM", "MtpOutput", "TargetOutput", "accepted_length",
    "draft_round", "greedy_continuation", "load_reference_model", "reference_draft_round",
    "resolve_indexer_types", "select_topk",
]
