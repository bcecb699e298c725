"""What one instance's SGLang metrics say about one interval: rate, queue, KV use, latency.

SGLang's metrics are cumulative (counters, histograms), so an interval is the difference of
two scrapes of the same instance. The exposition is read from a peer the operator does not
trust: only the families below are kept, values must be finite and non-negative, and a
counter that went backwards (an engine restart) yields no sample rather than a negative one.
Names are SGLang 0.5.23's (policies/prometheus/sglang-0.5.23.metrics.yaml).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"
REQUESTS = "sglang:num_requests"
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
GEN_THROUGHPUT = "sglang:gen_throughput"
# P/D hand-off queues: a request waiting for its KV to arrive (decode) or to leave (prefill)
HANDOFF = (
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
)
GAUGES = (RUNNING, QUEUED, TOKEN_USAGE, GEN_THROUGHPUT, *HANDOFF)
WANTED = frozenset({f"{REQUESTS}_total", *GAUGES, f"{TTFT}_bucket", f"{ITL}_bucket"})
WANTED_PREFIXES = tuple(f"{n}{{" for n in WANTED) + tuple(f"{n} " for n in WANTED)
MAX_BUCKETS = 64  # SGLang's longest default has 23 bounds
MAX_VALUE = 1e12  # a count or gauge beyond it is no engine's (1e12 requests at 1e4/s is three years)
MAX_SERIES = 4096  # per name: one per scheduler rank and label set; the widest world is 2048 ranks
BOUND_RANGE = (1e-6, 1e4)  # seconds: a latency bucket outside it is no SGLang bucket
# SGLang's lines carry a handful of labels (model name, ranks, is_streaming, le, and the custom
# labels --tokenizer-metrics-allowed-custom-labels adds). The parser's cost grows with the square of
# a line's labels, so a line with more, or longer than MAX_LINE, is refused unparsed.
MAX_LABELS = 64  # "=" signs in one line (a label value may hold a few)
MAX_LINE = 65536
MAX_RATE = 1e4  # finished requests/s of one instance: beyond any engine (as model.MAX_RATE)
MAX_IN_ENGINE = 1e6  # requests running, queued or in hand-off on one instance: beyond any engine's memory


class ExpositionError(ValueError):
    """Metrics text the autoscaler cannot use; the message is safe to show in status."""


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts summed over label sets, by upper bound (``+Inf`` last)."""

    uppers: tuple[float, ...]
    counts: tuple[float, ...]

    def minus(self, older: Histogram) -> Histogram | None:
        if self.uppers != older.uppers:
            return None
        delta = tuple(a - b for a, b in zip(self.counts, older.counts, strict=True))
        return None if any(d < 0 for d in delta) else Histogram(self.uppers, delta)

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear inside the bucket; None without observations."""
        total = self.counts[-1] if self.counts else 0.0
        if not math.isfinite(total) or total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for upper, cum in zip(self.uppers, self.counts, strict=True):
            if cum >= rank:
                if math.isinf(upper):
                    return lower  # past the last finite bound: its value, as Prometheus does
                inside = cum - below
                return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = upper, cum
        return lower


@dataclass(frozen=True)
class Scrape:
    """One instance's cumulative metrics at one time (seconds, the operator's clock)."""

    at: float
    requests: float  # finished requests, all label sets
    gauges: dict[str, float] = field(default_factory=dict)  # summed over ranks (token usage: mean)
    histograms: dict[str, Histogram] = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceSample:
    """One instance over one interval: what the autoscaler's model is fitted on."""

    rate: float  # finished requests per second
    running: float
    queued: float
    handoff: float  # requests in the P/D transfer queues (0 on a standalone server)
    token_usage: float  # 0..1, mean over the instance's scheduler ranks
    ttft: Histogram | None  # observations in the interval (None: the server does not observe it)
    itl: Histogram | None


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value) or not 0 <= value <= MAX_VALUE:
        raise ExpositionError(
            f"{what} is {value!r}: metrics must be finite, non-negative and at most {MAX_VALUE:g}"
        )
    return value


def _histogram(samples: list[tuple[dict[str, str], float]], name: str) -> Histogram | None:
    by_bound: dict[float, float] = {}
    for labels, value in samples:
        if "le" not in labels:
            continue
        try:
            bound = float(labels["le"])
        except ValueError as e:
            raise ExpositionError(f"{name}: bucket bound {labels['le'][:20]!r} is not a number") from e
        if not (math.isinf(bound) and bound > 0) and not BOUND_RANGE[0] <= bound <= BOUND_RANGE[1]:
            raise ExpositionError(f"{name}: bucket bound {bound!r} is not a latency in seconds")
        by_bound[bound] = by_bound.get(bound, 0.0) + value
        if len(by_bound) > MAX_BUCKETS:
            raise ExpositionError(f"{name}: more than {MAX_BUCKETS} buckets")
    if not by_bound:
        return None
    uppers = tuple(sorted(by_bound))
    if not math.isinf(uppers[-1]):
        raise ExpositionError(f"{name}: no +Inf bucket")
    counts = tuple(by_bound[u] for u in uppers)
    if any(b < a for a, b in itertools.pairwise(counts)):
        raise ExpositionError(f"{name}: bucket counts are not cumulative")
    return Histogram(uppers, counts)


def parse(text: str, at: float) -> Scrape:
    """Read the series the autoscaler uses from an SGLang /metrics page.

    Samples are matched by series name, not by family: how a parser groups ``_total`` and
    ``_bucket`` samples under ``# TYPE`` lines is not something a peer should be able to steer.
    """
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    # Only the wanted series' lines reach the (pure-Python, slow) parser: a peer's 8 MB of
    # anything else costs a scan, not a parse. Comments go too: samples are matched by name.
    lines = [line for line in text.splitlines() if line.startswith(WANTED_PREFIXES)]
    if any(len(line) > MAX_LINE or line.count("=") > MAX_LABELS for line in lines):
        raise ExpositionError(
            f"a line of a wanted series has more than {MAX_LABELS} labels or {MAX_LINE} characters"
        )
    kept = "\n".join(lines)
    try:
        for family in text_string_to_metric_families(kept + "\n"):
            for sample in family.samples:
                if sample.name in WANTED:
                    value = _finite(float(sample.value), sample.name)
                    series = samples.setdefault(sample.name, [])
                    if len(series) >= MAX_SERIES:
                        raise ExpositionError(f"{sample.name}: more than {MAX_SERIES} series")
                    series.append((dict(sample.labels), value))
    except (ValueError, TypeError, IndexError) as e:
        if isinstance(e, ExpositionError):
            raise
        raise ExpositionError(f"metrics text does not parse: {str(e)[:120]}") from e
    requests = sum(v for _, v in samples.get(f"{REQUESTS}_total", []))
    gauges: dict[str, float] = {}
    for name in GAUGES:
        values = [v for _, v in samples.get(name, [])]
        if values:
            gauges[name] = sum(values) / len(values) if name == TOKEN_USAGE else sum(values)
    histograms = {}
    for name in (TTFT, ITL):
        h = _histogram(samples.get(f"{name}_bucket", []), name)
        if h is not None:
            histograms[name] = h
    return Scrape(at=at, requests=requests, gauges=gauges, histograms=histograms)


def between(older: Scrape, newer: Scrape) -> InstanceSample | None:
    """The interval between two scrapes; None when it is empty or the engine restarted.

    Raises ExpositionError for numbers no engine has (a lie, or a glitch, must not steer the
    pool's size; the caller counts it as a failed scrape)."""
    dt = newer.at - older.at
    if dt <= 0 or newer.requests < older.requests:
        return None

    def delta(name: str) -> Histogram | None:
        a, b = newer.histograms.get(name), older.histograms.get(name)
        if a is None:
            return None
        return a if b is None else a.minus(b)

    g = newer.gauges
    rate = (newer.requests - older.requests) / dt
    in_engine = (g.get(RUNNING, 0.0), g.get(QUEUED, 0.0), sum(g.get(name, 0.0) for name in HANDOFF))
    if rate > MAX_RATE or max(in_engine) > MAX_IN_ENGINE:
        raise ExpositionError(
            f"{rate:.3g} requests/s and {max(in_engine):.3g} requests in the engine: no engine's numbers "
            f"(at most {MAX_RATE:g}/s and {MAX_IN_ENGINE:g})"
        )
    return InstanceSample(
        rate=rate,
        running=in_engine[0],
        queued=in_engine[1],
        handoff=in_engine[2],
        token_usage=min(1.0, g.get(TOKEN_USAGE, 0.0)),
        ttft=delta(TTFT),
        itl=delta(ITL),
    )


def merged(histograms: Sequence[Histogram | None]) -> Histogram | None:
    """The pool's histogram: bucket counts added across the instances that share the most common
    bounds (SGLang's defaults on an honest pool; one odd instance cannot take the pool's latency over).

    Counts are added as they are: a cache-aware router sends most requests to one instance at
    low load, so weighing instances alike would misread an honest pool. A pod that lies about
    its own latency can hide its own pool's breach, nobody else's.
    """
    present = [h for h in histograms if h is not None]
    if not present:
        return None
    layouts = Counter(h.uppers for h in present)
    uppers = layouts.most_common(1)[0][0]
    same = [h for h in present if h.uppers == uppers]
    counts = tuple(sum(h.counts[i] for h in same) for i in range(len(uppers)))
    return Histogram(uppers, counts)
