"""Launch policy for GLM-DSA: the plugin's server-arg decisions as pure functions of the checkpoint's
config and what the user passed, and the speculative combinations it refuses by name.

`hooks/launch.py` adapts SGLang's server-arg resolution to these functions. Nothing here imports
SGLang, so every decision is testable from a config and a few flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from sglang_glm.attention.backends import (
    PLUGIN_BACKENDS, SGLANG_DSA_BACKEND, TORCH_BACKEND, TRITON_BACKEND, triton_geometry_problem,
)
from sglang_glm.settings import DRAFT_HEAD_FP8, DRAFT_PREFILL_GRAPHS
from sglang_glm.warmup import NAME as PREFILL_WARMUP


@dataclass(frozen=True)
class UserArgs:
    """The server args the policy reads, as the user gave them (None: left to defaults)."""

    attention_backends: tuple[Optional[str], Optional[str], Optional[str]]  # --attention-backend, prefill, decode
    kv_cache_dtype: Optional[str]
    page_size: Optional[int]
    warmups: Optional[str]
    speculative_eagle_topk: Optional[int]


BACKEND_FLAGS = ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")


def check_attention_backends(glm_dsa: bool, backends: tuple[Optional[str], ...]) -> None:
    """Refuses, by flag, an attention backend that cannot serve the model: the plugin's backends
    serve GLM-DSA only, and GLM-DSA's indexer runs on the plugin's backends or SGLang's `dsa`,
    one family for prefill and decode (each family stores index keys its own way)."""
    given = [(flag, name) for flag, name in zip(BACKEND_FLAGS, backends) if name]
    if not glm_dsa:
        for flag, name in given:
            if name in PLUGIN_BACKENDS:
                raise ValueError(f"{flag} {name}: the plugin's attention backends serve GLM-DSA models "
                                 f"(GlmMoeDsaForCausalLM) only; drop the flag to use SGLang's default")
        return
    serving = PLUGIN_BACKENDS + (SGLANG_DSA_BACKEND,)
    for flag, name in given:
        if name not in serving:
            raise ValueError(
                f"{flag} {name}: GLM-DSA's sparse attention and lightning indexer run on {TRITON_BACKEND} "
                f"(the CUDA default), {TORCH_BACKEND} (plain PyTorch) or {SGLANG_DSA_BACKEND} (SGLang's own, "
                f"FlashMLA + DeepGEMM); use one of those, or drop the flag")
    families = {name in PLUGIN_BACKENDS for _, name in given}
    if len(families) > 1:
        mixed = ", ".join(f"{flag} {name}" for flag, name in given)
        raise ValueError(f"{mixed}: the plugin's backends and SGLang's {SGLANG_DSA_BACKEND} keep different "
                         f"index-key caches, so prefill and decode must use the same family; pick one")


def launch_decisions(hf_config: Any, user: UserArgs, on_cpu: bool) -> dict[str, Any]:
    """The server args the plugin resolves for a GLM-DSA launch ({name: value}); raises ValueError
    for a launch its kernels cannot serve, before any weight loads."""
    check_attention_backends(True, user.attention_backends)
    decisions: dict[str, Any] = {}
    # SGLang's `dsa` default needs FlashMLA and DeepGEMM; on CUDA the plugin's Triton backend is
    # the path this project runs (README, "On a GPU deployment").
    default_triton = not on_cpu and user.attention_backends == (None, None, None)
    problem = triton_geometry_problem(hf_config)
    if problem and (default_triton or TRITON_BACKEND in user.attention_backends):
        raise ValueError(problem)  # else the kernels would stop the scheduler at its first forward
    if default_triton:
        decisions["attention_backend"] = TRITON_BACKEND
    # Every prefill size class served once before the server reports ready (sglang_glm.warmup).
    if not on_cpu and user.warmups is None:
        decisions["warmups"] = PREFILL_WARMUP
    # The CPU cache keeps the model dtype (SGLang's DSA default picks a GPU cache dtype).
    if on_cpu and user.kv_cache_dtype == "auto":
        decisions["kv_cache_dtype"] = "auto"
    # SGLang forces 64-token pages on DSA models and serves eagle topk > 1 with pages > 1 only on
    # flashinfer/fa3/triton; the plugin's backends serve tree drafts with page size 1.
    topk = user.speculative_eagle_topk
    if topk is not None and topk > 1 and user.page_size in (None, 1):
        decisions["page_size"] = 1
    return decisions


def prefill_cuda_graphs(attention_backend: Optional[str], requested: Optional[str]) -> bool:
    """Whether prefill may run under CUDA graphs (`requested`: the user's --cuda-graph-backend-prefill).

    The plugin's backends lay every prefill batch out anew (ragged extend lengths), so only SGLang's
    breakable graphs fit, with attention and the indexer's top-k run eagerly between captured
    segments; on `glm_dsa_triton` they serve when asked for by name (not yet SGLang's default here:
    they have not run on a GPU). `full` would freeze one batch's layout into the graph."""
    if attention_backend not in PLUGIN_BACKENDS:
        return True
    if requested == "full" or (requested == "breakable" and attention_backend != TRITON_BACKEND):
        fix = ("use --cuda-graph-backend-prefill breakable or disabled" if attention_backend == TRITON_BACKEND
               else "drop --cuda-graph-backend-prefill (the PyTorch backend runs eagerly)")
        raise ValueError(
            f"--cuda-graph-backend-prefill {requested} with --attention-backend {attention_backend}: the "
            f"plugin's backends lay each prefill batch out anew, so its attention and top-k cannot be "
            f"captured whole; {fix}"
        )
    return requested == "breakable"


def check_draft_prefill_graphs(asked: bool, attention_backend: Optional[str], prefill_graphs: str) -> None:
    """`mtp_draft_prefill_graphs: true` needs the prefill the plugin serves under breakable graphs
    (`prefill_graphs`: the prefill graph backend after the plugin's decision): the draft's MTP layer
    takes the same eager indexer break as the target's full layers, which only glm_dsa_triton has."""
    if not asked or (attention_backend == TRITON_BACKEND and prefill_graphs == "breakable"):
        return
    raise ValueError(
        f"{DRAFT_PREFILL_GRAPHS} = true with --attention-backend {attention_backend} and prefill CUDA "
        f"graphs {prefill_graphs}: the MTP draft's prefill replays SGLang's breakable prefill graphs, "
        f"served on {TRITON_BACKEND} only; add --cuda-graph-backend-prefill breakable (on "
        f"{TRITON_BACKEND}) or drop {DRAFT_PREFILL_GRAPHS} from --json-model-override-args"
    )


def check_draft_head_fp8(asked: bool, algorithm: Optional[str]) -> None:
    """`mtp_draft_head_fp8: true` changes the MTP draft's logits only: asked without a draft, it would
    change nothing, so start-up says so instead of serving as if it applied."""
    if asked and not algorithm:
        raise ValueError(
            f"{DRAFT_HEAD_FP8} = true without --speculative-algorithm: the FP8 head serves the MTP draft's "
            f"logits only; add --speculative-algorithm EAGLE or drop {DRAFT_HEAD_FP8} from "
            f"--json-model-override-args"
        )


class UnsupportedSpecConfig(ValueError):
    pass


def _algorithm_problem(algo: str) -> Optional[str]:
    if algo in ("", "EAGLE", "NEXTN"):
        return None
    return f"--speculative-algorithm {algo}: GLM-DSA drafts with its MTP layer; use EAGLE or NEXTN"


def _refuse(problems: list[str]) -> None:
    if problems:
        raise UnsupportedSpecConfig(
            "GLM-DSA speculative decoding (sglang-glm) cannot serve this configuration:\n  - "
            + "\n  - ".join(problems)
        )


def check_spec_algorithm(algorithm: Optional[str]) -> None:
    """Refuses a speculative algorithm other than the MTP layer's, before SGLang resolves its own
    arguments (which may stop first, on a message about that algorithm rather than the model)."""
    problem = _algorithm_problem((algorithm or "").upper())
    _refuse([problem] if problem else [])


def check_spec_args(cfg: Any, on_cpu: bool) -> None:
    """Refuses, by flag, every speculative combination the plugin's MTP path cannot serve correctly
    (`cfg`: server args after SGLang filled its EAGLE defaults)."""
    algo = (getattr(cfg, "speculative_algorithm", None) or "").upper()
    if not algo:
        return
    problems = [p for p in [_algorithm_problem(algo)] if p]
    if getattr(cfg, "enable_multi_layer_eagle", False):
        problems.append("--enable-multi-layer-eagle: GLM-DSA ships one MTP layer, applied recursively")
    if on_cpu and getattr(cfg, "speculative_use_rejection_sampling", False):
        problems.append(
            "--speculative-use-rejection-sampling: the CPU path verifies greedily only"
        )
    if getattr(cfg, "speculative_adaptive", False):
        problems.append("adaptive speculative decoding is not supported with the GLM-DSA MTP draft")
    topk = getattr(cfg, "speculative_eagle_topk", None) or 1
    page_size = getattr(cfg, "page_size", None) or 1
    if topk > 1 and getattr(cfg, "kv_cache_dtype", None) == "fp8_e4m3":
        problems.append(
            f"--speculative-eagle-topk {topk} with --kv-cache-dtype fp8_e4m3: tree drafts run with page "
            "size 1, and FP8 index keys are laid out in 64-token pages; use a bfloat16 KV cache for "
            "tree drafts, or --speculative-eagle-topk 1"
        )
    if topk > 1 and page_size > 1:
        problems.append(
            f"--speculative-eagle-topk {topk} with --page-size {page_size}: tree drafts need "
            "--page-size 1 on the plugin's DSA backend"
        )
    steps = getattr(cfg, "speculative_num_steps", None)
    draft_tokens = getattr(cfg, "speculative_num_draft_tokens", None)
    if steps is not None and steps < 1:
        problems.append(f"--speculative-num-steps {steps}: need at least 1 draft step")
    if topk == 1 and steps is not None and draft_tokens is not None and draft_tokens != steps + 1:
        problems.append(
            f"--speculative-num-draft-tokens {draft_tokens} with --speculative-eagle-topk 1 and "
            f"--speculative-num-steps {steps}: a chain drafts exactly num_steps + 1 = {steps + 1} "
            "tokens (the bonus token plus one per step)"
        )
    _refuse(problems)
