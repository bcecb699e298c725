"""The replay engine's /metrics as SGLang 0.5.23 serves it on the engine's HTTP port.

Names, types, label names and bucket bounds are SGLang's
(policies/prometheus/sglang-0.5.23.metrics.yaml, read from the wheel; tests/runtime checks a
replay's exposition against it). SGLang runs prometheus_client in multiprocess mode, so no
family has ``_created`` samples, histograms' ``le`` read as the catalog writes them ("1.0",
"+Inf"), and gauges of scheduler processes carry no ``pid`` (mode mostrecent).

- tokenizer families (one per instance, on its leader): time to first token (``is_streaming``)
  and inter-token latency on decode and standalone servers only; end-to-end latency and
  ``num_requests_total`` (``is_streaming``) on every server;
- scheduler gauges (running and queued requests, generation throughput, token usage), one
  series per stats-logging rank: attention-TP rank 0 of each attention-DP group, which
  carries ``dp_rank`` under attention DP;
- ``sglang:eplb_balancedness`` (Summary, count and sum only) per forward pass, on the first
  rank, when SGLang reports balancedness (the launcher asks for it whenever EP > 1).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from moe_runtime.replay.load import LoadModel

# sglang/srt/observability/metrics_collector.py (TokenizerMetricsCollector's defaults)
TTFT_BUCKETS = (
    "0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0", "8.0", "10.0", "20.0", "40.0",
    "60.0", "80.0", "100.0", "200.0", "400.0", "+Inf",
)  # fmt: skip
ITL_BUCKETS = (
    "0.002", "0.004", "0.006", "0.008", "0.01", "0.015", "0.02", "0.025", "0.03", "0.035", "0.04",
    "0.06", "0.08", "0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0", "8.0", "+Inf",
)  # fmt: skip
E2E_BUCKETS = (
    "0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0", "8.0", "10.0", "20.0", "40.0",
    "60.0", "80.0", "100.0", "200.0", "400.0", "600.0", "1200.0", "1800.0", "2400.0", "+Inf",
)  # fmt: skip
BUCKETS = {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "e2e": E2E_BUCKETS}


@dataclass(frozen=True)
class EngineLabels:
    """What SGLang's collectors label series with, for one engine instance."""

    model_name: str
    engine_type: str  # prefill, decode, unified
    tp_size: int = 1
    attn_dp: int = 1
    ep_size: int = 1
    report_balancedness: bool = False

    def tokenizer(self) -> dict[str, str]:
        return {"model_name": self.model_name, "engine_type": self.engine_type}

    def stats_ranks(self) -> list[dict[str, str]]:
        """Scheduler labels of every stats-logging rank (attention-TP rank 0 of each DP group)."""
        per_group = max(1, self.tp_size // self.attn_dp)
        per_ep = max(1, self.tp_size // max(1, self.ep_size))
        out = []
        for dp in range(self.attn_dp):
            tp_rank = dp * per_group
            labels = {
                **self.tokenizer(),
                "tp_rank": str(tp_rank),
                "pp_rank": "0",
                "moe_ep_rank": str(tp_rank // per_ep),
            }
            if self.attn_dp > 1:
                labels["dp_rank"] = str(dp)
            out.append(labels)
        return out


class SGLangMetrics(Collector):
    def __init__(self, registry: CollectorRegistry, labels: EngineLabels, load: LoadModel | None) -> None:
        self.labels = labels
        self.load = load
        self._lock = threading.Lock()
        self._bal: dict[str, tuple[int, float]] = {}  # forward_mode -> (count, sum)
        registry.register(self)

    @property
    def observes_first_token(self) -> bool:
        return self.labels.engine_type != "prefill"

    def observe_pass(self, balancedness: float, forward_mode: str) -> None:
        if not self.labels.report_balancedness:
            return
        with self._lock:
            count, total = self._bal.get(forward_mode, (0, 0.0))
            self._bal[forward_mode] = (count + 1, total + balancedness)

    def describe(self) -> Iterator[Any]:
        return iter(())

    def collect(self) -> Iterator[Any]:
        yield from self._tokenizer()
        yield from self._scheduler()
        if self.labels.report_balancedness:
            first = self.labels.stats_ranks()[0]
            bal = SummaryMetricFamily(
                "sglang:eplb_balancedness",
                "Balancedness of MoE in expert parallelism.",
                labels=[*first, "forward_mode"],
            )
            with self._lock:
                for mode, (count, total) in sorted(self._bal.items()):
                    bal.add_metric([*first.values(), mode], count_value=count, sum_value=total)
            yield bal

    def _tokenizer(self) -> Iterator[Any]:
        if self.load is None:
            return
        obs = self.load.observed_copy()
        base = self.labels.tokenizer()
        names, values = [*base, "is_streaming"], list(base.values())
        streams = [s for s in (True, False) if obs.e2e[s].counts.any()]
        if self.observes_first_token:
            ttft = HistogramMetricFamily(
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                labels=names,
            )
            for s in (True, False):
                if obs.ttft[s].counts.any():
                    h = obs.ttft[s]
                    ttft.add_metric([*values, _flag(s)], h.cumulative(), h.sum)
            yield ttft
            itl = HistogramMetricFamily(
                "sglang:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                labels=list(base),
            )
            if obs.itl.counts.any():
                itl.add_metric(values, obs.itl.cumulative(), obs.itl.sum)
            yield itl
        e2e = HistogramMetricFamily(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            labels=names,
        )
        requests = CounterMetricFamily("sglang:num_requests", "Number of requests processed.", labels=names)
        for s in streams:
            h = obs.e2e[s]
            e2e.add_metric([*values, _flag(s)], h.cumulative(), h.sum)
            requests.add_metric([*values, _flag(s)], float(obs.finished[s]))
        yield e2e
        yield requests

    def _scheduler(self) -> Iterator[Any]:
        ranks = self.labels.stats_ranks()
        names = list(ranks[0])
        snap = self.load.snapshot() if self.load is not None else None
        families = {
            "sglang:num_running_reqs": ("The number of running requests.", "running"),
            "sglang:num_queue_reqs": ("The number of requests in the waiting queue.", "queued"),
            "sglang:gen_throughput": ("The generation throughput (token/s).", "gen_throughput"),
            "sglang:token_usage": ("The token usage.", "token_usage"),
        }
        n = len(ranks)
        for name, (doc, attr) in families.items():
            fam = GaugeMetricFamily(name, doc, labels=names)
            total = float(getattr(snap, attr)) if snap is not None else 0.0
            for i, labels in enumerate(ranks):
                if attr == "token_usage":
                    value = total  # a ratio: each DP group's batch is the instance's share
                elif attr in ("running", "queued"):
                    value = float(int(total) // n + (1 if i < int(total) % n else 0))
                else:
                    value = total / n
                fam.add_metric(list(labels.values()), value)
            yield fam


def _flag(stream: bool) -> str:
    return "true" if stream else "false"
