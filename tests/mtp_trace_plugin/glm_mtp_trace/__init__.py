"""Test-only SGLang plugin (tests/mtp_trace.py enables it): records every MTP draft forward.

With this folder on the path of SGLang's processes and SGLANG_GLM_MTP_TRACE set to a directory,
each forward of the plugin's draft model saves one file: kind "extend" (draft-extend, draft step 0)
or "step" (draft step i >= 1), whether the MTP indexer module ran (seen by a forward hook on it),
the request slots, positions and the logits. SGLang's scheduler runs in a sub-process, so a file
is the simplest channel back to the test.
"""

import itertools
import os
from pathlib import Path

ENV = "SGLANG_GLM_MTP_TRACE"
TARGET = "sglang_glm.models.glm_dsa_nextn.GlmMoeDsaForCausalLMNextN.forward"
_counter = itertools.count()


def _traced_forward(original, draft, input_ids, positions, forward_batch, *args, **kwargs):
    from sglang_glm.models.glm_dsa_nextn import DRAFT_LAYER_ID

    attn = draft.model.decoder.self_attn
    ran = []
    handle = None
    if attn.has_indexer:
        handle = attn.indexer.register_forward_hook(lambda *unused: ran.append(True))
    try:
        out = original(draft, input_ids, positions, forward_batch, *args, **kwargs)
    finally:
        if handle is not None:
            handle.remove()
    is_draft_step = forward_batch.forward_mode.is_decode()
    _record(
        kind="step" if is_draft_step else "extend",
        mode=str(forward_batch.forward_mode),
        ran_indexer=bool(ran),
        draft_has_indexer=attn.has_indexer,
        index_share=draft.settings.index_share,
        recycle=draft.settings.recycle,
        req_pool_indices=forward_batch.req_pool_indices,
        seq_lens=forward_batch.seq_lens,
        positions=forward_batch.positions,
        extend_seq_lens=None if is_draft_step else list(forward_batch.extend_seq_lens_cpu or []),
        num_accept_tokens=getattr(forward_batch.spec_info, "num_accept_tokens", None),
        logits=out.next_token_logits,
        topk_rows=draft.model.topk_buffer.read(DRAFT_LAYER_ID),
    )
    return out


def _record(**fields) -> None:
    import torch

    out = Path(os.environ[ENV])
    out.mkdir(parents=True, exist_ok=True)
    fields = {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in fields.items()}
    fields["seq"] = next(_counter)
    torch.save(fields, out / f"{os.getpid()}_{fields['seq']:08d}.pt")


def register():
    if not os.environ.get(ENV):
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _traced_forward, HookType.AROUND)
