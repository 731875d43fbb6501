"""The indexer and top-k kernels compile for sm_90 on a machine without a GPU (Triton's own ptxas, no driver).

The CPU runs check what the kernels compute (under TRITON_INTERPRET, test_interpreted.py), not that Triton's
NVIDIA backend accepts them; device time is scarce, so a kernel that would not compile on the H100 / H200
fails here first. Each case is a launch the plugin makes with its default configs (or a launch a config
field selects), compiled to a cubin for compute capability 9.0.
"""

import os

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="interpreted kernels are not compiled")

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from glm_dsa_kernels import indexer, topk_select  # noqa: E402

PTRS = {"q_ptr": "*bf16", "w_ptr": "*fp32", "k_ptr": "*u8", "page_table_ptr": "*i32", "query_req_ptr": "*i32",
        "key_limit_ptr": "*i32", "logits_ptr": "*fp32"}
STRIDES = {"stride_qt": "i32", "stride_qh": "i32", "stride_wt": "i32", "stride_pb": "i32", "stride_lt": "i32"}


def compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    try:
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                options={"num_warps": num_warps, "num_stages": num_stages})
    except FileNotFoundError as exc:  # a Triton without its bundled ptxas
        pytest.skip(f"no ptxas: {exc}")
    assert kernel.asm["cubin"]


def _indexer_meta(**kw):
    return {"K_FP8": True, "PAGE": 64, "BLOCK_N": 64, "NUM_STAGES": 3, "DOT_DTYPE": tl.bfloat16,
            "F16_DTYPE": tl.float16, "Q_TERMS": 0, **kw}


@pytest.mark.parametrize("stages, q_terms", [(3, 0), (5, 0), (5, 1)])
def test_decode_indexer(stages, q_terms):
    compile_sm90(indexer._indexer_logits_kernel, {**PTRS, **STRIDES},
                 _indexer_meta(NUM_STAGES=stages, Q_TERMS=q_terms), num_stages=stages)


@pytest.mark.parametrize("keys_per_program", [4096, 0])  # prefill key ranges; a verify's strided query blocks
def test_query_blocked_indexer(keys_per_program):
    compile_sm90(indexer._indexer_logits_blocked_kernel, {**PTRS, "T": "i32", **STRIDES},
                 _indexer_meta(BLOCK_Q=4, KEYS_PER_PROGRAM=keys_per_program))


@pytest.mark.parametrize("small_row", [0, 4096])
def test_topk_select(small_row):
    rows = {"logits_ptr": "*fp32", "key_limit_ptr": "*i32"}
    compile_sm90(topk_select._sample_bound_kernel, {**rows, "bound_ptr": "*i32", "stride_lt": "i32", "topk": "i32"},
                 {"SAMPLE": 4096, "SMALL_ROW": small_row}, num_warps=8)
    compile_sm90(topk_select._candidates_kernel,
                 {**rows, "bound_ptr": "*i32", "cand_key_ptr": "*i32", "cand_pos_ptr": "*i32", "num_cand_ptr": "*i32",
                  "stride_lt": "i32", "stride_ct": "i32", "num_chunks": "i32"},
                 {"CHUNK": 8192, "BLOCK": 4096, "SMALL_ROW": small_row}, num_warps=8)
    compile_sm90(topk_select._select_kernel,
                 {**rows, "cand_key_ptr": "*i32", "cand_pos_ptr": "*i32", "num_cand_ptr": "*i32", "out_ptr": "*i32",
                  "stride_lt": "i32", "stride_ct": "i32", "stride_ot": "i32", "topk": "i32", "num_chunks": "i32"},
                 {"CHUNK": 8192, "BLOCK": 2048, "MAX_CHUNKS": 32, "SMALL_ROW": small_row}, num_warps=8)
    if small_row:
        compile_sm90(topk_select._select_small_kernel,
                     {**rows, "out_ptr": "*i32", "stride_lt": "i32", "stride_ot": "i32", "topk": "i32"},
                     {"SMALL_ROW": small_row}, num_warps=8)
