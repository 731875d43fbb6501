"""Host time the Triton backend spends laying out one forward (issue 31: <= 0.15 ms per decode step at batch 32).

Builds `TritonDSABackend` on a stand-in model runner (SGLang's req_to_token table at GLM-5.2's 128K
context, 64-token pages) and times `init_forward_metadata_out_graph`, what runs on the host before
every graph replay (since the layouts are recorded into the graphs, nothing for these modes), for decode, an MTP target verify of 4 tokens, a chain draft step and a
draft-extend window of 4, at batch 1 and 32: the median host time of a call (no device sync inside
the timed loop) and the median of repeats. Run it against two plugin copies for a before/after:

    python benchmarks/kernels/bench_host_metadata.py --out $OUT/after.json
    PYTHONPATH=/tmp/plugin_before:$PYTHONPATH python benchmarks/kernels/bench_host_metadata.py --out $OUT/before.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

CONTEXT, PAGE, SLOTS = 131072, 64, 256
CALLS, REPEATS = 200, 7


def runner():
    req_to_token = torch.arange(SLOTS * CONTEXT, dtype=torch.int32, device="cuda").view(SLOTS, CONTEXT)
    return SimpleNamespace(device=torch.device("cuda"), page_size=PAGE, model_config=SimpleNamespace(context_len=CONTEXT),
                           req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                           token_to_kv_pool=SimpleNamespace(check_served_by=lambda backend: None),
                           server_args=SimpleNamespace(speculative_algorithm=None, speculative_eagle_topk=None,
                                                       speculative_num_draft_tokens=None),
                           is_draft_worker=False)


def batch(mode, bs, per_request):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seq_lens = torch.randint(1000, 4000, (bs,), device="cuda")
    positions = (seq_lens[:, None] + torch.arange(per_request, device="cuda")).flatten()
    return SimpleNamespace(
        forward_mode=getattr(ForwardMode, mode), batch_size=bs, seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(),
        req_pool_indices=torch.randperm(SLOTS, device="cuda")[:bs], positions=positions,
        spec_info=SimpleNamespace(topk=1, custom_mask=None, num_tokens_per_req=per_request),
    )


def host_us(fn) -> float:
    """Median over repeats of the mean host time of one call (the device runs behind, unsynced)."""
    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        runs.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import sglang_glm
    from sglang_glm.attention.triton_dsa_backend import TritonDSABackend, TritonDSAMultiStepDraftBackend

    # host layout only: no kernel runs here, and the stand-in runner cannot give the served shapes
    # (a plugin from before the FlashMLA dispatch warms up from the runner and has no _served_shapes)
    TritonDSABackend._warm_up_kernels = TritonDSABackend._prepare_flashmla = lambda self, arg: None
    TritonDSABackend._served_shapes = lambda self, runner: None
    r = runner()
    rows = []
    for bs in (1, 32):
        target = TritonDSABackend(r)
        target.init_cuda_graph_state(64, 64 * 4)
        draft = TritonDSAMultiStepDraftBackend(r, 1, 3)
        draft.init_cuda_graph_state(64, 64)
        cases = {
            "decode": lambda b=batch("DECODE", bs, 1): target.init_forward_metadata_out_graph(b),
            "target verify (4 tokens)": lambda b=batch("TARGET_VERIFY", bs, 4): target.init_forward_metadata_out_graph(b),
            "draft steps 1-2 (chain)": lambda b=batch("DECODE", bs, 1): draft.init_forward_metadata_out_graph(b),
            "draft-extend (window 4)": lambda b=batch("DRAFT_EXTEND_V2", bs, 4): target.init_forward_metadata_out_graph(b),
        }
        for name, fn in cases.items():
            rows.append({"case": name, "batch": bs, "host_us": round(host_us(fn), 1)})
            print(f"batch {bs:3d}  {name:28s} {rows[-1]['host_us']:8.1f} us host per call", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"hardware": torch.cuda.get_device_name(0), "plugin": sglang_glm.__file__,
                                    "calls": CALLS, "repeats": REPEATS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
