"""Calibration inputs: the checkpoint's indexer layers, the budget, the token sequences.

Everything a user can get wrong is checked here, before SGLang is imported (which takes seconds),
and every error names the value and the fix.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from sglang_glm_tools.calibration import CalibrationError
from sglang_glm.layer_plan import FULL, SHARED, LayerPlan

_INDEXER = re.compile(r"^model\.layers\.(\d+)\.self_attn\.indexer\.")


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    config: dict
    num_layers: int
    index_topk: int
    max_positions: int
    indexer_layers: tuple[int, ...]  # layers < num_layers whose indexer tensors the checkpoint has

    @property
    def start_plan(self) -> LayerPlan:
        """Every layer with indexer weights full: where the greedy search starts."""
        kinds = tuple(FULL if i in self.indexer_layers else SHARED for i in range(self.num_layers))
        return LayerPlan(kinds, "all indexer layers full")


def _tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CalibrationError(
            f"--model {str(path)!r} has no *.safetensors files; point --model at a Hugging Face "
            f"checkpoint directory (config.json + model*.safetensors)"
        )
    names: list[str] = []
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            names.extend(handle.keys())
    return names


def inspect_model(path: str | Path) -> ModelInfo:
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CalibrationError(
            f"--model {str(path)!r} has no config.json; point --model at a Hugging Face "
            f"checkpoint directory"
        )
    config = json.loads(config_file.read_text())
    num_layers = config["num_hidden_layers"]
    if "index_topk" not in config:
        raise CalibrationError(
            f"--model {str(path)!r} (model_type {config.get('model_type')!r}) has no index_topk in "
            f"config.json: it is not a DSA model, so there are no indexers to keep or share; use "
            f"a GLM-DSA checkpoint (GlmMoeDsaForCausalLM)"
        )
    layers = sorted(
        {int(m.group(1)) for n in _tensor_names(path) if (m := _INDEXER.match(n))}
        & set(range(num_layers))
    )
    if not layers:
        raise CalibrationError(
            f"--model {str(path)!r} has no indexer tensors (model.layers.<i>.self_attn.indexer.*) "
            f"in any of its {num_layers} layers: there is nothing to calibrate. IndexCache chooses "
            f"which of a checkpoint's indexers to keep; use a checkpoint that carries indexer "
            f"weights (GLM-5 style: every layer; GLM-5.2 style: its full layers)"
        )
    if layers[0] != 0:
        raise CalibrationError(
            f"--model {str(path)!r} has indexer tensors for layers {layers} but not layer 0; layer "
            f"0 must run its own indexer (a shared layer reuses an earlier layer's top-k), so this "
            f"checkpoint cannot be served with any plan; use a checkpoint with a layer-0 indexer"
        )
    return ModelInfo(
        path=path,
        config=config,
        num_layers=num_layers,
        index_topk=config["index_topk"],
        max_positions=config.get("max_position_embeddings", 1 << 20),
        indexer_layers=tuple(layers),
    )


def check_budget(info: ModelInfo, full_layers: int) -> None:
    n = len(info.indexer_layers)
    if not isinstance(full_layers, int) or not 1 <= full_layers <= n:
        raise CalibrationError(
            f"--full-layers {full_layers!r} is out of range: {info.path} has {n} layers with "
            f"indexer weights ({list(info.indexer_layers)}), and layer 0 always stays full, so "
            f"the budget must be an integer from 1 to {n}"
        )


@dataclass(frozen=True)
class Sequences:
    """Calibration (or held-out) text cut into windows of at most `seq_len` tokens."""

    source: str
    token_ids: tuple[tuple[int, ...], ...]
    seq_len: int
    text_sha256: str

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.token_ids)

    def describe(self) -> str:
        return (
            f"{self.source}: {len(self.token_ids)} sequences, {self.num_tokens} tokens "
            f"(windows of {self.seq_len})"
        )


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - re-raised with the fix
        raise CalibrationError(
            f"--model {str(path)!r} has no loadable tokenizer ({type(exc).__name__}: {exc}); "
            f"copy the tokenizer files (tokenizer.json, tokenizer_config.json) into the "
            f"checkpoint directory"
        ) from exc


def default_seq_len(info: ModelInfo) -> int:
    return min(1024, info.max_positions)


def load_sequences(
    data: str | Path,
    tokenizer,
    info: ModelInfo,
    *,
    seq_len: int | None = None,
    max_tokens: int | None = None,
    what: str = "--data",
) -> Sequences:
    """Tokenize `data` as one stream (no special tokens) and cut it into consecutive windows.

    The last window is kept when it is longer than index_topk + 1 (shorter ones attend densely and
    cannot tell plans apart). The held-out loss the server reports is compared on exactly these
    windows, so tools that check the figure must use this function.
    """
    seq_len = seq_len or default_seq_len(info)
    topk = info.index_topk
    if seq_len <= topk + 1 or seq_len > info.max_positions:
        raise CalibrationError(
            f"--seq-len {seq_len} must lie between index_topk + 2 = {topk + 2} (shorter windows "
            f"attend to every key, so sharing an indexer changes nothing) and the model's "
            f"max_position_embeddings = {info.max_positions}"
        )
    path = Path(data)
    if not path.is_file():
        raise CalibrationError(f"{what} {str(path)!r} does not exist; give a UTF-8 text file")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise CalibrationError(
            f"{what} {str(path)!r} is empty; give a UTF-8 text file with at least "
            f"{2 * topk} tokens of text like the text the model will serve"
        )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if max_tokens is not None:
        ids = ids[:max_tokens]
    minimum = 2 * topk
    if len(ids) < minimum:
        raise CalibrationError(
            f"{what} {str(path)!r} gives {len(ids)} tokens; calibration needs at least "
            f"{minimum} (2 x index_topk = 2 x {topk}): below index_topk keys every query attends "
            f"densely and all plans give the same loss. Give more text"
            + (f" or raise --max-tokens {max_tokens}" if max_tokens and max_tokens < minimum else "")
        )
    windows = [tuple(ids[i : i + seq_len]) for i in range(0, len(ids), seq_len)]
    windows = [w for w in windows if len(w) > topk + 1]
    return Sequences(
        source=str(path),
        token_ids=tuple(windows),
        seq_len=seq_len,
        text_sha256=hashlib.sha256(text.encode()).hexdigest()[:16],
    )


def uniform_pattern(num_layers: int, full_layers: int, allowed: tuple[int, ...] | None = None) -> str:
    """The uniform every-k pattern with `full_layers` full layers, starting at layer 0.

    When `full_layers` divides the layer count it is layer i full iff i % k == 0 with
    k = num_layers / full_layers (index_topk_freq = k, index_skip_topk_offset = 1); otherwise the
    full layers are spaced as evenly as possible (round(j * num_layers / full_layers)). With
    `allowed` (layers that own an indexer) each is moved to the nearest allowed layer.
    """
    allowed = tuple(range(num_layers)) if allowed is None else tuple(allowed)
    if not 1 <= full_layers <= len(allowed):
        raise CalibrationError(
            f"uniform pattern with {full_layers} full layers: must be 1..{len(allowed)}"
        )
    chosen: list[int] = []
    for j in range(full_layers):
        target = round(j * num_layers / full_layers)
        free = [a for a in allowed if a not in chosen]
        chosen.append(min(free, key=lambda a: (abs(a - target), a)))
    return "".join("F" if i in chosen else "S" for i in range(num_layers))
