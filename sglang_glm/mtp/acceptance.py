"""Acceptance statistics for speculative decoding: mean acceptance length and per-position rates.

SGLang reports, per request, `spec_verify_ct` (verify rounds), `spec_accept_length` (completion
tokens / verify rounds) and `spec_correct_drafts_histogram` (hist[j] = rounds in which exactly j
draft tokens were accepted). Per-position acceptance follows from the histogram: draft position k
(1-based) is accepted in a round iff at least k drafts were, so
    rate_k = sum_{j >= k} hist[j] / rounds,
and the mean acceptance length (accepted drafts + the bonus token) is 1 + sum_k rate_k.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceStats:
    rounds: int = 0
    histogram: list[int] = field(default_factory=list)  # histogram[j]: rounds with j correct drafts

    def add_histogram(self, hist) -> None:
        hist = [int(x) for x in hist or []]
        if len(hist) > len(self.histogram):
            self.histogram += [0] * (len(hist) - len(self.histogram))
        for j, n in enumerate(hist):
            self.histogram[j] += n
        self.rounds += sum(hist)

    def add_meta_info(self, meta_info: dict) -> None:
        hist = meta_info.get("spec_correct_drafts_histogram")
        if hist is None:
            raise KeyError(
                "meta_info has no spec_correct_drafts_histogram: was the engine started with "
                "--speculative-algorithm?"
            )
        self.add_histogram(hist)

    def per_position(self, num_positions: int | None = None) -> list[float]:
        n = num_positions if num_positions is not None else max(len(self.histogram) - 1, 0)
        if not self.rounds:
            return [0.0] * n
        rates = []
        for k in range(1, n + 1):
            rates.append(sum(self.histogram[k:]) / self.rounds)
        return rates

    @property
    def mean_accept_length(self) -> float:
        if not self.rounds:
            return 0.0
        return sum(j * n for j, n in enumerate(self.histogram)) / self.rounds + 1.0

    def accept_rate(self, num_steps: int) -> float:
        """Accepted drafts / drafted tokens (the reference change's "acceptance rate")."""
        if not self.rounds:
            return 0.0
        return sum(j * n for j, n in enumerate(self.histogram)) / (self.rounds * num_steps)

    def as_dict(self, num_positions: int | None = None) -> dict:
        return {
            "rounds": self.rounds,
            "mean_accept_length": self.mean_accept_length,
            "per_position_acceptance": self.per_position(num_positions),
            "correct_drafts_histogram": list(self.histogram),
        }


def format_acceptance(stats: AcceptanceStats, num_positions: int | None = None) -> str:
    rates = " ".join(f"p{k + 1}={r:.2f}" for k, r in enumerate(stats.per_position(num_positions)))
    return f"accept_len={stats.mean_accept_length:.3f} over {stats.rounds} rounds; per position: {rates}"


_COUNTERS = None


def _counters():
    """Prometheus counters (created once, in the process that serves meta_info)."""
    global _COUNTERS
    if _COUNTERS is None:
        from prometheus_client import Counter

        _COUNTERS = (
            Counter(
                "sglang_glm:spec_draft_accepted_total",
                "Verify rounds in which the draft token at this position was accepted "
                "(divide by sglang_glm:spec_verify_rounds_total for the per-position rate)",
                ["position"],
            ),
            Counter("sglang_glm:spec_verify_rounds_total", "Speculative verify rounds of finished requests"),
        )
    return _COUNTERS


def report_finished_request(meta_info: dict, num_steps: int, *, enable_metrics: bool, log) -> None:
    """Per-position acceptance of one finished request: into meta_info, the log, Prometheus."""
    hist = meta_info.get("spec_correct_drafts_histogram")
    if not hist:
        return
    stats = AcceptanceStats()
    stats.add_histogram(hist)
    meta_info["spec_accept_per_position"] = stats.per_position(num_steps)
    log.info("MTP acceptance of request %s: %s", meta_info.get("id"), format_acceptance(stats, num_steps))
    if enable_metrics:
        try:
            accepted, rounds = _counters()
            rounds.inc(stats.rounds)
            for k in range(1, num_steps + 1):
                accepted.labels(position=str(k)).inc(sum(stats.histogram[k:]))
        except Exception as exc:  # metrics must never fail a request
            log.warning("MTP acceptance metrics not recorded: %s", exc)
