"""Start-up checks for GLM-DSA MTP speculative decoding with the plugin's backends.

Every combination the plugin cannot serve correctly is refused here, by name, before any model
is loaded, instead of producing silently wrong drafts later.
"""

from __future__ import annotations


class UnsupportedSpecConfig(ValueError):
    pass


def check_spec_args(cfg, on_cpu: bool) -> None:
    algo = (getattr(cfg, "speculative_algorithm", None) or "").upper()
    if not algo:
        return
    problems = []
    if algo not in ("EAGLE", "NEXTN"):
        problems.append(
            f"--speculative-algorithm {algo}: GLM-DSA drafts with its MTP layer; use EAGLE or NEXTN"
        )
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
    if problems:
        raise UnsupportedSpecConfig(
            "GLM-DSA speculative decoding (sglang-glm) cannot serve this configuration:\n  - "
            + "\n  - ".join(problems)
        )
