"""IndexCache calibration: which layers keep their indexer, for a checkpoint and a budget.

    sglang-glm-calibrate --model PATH --full-layers N --data FILE [--out DIR] [--resume]
        [--heldout FILE] [--seq-len L] [--max-tokens T] [--objective lm|kl]

Greedy search (in the spirit of IndexCache, arXiv 2603.12201): start with every layer that has
indexer weights full and repeatedly share the layer whose sharing raises the calibration loss
least, until N full layers remain (layer 0 stays full). The plugin's own GLM-DSA model runs inside
SGLang's in-process model runner (no server); each candidate is a per-forward plan, and the
residual stream entering the first layer a candidate changes is cached, so candidates need no
restart and only re-run the layers they change.

Writes into --out: `search_log.jsonl` (every loss; `--resume` continues from it), `result.json`
and `result.md` (the pattern for `--json-model-override-args '{"index_topk_pattern": ...}'`, the
loss at every step, the searched vs uniform every-k comparison), `loss_vs_full_layers.png`, and
the cross-layer top-k overlap: `overlap.json`, `overlap.md`, `jaccard_heatmap.png`.

Needs SGLang (0.5.23; on a CPU-only machine through `sglang_glm.cpu_compat`, for small models).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sglang_glm_tools.calibration import CalibrationError
from sglang_glm_tools.calibration.inputs import (
    check_budget,
    inspect_model,
    load_sequences,
    load_tokenizer,
    uniform_pattern,
)
from sglang_glm_tools.calibration.report import (
    add_recommendation,
    override_arg,
    overlap_markdown,
    plot_heatmap,
    plot_loss,
    result_markdown,
    write_json,
)
from sglang_glm_tools.calibration.search import SearchLog, greedy_search, steps_as_dicts
from sglang_glm.layer_plan import LayerPlan


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="sglang-glm-calibrate", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model", required=True, help="GLM-DSA checkpoint directory")
    ap.add_argument("--full-layers", type=int, required=True,
                    help="budget N: layers that keep their indexer (layer 0 included)")
    ap.add_argument("--data", required=True, help="calibration text (UTF-8)")
    ap.add_argument("--out", default=None, help="output directory (default calibration-<model>)")
    ap.add_argument("--resume", action="store_true", help="continue the search log in --out")
    ap.add_argument("--heldout", default=None,
                    help="held-out text: report held-out loss of searched and uniform patterns")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="tokens per calibration window (default min(1024, max positions))")
    ap.add_argument("--max-tokens", type=int, default=8192,
                    help="use at most this many tokens of --data (and of --heldout)")
    ap.add_argument("--batch-seqs", type=int, default=4, help="windows per forward batch")
    ap.add_argument("--objective", choices=("lm", "kl"), default="lm",
                    help="lm: next-token NLL (default); kl: KL to the all-full plan")
    ap.add_argument("--no-overlap", action="store_true", help="skip the top-k overlap report")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip evaluating the uniform every-k patterns")
    ap.add_argument("--skip-check", action="store_true",
                    help="skip comparing this tool's forward with ModelRunner.forward")
    return ap.parse_args(argv)


def run(args) -> dict:
    """The whole tool; returns result.json's content. Raises CalibrationError on bad inputs."""
    t_start = time.time()
    info = inspect_model(args.model)
    check_budget(info, args.full_layers)
    if args.batch_seqs < 1:
        raise CalibrationError(f"--batch-seqs {args.batch_seqs} must be >= 1")
    tokenizer = load_tokenizer(info.path)
    calib = load_sequences(args.data, tokenizer, info, seq_len=args.seq_len,
                           max_tokens=args.max_tokens)
    heldout = None
    if args.heldout:
        heldout = load_sequences(args.heldout, tokenizer, info, seq_len=calib.seq_len,
                                 max_tokens=args.max_tokens, what="--heldout")
    out = Path(args.out or f"calibration-{info.path.name}")
    out.mkdir(parents=True, exist_ok=True)
    start = info.start_plan
    header = {
        "model": str(info.path.resolve()),
        "data_sha256": calib.text_sha256,
        "seq_len": calib.seq_len,
        "max_tokens": args.max_tokens,
        "num_tokens": calib.num_tokens,
        "batch_seqs": args.batch_seqs,
        "objective": args.objective,
        "start_pattern": start.pattern,
    }
    log = SearchLog(out / "search_log.jsonl", header, resume=args.resume)
    print(f"model {info.path}: {info.num_layers} layers, indexer weights in "
          f"{len(info.indexer_layers)} ({start.pattern}), index_topk {info.index_topk}")
    print(calib.describe())
    if heldout:
        print(heldout.describe())

    from sglang_glm_tools.calibration.runner import CachedPlanLoss, InProcessModel, mean_nll

    t = time.time()
    total_tokens = calib.num_tokens + (heldout.num_tokens if heldout else 0)
    num_seqs = len(calib.token_ids) + (len(heldout.token_ids) if heldout else 0)
    model = InProcessModel(info, max_total_tokens=total_tokens, max_requests=num_seqs)
    batches = model.make_batches(calib, args.batch_seqs)
    held_batches = model.make_batches(heldout, args.batch_seqs) if heldout else []
    check = None if args.skip_check else model.self_check(batches[0])
    print(f"SGLang model runner ready in {time.time() - t:.1f} s"
          + ("" if check is None else f"; this tool's layer loop vs ModelRunner.forward: "
             f"max |logit diff| {check:.2e}"), flush=True)
    if check is not None and check > 1e-3:
        print(f"warning: this tool's forward differs from ModelRunner.forward by {check:.2e} in "
              f"the logits; its losses may not match what a server reports", flush=True)

    overlap = None
    if not args.no_overlap:
        from sglang_glm_tools.calibration.overlap import topk_overlap

        overlap = topk_overlap(model, batches).as_dict()
        write_json(out / "overlap.json", overlap)
        (out / "overlap.md").write_text(overlap_markdown(overlap))
        plot_heatmap(out / "jaccard_heatmap.png", overlap,
                     f"top-k Jaccard, {info.path.name} ({overlap['tokens_counted']} tokens)")
        print("adjacent-layer top-k Jaccard: " + ", ".join(
            f"{d['a']}-{d['b']} {d['jaccard']:.3f}" for d in overlap["adjacent"]))

    evaluator = CachedPlanLoss(model, batches, args.objective)
    steps = greedy_search(evaluator, start, args.full_layers, log,
                          progress=lambda message: print(message, flush=True))
    final = LayerPlan.from_pattern(steps[-1].pattern)

    comparison = []
    # Searched vs uniform every-k at every budget the search passed, in next-token NLL from the
    # plugin's whole-model forward (for the lm objective the searched calibration figure is the
    # search's own, which the whole forward reproduces exactly).
    memo: dict[tuple[str, str], float] = {}

    def nll(pattern: str, which: str) -> float:
        if (pattern, which) not in memo:
            memo[pattern, which] = mean_nll(
                model, batches if which == "calib" else held_batches, LayerPlan.from_pattern(pattern)
            )
        return memo[pattern, which]

    for s in steps:
        if args.objective == "lm":
            memo[s.pattern, "calib"] = s.loss
        row = {"num_full": s.num_full, "searched": s.pattern, "searched_calib": nll(s.pattern, "calib")}
        if held_batches:
            row["searched_heldout"] = nll(s.pattern, "heldout")
        if not args.no_baseline:
            uniform = uniform_pattern(info.num_layers, s.num_full, info.indexer_layers)
            row["uniform"] = uniform
            row["uniform_calib"] = nll(uniform, "calib")
            if held_batches:
                row["uniform_heldout"] = nll(uniform, "heldout")
        comparison.append(row)
        print(f"  {s.num_full} full: searched {s.pattern} calib {row['searched_calib']:.5f}"
              + (f" held-out {row['searched_heldout']:.5f}" if held_batches else "")
              + (f" | uniform {row['uniform']} calib {row['uniform_calib']:.5f}"
                 + (f" held-out {row['uniform_heldout']:.5f}" if held_batches else "")
                 if "uniform" in row else ""), flush=True)

    result = {
        "model": str(info.path),
        "budget": args.full_layers,
        "pattern": final.pattern,
        "json_model_override_args": {"index_topk_pattern": final.pattern},
        "objective": args.objective,
        "data": {"file": calib.source, "describe": calib.describe(), **header},
        "heldout": {"file": heldout.source, "describe": heldout.describe(),
                    "num_tokens": heldout.num_tokens} if heldout else None,
        "self_check_max_abs_logit_diff": check,
        "steps": steps_as_dicts(steps),
        "comparison": comparison,
        "overlap_adjacent": overlap["adjacent"] if overlap else None,
        "seconds": round(time.time() - t_start, 1),
    }
    add_recommendation(result)
    write_json(out / "result.json", result)
    (out / "result.md").write_text(result_markdown(result))
    plot_loss(out / "loss_vs_full_layers.png", result)
    print(f"\n{final.describe()}\nloss {steps[-1].loss:.5f} ({args.objective}); serve with:\n"
          f"  {override_arg(final.pattern)}")
    if result["recommended_pattern"] != final.pattern:
        print(f"note: {result['recommended_reason']}; recommended instead:\n"
              f"  {override_arg(result['recommended_pattern'])}")
    print(f"written to {out}/")
    return result


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
