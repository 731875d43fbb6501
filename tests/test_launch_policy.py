"""The launch policy as pure functions: what a GLM-DSA launch resolves to, per platform and flags.

The hooks that hand these decisions to SGLang run in the CPU server tests (test_cuda_plumbing.py's
launch failures, the MTP and engine tests); here each rule is checked on its own, with the config
fields it reads and nothing else.
"""

from types import SimpleNamespace

import pytest

from sglang_glm.attention.backends import TORCH_BACKEND, TRITON_BACKEND, triton_geometry
from sglang_glm.launch_policy import (
    UserArgs, check_attention_backends, check_draft_prefill_graphs, launch_decisions, prefill_cuda_graphs,
)
from sglang_glm.settings import resolve_draft_prefill_graphs
from sglang_glm.warmup import NAME as PREFILL_WARMUP

GLM5 = SimpleNamespace(**triton_geometry())
NARROW = SimpleNamespace(**{**triton_geometry(), "kv_lora_rank": 48})  # a tiny model's geometry


def user(backend=None, kv="auto", page=None, warmups=None, topk=None):
    return UserArgs(attention_backends=(backend, None, None), kv_cache_dtype=kv, page_size=page,
                    warmups=warmups, speculative_eagle_topk=topk)


@pytest.mark.parametrize("config, args, on_cpu, expected", [
    (GLM5, user(), False, {"attention_backend": TRITON_BACKEND, "warmups": PREFILL_WARMUP}),
    (GLM5, user(backend=TORCH_BACKEND), False, {"warmups": PREFILL_WARMUP}),
    (GLM5, user(warmups="none"), False, {"attention_backend": TRITON_BACKEND}),
    (NARROW, user(backend=TORCH_BACKEND), False, {"warmups": PREFILL_WARMUP}),
    (GLM5, user(), True, {"kv_cache_dtype": "auto"}),
    (NARROW, user(kv="bfloat16"), True, {}),
    (GLM5, user(topk=2), True, {"kv_cache_dtype": "auto", "page_size": 1}),
    (GLM5, user(topk=2, page=1), True, {"kv_cache_dtype": "auto", "page_size": 1}),
    (GLM5, user(topk=2, page=64), True, {"kv_cache_dtype": "auto"}),  # refused later, by check_spec_args
    (GLM5, user(topk=1), True, {"kv_cache_dtype": "auto"}),
])
def test_launch_decisions(config, args, on_cpu, expected):
    assert launch_decisions(config, args, on_cpu) == expected


@pytest.mark.parametrize("args", [user(), user(backend=TRITON_BACKEND)])
def test_triton_on_another_geometry_is_refused_by_name(args):
    with pytest.raises(ValueError, match=rf"kv_lora_rank=48.*--attention-backend {TORCH_BACKEND}"):
        launch_decisions(NARROW, args, on_cpu=False)


@pytest.mark.parametrize("backends", [(None, None, None), (TRITON_BACKEND, None, None), (TORCH_BACKEND,) * 3,
                                      ("dsa", None, None), (None, "dsa", "dsa"), (None, TRITON_BACKEND, None)])
def test_glm_dsa_serves_on_the_plugins_backends_or_sglangs_dsa(backends):
    check_attention_backends(True, backends)


@pytest.mark.parametrize("backends, message", [
    (("flashinfer", None, None), r"--attention-backend flashinfer: GLM-DSA's .* run on glm_dsa_triton"),
    ((None, "fa3", None), r"--prefill-attention-backend fa3: GLM-DSA's"),
    ((None, None, "triton"), r"--decode-attention-backend triton: GLM-DSA's"),
    ((None, "dsa", TRITON_BACKEND), r"--prefill-attention-backend dsa, --decode-attention-backend glm_dsa_triton: "
                                    r".*same family"),
])
def test_other_backends_for_glm_dsa_are_refused_by_flag(backends, message):
    with pytest.raises(ValueError, match=message):
        check_attention_backends(True, backends)
    with pytest.raises(ValueError, match=message):  # the launch decisions run the same check
        launch_decisions(GLM5, UserArgs(attention_backends=backends, kv_cache_dtype="auto", page_size=None,
                                        warmups=None, speculative_eagle_topk=None), on_cpu=False)


def test_the_plugins_backends_are_refused_for_other_models():
    check_attention_backends(False, ("flashinfer", None, None))
    check_attention_backends(False, (None, None, None))
    for backends, flag in [((TRITON_BACKEND, None, None), "--attention-backend"),
                           ((None, None, TORCH_BACKEND), "--decode-attention-backend")]:
        with pytest.raises(ValueError, match=rf"{flag} glm_dsa_t.*GLM-DSA models .* only"):
            check_attention_backends(False, backends)


def test_prefill_graphs_on_the_plugins_backends_only_breakable_and_asked_for():
    # SGLang's default (the user named none) stays off for the plugin's backends, on for others
    assert not prefill_cuda_graphs(TRITON_BACKEND, None) and not prefill_cuda_graphs(TORCH_BACKEND, None)
    assert prefill_cuda_graphs("flashinfer", None) and prefill_cuda_graphs(None, None)
    assert prefill_cuda_graphs("flashinfer", "full")
    assert prefill_cuda_graphs(TRITON_BACKEND, "breakable")
    assert not prefill_cuda_graphs(TRITON_BACKEND, "disabled")
    with pytest.raises(ValueError, match=r"prefill full with --attention-backend glm_dsa_triton.*breakable or disabled"):
        prefill_cuda_graphs(TRITON_BACKEND, "full")
    with pytest.raises(ValueError, match=r"prefill breakable with --attention-backend glm_dsa_torch.*runs eagerly"):
        prefill_cuda_graphs(TORCH_BACKEND, "breakable")


def test_draft_prefill_graphs_key_off_unless_asked():
    assert resolve_draft_prefill_graphs(GLM5, {}) is False
    assert resolve_draft_prefill_graphs(GLM5, {"mtp_draft_prefill_graphs": True}) is True
    in_config = SimpleNamespace(**triton_geometry(), mtp_draft_prefill_graphs=True)
    assert resolve_draft_prefill_graphs(in_config, None) is True
    assert resolve_draft_prefill_graphs(in_config, {"mtp_draft_prefill_graphs": False}) is False
    with pytest.raises(ValueError, match=r"mtp_draft_prefill_graphs = 'yes'; use true .* or false"):
        resolve_draft_prefill_graphs(GLM5, {"mtp_draft_prefill_graphs": "yes"})


def test_draft_prefill_graphs_need_breakable_prefill_graphs_on_triton():
    check_draft_prefill_graphs(True, TRITON_BACKEND, "breakable")
    for backend, graphs in ((TRITON_BACKEND, "disabled"), (TORCH_BACKEND, "disabled"), ("dsa", "breakable")):
        check_draft_prefill_graphs(False, backend, graphs)  # the key off: nothing to check
        with pytest.raises(ValueError, match=(
                rf"mtp_draft_prefill_graphs = true with --attention-backend {backend} and prefill CUDA graphs "
                rf"{graphs}: .*add --cuda-graph-backend-prefill breakable \(on glm_dsa_triton\) or drop "
                r"mtp_draft_prefill_graphs")):
            check_draft_prefill_graphs(True, backend, graphs)
