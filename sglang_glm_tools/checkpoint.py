"""Writer of HF-format GLM-DSA checkpoints: random tiny ones for tests, trained ones, FP8 variants.

Layout follows the hub (GLM-5 / GLM-5.2): experts stored one by one, indexer tensors only on full
layers, the MTP layer at index `num_hidden_layers`. Random checkpoints are built by transformers'
own `GlmMoeDsaForCausalLM` + `save_pretrained`, so tests exercise the real per-expert loading path.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS_NAME = "model.safetensors"
FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn value
EOS_TOKEN = "<|endoftext|>"

DEFAULT_TINY_CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=64,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=16,
    v_head_dim=16,
    index_n_heads=16,
    index_head_dim=32,
    index_topk=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=2.5,
    max_position_embeddings=2048,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    bos_token_id=0,
    eos_token_id=0,
    index_share_for_mtp_iteration=True,
)


# ---------------------------------------------------------------- config


def build_config(config_overrides: dict | None = None, *, mtp: bool = True, base: dict | None = None):
    """GlmMoeDsaConfig from `base` (default: the tiny config) updated by `config_overrides`."""
    from transformers import GlmMoeDsaConfig

    fields = dict(DEFAULT_TINY_CONFIG if base is None else base)
    fields.update(config_overrides or {})
    fields["num_nextn_predict_layers"] = 1 if mtp else 0
    fields.setdefault("dtype", "float32")
    # Published GLM-5 configs carry these (transformers' class drops them) and SGLang's own GLM-DSA
    # path, issue 30's peer, reads them: the routing fields raise when absent; a missing
    # indexer_rope_interleave silently gives its indexer half-split RoPE (GLM and transformers interleave).
    published = {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                 "rope_interleave": True, "indexer_rope_interleave": True}
    for name, value in published.items():
        fields.setdefault(name, value)
    return GlmMoeDsaConfig(**fields)


def _with_mtp_layer(config):
    """Config with one more layer, the MTP layer: always full (own indexer), MoE like GLM's."""
    grown = copy.deepcopy(config)
    grown.num_hidden_layers = config.num_hidden_layers + 1
    grown.indexer_types = list(config.indexer_types) + ["full"]
    grown.mlp_layer_types = list(config.mlp_layer_types) + ["sparse"]
    grown.layer_types = list(config.layer_types) + ["indexed_attention"]
    return grown


# ---------------------------------------------------------------- tokenizer


def _local_text_files() -> list[Path]:
    """A fixed handful of standard-library sources: present on every machine, no download."""
    root = Path(json.__file__).parent.parent
    names = ["os.py", "json/decoder.py", "json/encoder.py", "textwrap.py", "string.py", "functools.py",
             "argparse.py", "dataclasses.py"]
    return [root / n for n in names if (root / n).exists()]


def train_bpe_tokenizer(texts, vocab_size: int):
    """Byte-level BPE trained locally; `<|endoftext|>` is id 0 (bos = eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN)


@functools.lru_cache(maxsize=4)
def default_tokenizer(vocab_size: int = 512):
    """The tiny checkpoints' tokenizer, trained once per process on a few stdlib files."""
    return train_bpe_tokenizer([p.read_text(encoding="utf-8") for p in _local_text_files()], vocab_size)


# ---------------------------------------------------------------- FP8


def _not_converted_modules(config, mtp: bool) -> list[str]:
    """Modules GLM-5.2-FP8 keeps in high precision (norms, router, indexer k_norm/weights_proj, heads)."""
    names = ["lm_head", "model.embed_tokens", "model.norm"]
    n = config.num_hidden_layers
    for i in range(n + (1 if mtp else 0)):
        p = f"model.layers.{i}"
        names += [f"{p}.input_layernorm", f"{p}.post_attention_layernorm",
                  f"{p}.self_attn.q_a_layernorm", f"{p}.self_attn.kv_a_layernorm"]
        if i == n or config.indexer_types[i] == "full":
            names += [f"{p}.self_attn.indexer.k_norm", f"{p}.self_attn.indexer.weights_proj"]
        if i == n or config.mlp_layer_types[i] == "sparse":
            names.append(f"{p}.mlp.gate")
    if mtp:
        p = f"model.layers.{n}"
        names += [f"{p}.enorm", f"{p}.hnorm", f"{p}.eh_proj", f"{p}.shared_head.norm",
                  f"{p}.shared_head.head", f"{p}.embed_tokens"]
    return names


def fp8_quantization_config(config, mtp: bool) -> dict:
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        "modules_to_not_convert": _not_converted_modules(config, mtp),
    }


def quantize_fp8_block(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 weight + float32 `weight_scale_inv` [ceil(out/128), ceil(in/128)]: w ~ fp8 * scale per block."""
    out_f, in_f = weight.shape
    rows, cols = math.ceil(out_f / FP8_BLOCK), math.ceil(in_f / FP8_BLOCK)
    padded = torch.zeros(rows * FP8_BLOCK, cols * FP8_BLOCK, dtype=torch.float32)
    padded[:out_f, :in_f] = weight.float()
    blocks = padded.view(rows, FP8_BLOCK, cols, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale = amax / FP8_MAX
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return q.view_as(padded)[:out_f, :in_f].contiguous(), scale


def dequantize_fp8_block(q: torch.Tensor, scale_inv: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    expanded = scale_inv.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return (q.float() * expanded[: q.shape[0], : q.shape[1]]).to(dtype)


def _quantize_state_dict(tensors: dict[str, torch.Tensor], keep: list[str]) -> dict[str, torch.Tensor]:
    keep_set = set(keep)
    out = {}
    for name, t in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and t.dim() == 2 and module not in keep_set:
            out[name], out[f"{module}.weight_scale_inv"] = quantize_fp8_block(t)
        else:
            out[name] = t
    return out


def dequantized_state_dict(path: str | Path, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint with FP8 weights turned back into `dtype` (scales dropped)."""
    tensors = load_file(str(Path(path) / WEIGHTS_NAME))
    out = {}
    for name, t in tensors.items():
        if name.endswith(".weight_scale_inv"):
            continue
        scale = tensors.get(name[: -len("weight")] + "weight_scale_inv")
        out[name] = dequantize_fp8_block(t, scale, dtype) if scale is not None else t
    return out


def write_dequantized_twin(src: str | Path, dst: str | Path, dtype=torch.float32) -> Path:
    """Copy of an FP8 checkpoint with dequantized weights and no quantization_config (transformers' oracle)."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(dequantized_state_dict(src, dtype), str(dst / WEIGHTS_NAME), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    config["dtype"] = str(dtype).removeprefix("torch.")
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for f in src.iterdir():
        if f.name not in (WEIGHTS_NAME, "config.json") and f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


# ---------------------------------------------------------------- writing


def write_checkpoint(
    path: str | Path,
    config,
    tensors: dict[str, torch.Tensor],
    *,
    tokenizer=None,
    fp8: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write config.json, generation_config.json, model.safetensors (hub layout) and the tokenizer.

    `tensors` are in hub layout already (per-expert, MTP at layer N when config.num_nextn_predict_layers).
    `dtype` casts floating tensors (the router's e_score_correction_bias stays float32, as on the hub).
    """
    from transformers import GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mtp = getattr(config, "num_nextn_predict_layers", 0) > 0
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() and "e_score_correction_bias" not in k else v
                   for k, v in tensors.items()}
        config.dtype = dtype
    tensors = {k: v.contiguous() for k, v in sorted(tensors.items())}
    if fp8:
        qcfg = fp8_quantization_config(config, mtp)
        tensors = _quantize_state_dict(tensors, qcfg["modules_to_not_convert"])
        config.quantization_config = qcfg
    save_file(tensors, str(path / WEIGHTS_NAME), metadata={"format": "pt"})
    config.architectures = ["GlmMoeDsaForCausalLM"]  # serving stacks pick the model class by it
    config.save_pretrained(path)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(path)
    if tokenizer is not None:
        if len(tokenizer) > config.vocab_size:
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens, config vocab_size is {config.vocab_size}")
        tokenizer.save_pretrained(path)
    return path


def _perturb_init(model, seed: int) -> None:
    """Give norms, LayerNorm biases and the routing bias non-trivial values so a wrong tensor shows."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.01 * torch.randn(b.shape, generator=g))


def _mtp_extras(tensors: dict[str, torch.Tensor], layer: int, hidden: int, seed: int) -> dict[str, torch.Tensor]:
    """enorm/hnorm/eh_proj/shared_head of the MTP layer plus its copies of the target's embedding and head."""
    g = torch.Generator().manual_seed(seed + 2)
    p = f"model.layers.{layer}"
    return {
        f"{p}.enorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
        f"{p}.hnorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
        f"{p}.eh_proj.weight": 0.02 * torch.randn(hidden, 2 * hidden, generator=g),
        f"{p}.shared_head.norm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
        f"{p}.shared_head.head.weight": tensors["lm_head.weight"].clone(),
        f"{p}.embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
    }


def make_tiny_checkpoint(
    path: str | Path,
    *,
    config_overrides: dict | None = None,
    mtp: bool = True,
    fp8: bool = False,
    seed: int = 0,
    tokenizer="default",
) -> Path:
    """Random-weight GLM-DSA checkpoint for any shape and layer plan, saved by transformers.

    tokenizer: "default" (local byte-level BPE sized to the config's vocab), a tokenizer object, or None.
    """
    from transformers import GlmMoeDsaForCausalLM

    config = build_config(config_overrides, mtp=mtp)
    built = _with_mtp_layer(config) if mtp else config
    torch.manual_seed(seed)
    model = GlmMoeDsaForCausalLM(built).float().eval()
    _perturb_init(model, seed)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, max_shard_size="100GB")
        tensors = load_file(str(Path(tmp) / WEIGHTS_NAME))
    if mtp:
        tensors.update(_mtp_extras(tensors, config.num_hidden_layers, config.hidden_size, seed))
    if tokenizer == "default":
        tokenizer = default_tokenizer(min(config.vocab_size, 1024))
    return write_checkpoint(path, config, tensors, tokenizer=tokenizer, fp8=fp8)


def main(argv: list[str]) -> None:
    """`python -m sglang_glm_tools.checkpoint OUT [--fp8] [--no-mtp] [--overrides JSON]`."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("out")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--no-mtp", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overrides", type=json.loads, default=None)
    a = ap.parse_args(argv)
    print(make_tiny_checkpoint(a.out, config_overrides=a.overrides, mtp=not a.no_mtp, fp8=a.fp8, seed=a.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
