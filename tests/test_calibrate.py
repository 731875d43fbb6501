"""IndexCache calibration (`python -m sglang_glm_tools.calibrate`): search, resume, errors, served loss.

The search is checked where the right answer is known by construction:
- a synthetic loss in which some layers select exactly the keys of the layer they would share
  from (the search itself, resume, no SGLang);
- a real checkpoint whose layers 3, 4 and 5 have a zero indexer head weight (`weights_proj`), so
  all three select the same keys (every score ties; the lowest positions win): sharing 4 or 5
  costs exactly nothing, sharing any other layer changes the model's output.
The searched pattern served by sglang.Engine gives the held-out loss the tool reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_glm_tools.calibrate import parse_args, run
from sglang_glm_tools.calibration import CalibrationError
from sglang_glm_tools.calibration.inputs import inspect_model, load_sequences, load_tokenizer, uniform_pattern
from sglang_glm_tools.calibration.search import SearchLog, greedy_search, share
from sglang_glm_tools.checkpoint import make_tiny_checkpoint
from sglang_glm.layer_plan import LayerPlan, resolve_layer_plan

TOPK = 16
SEQ_LEN = 128
MAX_TOKENS = 512
ZERO_INDEXER_LAYERS = (3, 4, 5)


# ---------------------------------------------------------------- synthetic search (no SGLang)


class SignatureLoss:
    """Loss of a plan = sum over layers of cost[layer] if the top-k it uses is not its own.

    Layer i's "top-k" is signature[i]; a shared layer uses its source layer's signature, so
    sharing a layer whose source has the same signature is free. Counts evaluations.
    """

    def __init__(self, signature, cost, fail_after=None):
        self.signature, self.cost = signature, cost
        self.fail_after = fail_after
        self.calls = 0
        self.plan = None

    def loss(self, plan: LayerPlan) -> float:
        return float(sum(
            self.cost[i] for i in range(len(plan))
            if self.signature[plan.source_layer(i)] != self.signature[i]
        ))

    def set_base(self, plan):
        self.plan = plan
        return self.loss(plan)

    def candidate(self, layer):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("interrupted")
        return self.loss(share(self.plan, layer))

    def commit(self, layer):
        self.plan = share(self.plan, layer)
        return self.loss(self.plan)


SIGNATURE = ["a", "b", "c", "c", "c", "d", "e", "e"]
COST = [9, 5, 4, 1, 1, 3, 2, 1]
HEADER = {"model": "synthetic", "objective": "lm"}


def test_search_shares_layers_with_identical_topk_first(tmp_path):
    evaluator = SignatureLoss(SIGNATURE, COST)
    log = SearchLog(tmp_path / "log.jsonl", HEADER, resume=False)
    steps = greedy_search(evaluator, LayerPlan.all_full(8), 5, log, progress=lambda s: None)
    # Layers 3, 4 (source 2, same "c") and 7 (source 6, same "e") are free; nothing else is.
    assert [s.loss for s in steps] == [0.0, 0.0, 0.0, 0.0]
    assert {s.shared_layer for s in steps[1:]} == {3, 4, 7}
    assert steps[-1].pattern == "FFFSSFFS"
    # Layer 0 is never a candidate; a step evaluates every other full layer once.
    assert all(0 not in s.candidates for s in steps)
    assert evaluator.calls == 7 + 6 + 5
    # One step further: the cheapest real cost is sharing layer 5 ("d" reads "c": cost 3)...
    steps = greedy_search(
        SignatureLoss(SIGNATURE, COST), LayerPlan.all_full(8), 4,
        SearchLog(tmp_path / "log2.jsonl", HEADER, resume=False), progress=lambda s: None,
    )
    # ...or layer 6 ("e" reads "d": 2 + layer 7 then reads "d": 1 = 3); ties go to the higher layer.
    assert steps[-1].loss == 3.0 and steps[-1].shared_layer == 6


def test_resume_continues_the_log_without_recomputing(tmp_path):
    path = tmp_path / "log.jsonl"
    interrupted = SignatureLoss(SIGNATURE, COST, fail_after=9)  # dies in step 2
    with pytest.raises(KeyboardInterrupt):
        greedy_search(interrupted, LayerPlan.all_full(8), 4,
                      SearchLog(path, HEADER, resume=False), progress=lambda s: None)
    with pytest.raises(CalibrationError, match="--resume"):
        SearchLog(path, HEADER, resume=False)
    with pytest.raises(CalibrationError, match="different run.*objective"):
        SearchLog(path, {**HEADER, "objective": "kl"}, resume=True)
    resumed = SignatureLoss(SIGNATURE, COST)
    steps = greedy_search(resumed, LayerPlan.all_full(8), 4,
                          SearchLog(path, HEADER, resume=True), progress=lambda s: None)
    fresh = SignatureLoss(SIGNATURE, COST)
    want = greedy_search(fresh, LayerPlan.all_full(8), 4,
                         SearchLog(tmp_path / "fresh.jsonl", HEADER, resume=False),
                         progress=lambda s: None)
    assert [(s.pattern, s.loss) for s in steps] == [(s.pattern, s.loss) for s in want]
    assert resumed.calls + 9 == fresh.calls  # the 9 logged candidates were not evaluated again


def test_uniform_pattern_is_every_k():
    assert uniform_pattern(8, 4) == "FSFSFSFS"
    assert uniform_pattern(8, 2) == "FSSSFSSS"
    assert uniform_pattern(8, 1) == "FSSSSSSS"
    assert uniform_pattern(8, 8) == "FFFFFFFF"
    # Same as the config rule index_topk_freq = k with index_skip_topk_offset = 1.
    cfg = {"num_hidden_layers": 12, "index_topk_freq": 3, "index_skip_topk_offset": 1}
    assert uniform_pattern(12, 4) == resolve_layer_plan(cfg).pattern
    # Uneven budgets are spaced evenly; with fewer indexer layers they move to the nearest one.
    assert uniform_pattern(8, 3).count("F") == 3
    assert uniform_pattern(8, 2, allowed=(0, 1, 2, 6)) == "FSFSSSSS"  # tie 2 vs 6: lower


# ---------------------------------------------------------------- inputs and errors (no SGLang)


def _text(min_chars: int) -> str:
    import argparse
    import dataclasses

    text = Path(argparse.__file__).read_text() + Path(dataclasses.__file__).read_text()
    assert len(text) >= min_chars
    return text


def _zero_indexer_checkpoint(path: Path) -> Path:
    """8 layers, indexer everywhere; layers 3-5 score every key 0 (identical top-k)."""
    make_tiny_checkpoint(
        path,
        config_overrides={"num_hidden_layers": 8, "index_topk": TOPK, "indexer_types": ["full"] * 8},
        seed=3,
    )
    tensors = load_file(str(path / "model.safetensors"))
    for layer in ZERO_INDEXER_LAYERS:
        name = f"model.layers.{layer}.self_attn.indexer.weights_proj.weight"
        tensors[name] = torch.zeros_like(tensors[name])
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def known_ckpt(tmp_path_factory):
    return _zero_indexer_checkpoint(tmp_path_factory.mktemp("known"))


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    text = _text(40_000)
    (d / "calib.txt").write_text(text[:20_000])
    (d / "heldout.txt").write_text(text[20_000:40_000])
    (d / "empty.txt").write_text("  \n")
    (d / "short.txt").write_text("def f(x):\n    return x\n")
    return d


def _args(model, data, out, *extra):
    return parse_args(["--model", str(model), "--data", str(data), "--out", str(out), *extra])


def test_budget_out_of_range(known_ckpt, data_files, tmp_path):
    for bad in ("0", "9", "-1"):
        with pytest.raises(CalibrationError, match=rf"--full-layers {bad} .*from 1 to 8"):
            run(_args(known_ckpt, data_files / "calib.txt", tmp_path, "--full-layers", bad))


def test_empty_and_too_short_data(known_ckpt, data_files, tmp_path):
    with pytest.raises(CalibrationError, match="empty.txt.* is empty"):
        run(_args(known_ckpt, data_files / "empty.txt", tmp_path, "--full-layers", "4"))
    with pytest.raises(CalibrationError, match=r"short.txt.* gives \d+ tokens.*at least 32"):
        run(_args(known_ckpt, data_files / "short.txt", tmp_path, "--full-layers", "4"))
    with pytest.raises(CalibrationError, match="--max-tokens 20"):
        run(_args(known_ckpt, data_files / "calib.txt", tmp_path, "--full-layers", "4",
                  "--max-tokens", "20"))
    with pytest.raises(CalibrationError, match="--seq-len 16 must lie between"):
        run(_args(known_ckpt, data_files / "calib.txt", tmp_path, "--full-layers", "4",
                  "--seq-len", "16"))
    with pytest.raises(CalibrationError, match="does not exist"):
        run(_args(known_ckpt, data_files / "missing.txt", tmp_path, "--full-layers", "4"))


def test_checkpoint_without_indexers(known_ckpt, data_files, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in known_ckpt.iterdir():
        (bare / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(bare / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if ".indexer." not in k},
              str(bare / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CalibrationError, match="has no indexer tensors.*nothing to calibrate"):
        run(_args(bare, data_files / "calib.txt", tmp_path / "o", "--full-layers", "2"))
    # Command-line form: exit status 2 and the message, before SGLang is imported.
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_glm_tools.calibrate", "--model", str(bare), "--full-layers", "2",
         "--data", str(data_files / "calib.txt"), "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2 and "has no indexer tensors" in proc.stderr


def test_indexer_layers_follow_the_weights(tmp_path):
    """A GLM-5.2 style checkpoint: the search starts from the layers that carry indexer weights."""
    path = make_tiny_checkpoint(
        tmp_path / "shared", config_overrides={"index_topk": TOPK, "index_topk_pattern": "FFSF"},
        seed=2,
    )
    info = inspect_model(path)
    assert info.indexer_layers == (0, 1, 3) and info.start_plan.pattern == "FFSF"
    with pytest.raises(CalibrationError, match="3 layers with indexer weights.*from 1 to 3"):
        run(_args(path, tmp_path / "x.txt", tmp_path / "o", "--full-layers", "4"))


# ---------------------------------------------------------------- the tool on a real model (SGLang)


@pytest.fixture(scope="module")
def calibrated(known_ckpt, data_files, tmp_path_factory):
    """The command run once (its own process: it builds SGLang's model runner in-process)."""
    out = tmp_path_factory.mktemp("calibration")
    cmd = [
        sys.executable, "-m", "sglang_glm_tools.calibrate", "--model", str(known_ckpt),
        "--full-layers", "6", "--data", str(data_files / "calib.txt"),
        "--heldout", str(data_files / "heldout.txt"), "--seq-len", str(SEQ_LEN),
        "--max-tokens", str(MAX_TOKENS), "--objective", "kl", "--no-baseline", "--out", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "result.json").read_text()), proc.stdout


@pytest.mark.slow
def test_search_finds_the_free_layers(calibrated):
    out, result, stdout = calibrated
    # The tool's layer loop (with cached prefixes) equals SGLang's ModelRunner.forward.
    assert result["self_check_max_abs_logit_diff"] == 0.0
    steps = result["steps"]
    first, second = steps[1], steps[2]
    # Step 1: sharing 4 or 5 is exactly free, every other layer costs something.
    costs = {int(k): v for k, v in steps[0]["candidates"].items()}
    assert set(costs) == set(range(1, 8))  # every layer but 0 was a candidate
    assert costs[4] == 0.0 and costs[5] == 0.0
    assert all(costs[layer] > 1e-7 for layer in costs if layer not in (4, 5))
    assert {first["shared_layer"], second["shared_layer"]} == {4, 5}
    assert first["loss"] == 0.0 and second["loss"] == 0.0
    assert second["pattern"] == "FFFFSSFF"
    assert result["pattern"] == "FFFFSSFF"
    assert "--json-model-override-args '{\"index_topk_pattern\": \"" + result["pattern"] in stdout
    assert [row["searched"] for row in result["comparison"]] == [s["pattern"] for s in steps]
    # Overlap: the three zero-indexer layers select identical keys, other pairs do not.
    overlap = json.loads((out / "overlap.json").read_text())
    jac = overlap["jaccard"]
    for a in ZERO_INDEXER_LAYERS:
        for b in ZERO_INDEXER_LAYERS:
            assert jac[a][b] == 1.0
    assert jac[2][3] < 0.9 and jac[5][6] < 0.9 and overlap["tokens_counted"] > 0
    for name in ("loss_vs_full_layers.png", "jaccard_heatmap.png", "result.md", "overlap.md",
                 "search_log.jsonl"):
        assert (out / name).stat().st_size > 0


def _served_heldout_nll(ckpt: Path, heldout: Path, pattern: str, max_tokens: int = MAX_TOKENS) -> float:
    """Mean next-token NLL of the held-out windows from sglang.Engine serving `pattern`."""
    from serving import engine

    info = inspect_model(ckpt)
    windows = load_sequences(heldout, load_tokenizer(ckpt), info,
                             seq_len=SEQ_LEN, max_tokens=max_tokens).token_ids
    with engine(ckpt, skip_tokenizer_init=True,
                json_model_override_args={"index_topk_pattern": pattern}) as llm:
        outs = llm.generate(
            input_ids=[list(w) for w in windows],
            sampling_params={"temperature": 0, "max_new_tokens": 1},
            return_logprob=True, logprob_start_len=0,
        )
    nll = [-lp for o in outs for lp, _, _ in o["meta_info"]["input_token_logprobs"][1:]]
    assert len(nll) == sum(len(w) - 1 for w in windows)
    return sum(nll) / len(nll)


@pytest.mark.slow
def test_served_heldout_loss_matches_the_tool(calibrated, known_ckpt, data_files):
    """sglang.Engine with the searched pattern as launch override: same held-out NLL."""
    _, result, _ = calibrated
    pattern = result["pattern"]
    want = next(r["searched_heldout"] for r in result["comparison"] if r["searched"] == pattern)
    served = _served_heldout_nll(known_ckpt, data_files / "heldout.txt", pattern)
    assert abs(served - want) < 1e-4, (served, want)


@pytest.mark.slow
def test_vocab_sglang_pads(data_files, tmp_path):
    """A 300-token vocabulary, which SGLang pads to 320 lm-head rows: the tool's logits and losses
    cover the 300 real tokens (self-check exact, held-out NLL as served)."""
    ckpt = make_tiny_checkpoint(
        tmp_path / "vocab300", config_overrides={"vocab_size": 300, "index_topk": TOPK}, seed=5
    )
    out = tmp_path / "out"
    max_tokens = 256
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_glm_tools.calibrate", "--model", str(ckpt), "--full-layers", "3",
         "--data", str(data_files / "calib.txt"), "--heldout", str(data_files / "heldout.txt"),
         "--seq-len", str(SEQ_LEN), "--max-tokens", str(max_tokens), "--no-baseline",
         "--no-overlap", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["self_check_max_abs_logit_diff"] == 0.0
    want = next(r["searched_heldout"] for r in result["comparison"] if r["searched"] == result["pattern"])
    served = _served_heldout_nll(ckpt, data_files / "heldout.txt", result["pattern"], max_tokens)
    assert abs(served - want) < 1e-4, (served, want)


def test_report_files(tmp_path):
    """Markdown tables, plot and heatmap from a result with uniform and held-out columns."""
    from sglang_glm_tools.calibration.report import overlap_markdown, plot_heatmap, plot_loss, result_markdown

    steps = [{"num_full": 4 - i, "pattern": p, "loss": 2.0 + 0.1 * i, "shared_layer": s, "candidates": {}}
             for i, (p, s) in enumerate([("FFFF", None), ("FFSF", 2), ("FSSF", 1)])]
    rows = [{"num_full": s["num_full"], "searched": s["pattern"], "uniform": u,
             "searched_calib": s["loss"], "uniform_calib": s["loss"] + 0.05,
             "searched_heldout": s["loss"] + 0.1, "uniform_heldout": s["loss"] + 0.2}
            for s, u in zip(steps, ["FFFF", "FFSF", "FSFS"])]
    result = {"model": "m", "objective": "lm", "budget": 2, "pattern": "FSSF", "steps": steps,
              "comparison": rows, "data": {"describe": "calib"}, "heldout": {"describe": "held"}}
    from sglang_glm_tools.calibration.report import add_recommendation

    assert add_recommendation(dict(result))["recommended_pattern"] == "FSSF"  # searched is lower
    rows[-1]["uniform_calib"] = 2.1  # now uniform every-k beats the greedy path at the budget
    add_recommendation(result)
    assert result["recommended_pattern"] == "FSFS" and "uniform every-k" in result["recommended_reason"]
    md = result_markdown(result)
    assert "recommended instead: `FSFS`" in md
    assert "`FSSF`" in md and "held-out uniform" in md and '{"index_topk_pattern": "FSSF"}' in md
    plot_loss(tmp_path / "loss.png", result)
    overlap = {"layers": [0, 1, 2], "jaccard": [[1, 0.5, 0.2], [0.5, 1, 0.7], [0.2, 0.7, 1]],
               "tokens_counted": 10, "index_topk": 4,
               "adjacent": [{"a": 0, "b": 1, "jaccard": 0.5}, {"a": 1, "b": 2, "jaccard": 0.7}]}
    assert "| 1 | 0.500 | 1.000 | 0.700 |" in overlap_markdown(overlap)
    plot_heatmap(tmp_path / "heat.png", overlap, "t")
    assert (tmp_path / "loss.png").stat().st_size > 1000 and (tmp_path / "heat.png").stat().st_size > 1000
