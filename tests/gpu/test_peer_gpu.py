"""SGLang's own GLM-DSA path (the plugin's peer, issue 30) served on the GPU beside the plugin.

The same 64-head GLM-5.2-geometry checkpoint the plugin's warp-specialized tests serve, through
SGLang 0.5.23's `GlmMoeDsaForCausalLM` and `dsa` backend (FlashMLA sparse attention, the indexer on
DeepGEMM where the site holds it, else on SGLang's torch fall-back; `sglang_glm_tools.peer`), with the plugin kept out by SGLANG_PLUGINS. Its
tokens are judged by the suite's rule against the float64 reference, as the plugin's are, so the two
paths agree wherever they both agree with the reference. Needs `sgl-flash-mla` installed where
GLM_PEER_SITE points (scripts/run_gpu_suite.sh installs .gpu/peer's wheel there), or, with DeepGEMM
too, GLM_PEER_DEEPGEMM_SITE.
"""

import os

import pytest

from gpu_serving import gpu_server, record, results_dir, serve_and_judge
from sglang_glm_tools import peer

pytestmark = pytest.mark.gpu

# the site with DeepGEMM too where scripts/run_gpu_suite.sh could make one (its indexer as on a Hopper deployment)
PEER_SITE = os.environ.get("GLM_PEER_DEEPGEMM_SITE") or os.environ.get("GLM_PEER_SITE")


@pytest.mark.skipif(not PEER_SITE, reason="sgl-flash-mla not installed (GLM_PEER_SITE unset)")
@pytest.mark.parametrize("name, args", [("sglang_own_path", ()), ("sglang_own_path_fp8_kv", ("--kv-cache-dtype", "fp8_e4m3"))])
def test_sglang_own_glm_dsa_path_agrees_with_reference(models, name, args):
    env = {**peer.env(PEER_SITE), "PYTHONPATH": os.pathsep.join([PEER_SITE, os.environ.get("PYTHONPATH", "")])}
    with gpu_server(models["glm52_64h"], name, *args, *peer.flags(list(args)), env=env) as url:
        got, result, _ = serve_and_judge(url, models["glm52_64h"], name)
    log = (results_dir() / f"server_{name}.log").read_text(errors="replace")
    assert peer.PLUGIN_MODEL_LOG_LINE not in log, "the plugin's model served: SGLANG_PLUGINS did not keep it out"
    record(name + "_tokens", tokens=got, indexer=peer.indexer(PEER_SITE))
    result.assert_agrees()
