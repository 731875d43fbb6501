"""benchmarks/serving/gpu/startup_breakdown.py reads a server log's start-up phases (issue 31)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serving" / "gpu" / "startup_breakdown.py"

LOG = """\
[2026-12-03 09:29:01] server_args={'model_path': '/tmp/models/glm5-geometry-carry'}
[2026-12-03 09:29:31] Load weight end. elapsed=0.29 s, type=GlmMoeDsaForCausalLM, avail mem=139.11 GB
[2026-12-03 09:29:33] sglang_glm.attention.triton_dsa_backend: glm_dsa_triton: 37 kernel launch configurations built or loaded in 4.2 s (BF16 KV, contexts up to 4096 keys)
[2026-12-03 09:29:55] Engine startup timings (s): load_weight=0.32, kv_cache_allocation=0.49, scheduler_e2e=25.39, cuda_graph={prefill=0.00, decode=0.00, target_verify=15.47, draft_prefill=0.00, draft_decode=6.18, draft_extend=2.20}, tokenizer_e2e=54.91
[2026-12-03 09:29:58] glm_dsa_prefill_shapes: 52 prompts of 1-16384 tokens served in 3.5 s
[2026-12-03 09:30:00] The server is fired up and ready to roll!
"""


def test_phases_and_the_plugins_share(tmp_path):
    log = tmp_path / "server_eagle.log"
    log.write_text(LOG)
    out = json.loads(subprocess.run([sys.executable, str(SCRIPT), str(log)], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["log_to_ready_s"] == 59.0
    assert out["sglang"]["cuda_graph"] == {"prefill": 0.0, "decode": 0.0, "target_verify": 15.47, "draft_prefill": 0.0,
                                           "draft_decode": 6.18, "draft_extend": 2.2}
    assert out["sglang"]["tokenizer_e2e"] == 54.91 and out["sglang"]["load_weight"] == 0.32
    assert out["plugin_kernel_warmup"] == {"launch_configs": 37, "seconds": 4.2}
    assert out["plugin_prefill_warmup"] == {"prompts": 52, "longest": 16384, "seconds": 3.5}
    assert out["plugin_share_s"] == 9.9  # both warm-ups and the draft-extend graph the plugin captures
