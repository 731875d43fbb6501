"""MTP drafts accepted on the GPU: the trained `glm5-geometry-carry` (GLM-5.2's attention geometry at
hidden 256, 6 layers + its MTP layer) on held-out text, EAGLE chains and trees under CUDA graphs with
SGLang's overlap scheduler on.

The suite's other MTP cases serve random weights, whose drafts are never accepted, so only here do
accepted drafts reach the verify's bookkeeping on CUDA: the committed tokens and their KV, the top-k
compacted to each request's last accepted token, the carried hidden state, per-position acceptance.
Tokens are judged against the float64 reference by the suite's margin rule, and acceptance must be
what a trained draft gets: on the CPU (float32, these prompts, 48 tokens) 2.2-3.0 tokens a round for the
chain and 2.4-3.4 for the tree, the first draft accepted in 68-100% of rounds; a broken accept path
gives about 1 (`benchmarks/mtp/trained_gpu_test_acceptance.py` and its JSON).

The model travels as .gpu/models/glm5-geometry-carry.tar.xz (`bash scripts/device_tree.sh out
assets/glm5-geometry-carry`), which run_gpu_suite.sh unpacks into /tmp/models; without it the test skips.
"""

import os
from pathlib import Path

import pytest

from gpu_serving import CHAIN, TREE, agreement, assert_per_position_acceptance, generate, gpu_server, record

MODEL = Path(os.environ.get("GLM_GPU_TRAINED_MODEL", "/tmp/models/glm5-geometry-carry"))
HELDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "train" / "data" / "heldout.txt"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (MODEL / "model.safetensors").exists(),
                       reason=f"no trained model at {MODEL}: carry it with `bash scripts/device_tree.sh out "
                              "assets/glm5-geometry-carry` (run_gpu_suite.sh unpacks .gpu/models)"),
]

NEW_TOKENS = 48


def heldout_prompts() -> list[list[int]]:
    """Four held-out passages, 150-600 tokens (all but one past the model's index_topk of 128)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    text = HELDOUT.read_text()
    return [tok(text[i * 9000 : i * 9000 + 4000])["input_ids"][:n] for i, n in enumerate((600, 420, 300, 150))]


@pytest.mark.parametrize("name, args", [("trained_mtp_chain", CHAIN), ("trained_mtp_tree", TREE)])
def test_trained_drafts_are_accepted_and_tokens_agree(name, args):
    prompts = heldout_prompts()
    with gpu_server(MODEL, name, *args) as url:
        outs = generate(url, prompts, max_new_tokens=NEW_TOKENS)
        alone = generate(url, prompts[:1], max_new_tokens=NEW_TOKENS)  # batch 1: other graphs, other rounds
    result = agreement(MODEL, prompts + prompts[:1], outs + alone)
    accept = [o["meta_info"]["spec_accept_length"] for o in outs + alone]
    per_position = [o["meta_info"].get("spec_accept_per_position") for o in outs + alone]
    record(name, spec_accept_length=accept, spec_accept_per_position=per_position, **result.as_dict())
    result.assert_agrees()
    assert sum(accept) / len(accept) > 1.8, accept
    assert_per_position_acceptance(outs + alone, args)
    assert all(rates[0] > 0.5 for rates in per_position), per_position  # the first draft: accepted in most rounds
