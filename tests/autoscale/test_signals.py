"""The autoscaler reads SGLang's own /metrics text, and nothing a pod sends can break it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from moe_operator.autoscale import signals as s

CATALOG = Path(__file__).parents[2] / "policies/prometheus/sglang-0.5.23.metrics.yaml"


def _catalog() -> dict:
    return yaml.safe_load(CATALOG.read_text())


def test_every_family_read_is_sglangs_with_its_type() -> None:
    families = {f["name"]: f["type"] for f in _catalog()["families"]}
    expected = {
        s.TTFT: "histogram",
        s.ITL: "histogram",
        s.REQUESTS: "counter",
        s.RUNNING: "gauge",
        s.QUEUED: "gauge",
        s.TOKEN_USAGE: "gauge",
        s.GEN_THROUGHPUT: "gauge",
        **{name: "gauge" for name in s.HANDOFF},
    }
    assert {name: families.get(name) for name in expected} == expected


def test_reads_the_real_exposition_of_sglang() -> None:
    text = _catalog()["exposition"]["text"]
    scrape = s.parse(text, at=0.0)
    assert s.TTFT in scrape.histograms and s.ITL in scrape.histograms
    assert scrape.histograms[s.TTFT].uppers[-1] == math.inf
    assert s.RUNNING in scrape.gauges and s.TOKEN_USAGE in scrape.gauges


def _page(requests: float, ttft: list[tuple[str, float]], running: float = 3, usage: float = 0.5) -> str:
    lines = [
        "# TYPE sglang:num_requests counter",
        f'sglang:num_requests_total{{model_name="m",is_streaming="true"}} {requests}',
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{dp_rank="0"}} {running}',
        f'sglang:num_running_reqs{{dp_rank="1"}} {running}',
        "# TYPE sglang:token_usage gauge",
        f'sglang:token_usage{{dp_rank="0"}} {usage}',
        f'sglang:token_usage{{dp_rank="1"}} {usage / 2}',
        "# TYPE sglang:time_to_first_token_seconds histogram",
    ]
    lines += [f'sglang:time_to_first_token_seconds_bucket{{le="{le}"}} {c}' for le, c in ttft]
    lines += [
        f"sglang:time_to_first_token_seconds_count {ttft[-1][1]}",
        "sglang:time_to_first_token_seconds_sum 1",
    ]
    return "\n".join(lines) + "\n"


def test_an_interval_is_the_difference_of_two_scrapes() -> None:
    old = s.parse(_page(100, [("0.1", 10), ("1.0", 20), ("+Inf", 20)]), at=0.0)
    new = s.parse(_page(160, [("0.1", 10), ("1.0", 120), ("+Inf", 120)]), at=30.0)
    sample = s.between(old, new)
    assert sample is not None
    assert sample.rate == pytest.approx(2.0)
    assert sample.running == 6 and sample.token_usage == pytest.approx(0.375)
    assert sample.ttft is not None
    # the interval's 100 observations are all in (0.1, 1.0]: p50 is halfway, as histogram_quantile says
    assert sample.ttft.quantile(0.5) == pytest.approx(0.55)


def test_a_restarted_engine_gives_no_interval() -> None:
    old = s.parse(_page(100, [("0.1", 10), ("+Inf", 20)]), at=0.0)
    new = s.parse(_page(5, [("0.1", 1), ("+Inf", 2)]), at=30.0)
    assert s.between(old, new) is None


def test_quantile_follows_prometheus() -> None:
    h = s.Histogram((0.1, 0.2, 0.4, math.inf), (0.0, 50.0, 100.0, 100.0))
    assert h.quantile(0.5) == pytest.approx(0.2)
    assert h.quantile(0.75) == pytest.approx(0.3)
    assert s.Histogram((0.1, math.inf), (0.0, 0.0)).quantile(0.9) is None
    assert s.Histogram((0.1, math.inf), (0.0, 10.0)).quantile(0.9) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('# TYPE sglang:num_requests counter\nsglang:num_requests_total{a="b"} NaN\n', "finite"),
        ("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs -4\n", "non-negative"),
        (
            "# TYPE sglang:time_to_first_token_seconds histogram\n"
            'sglang:time_to_first_token_seconds_bucket{le="0.1"} 5\n'
            'sglang:time_to_first_token_seconds_bucket{le="+Inf"} 2\n',
            "cumulative",
        ),
        (
            "# TYPE sglang:time_to_first_token_seconds histogram\n"
            'sglang:time_to_first_token_seconds_bucket{le="0.1"} 5\n',
            r"\+Inf",
        ),
        (
            "# TYPE sglang:inter_token_latency_seconds histogram\n"
            + "".join(f'sglang:inter_token_latency_seconds_bucket{{le="{i + 1}"}} {i}\n' for i in range(70)),
            "buckets",
        ),
        ("sglang:num_requests_total{{{ 12\n", "parse"),
        ('sglang:num_requests_total{a="b"} 1e250\n', "at most"),
        ('sglang:time_to_first_token_seconds_bucket{le="1e-310"} 5\n', "not a latency"),
        ('sglang:time_to_first_token_seconds_bucket{le="-5"} 5\n', "not a latency"),
        ("".join(f'sglang:num_running_reqs{{r="{i}"}} 1\n' for i in range(5000)), "series"),
        # the parser's cost grows with the square of one line's labels: refused before parsing
        ("sglang:num_running_reqs{" + ",".join(f'l{i}="v"' for i in range(100_000)) + "} 1\n", "labels"),
        ("sglang:num_running_reqs{" + ",".join(f'l{i}="v"' for i in range(65)) + "} 1\n", "labels"),
        ('sglang:num_running_reqs{a="' + "x" * 70_000 + '"} 1\n', "characters"),
    ],
)
def test_hostile_metrics_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(s.ExpositionError, match=message):
        s.parse(text, at=0.0)


def test_only_the_wanted_series_are_parsed() -> None:
    junk = "# HELP x y\n" + 'a_metric_nobody_reads{l="\\\\"} 1\n' * 50_000
    page = junk + _page(7, [("0.1", 1), ("+Inf", 2)]) + junk
    scrape = s.parse(page, at=0.0)
    assert scrape.requests == 7 and scrape.gauges[s.RUNNING] == 6


def test_one_odd_instance_cannot_take_the_pools_latency_over() -> None:
    honest = s.Histogram((0.1, math.inf), (5.0, 10.0))
    odd = s.Histogram((9.0, math.inf), (0.0, 1000.0))
    merged = s.merged([odd, honest, honest])
    assert merged is not None and merged.uppers == honest.uppers and merged.counts == (10.0, 20.0)


def test_histograms_of_a_pool_add_up() -> None:
    a = s.Histogram((0.1, math.inf), (1.0, 2.0))
    b = s.Histogram((0.1, math.inf), (3.0, 4.0))
    merged = s.merged([a, None, b])
    assert merged is not None and merged.counts == (4.0, 6.0)
    assert s.merged([None]) is None


def test_rates_and_queues_no_engine_has_are_refused() -> None:
    """A forged counter leap or queue gauge is refused (the caller counts a failed scrape), not
    summed into the pool's load; a restart still gives no interval, without an error."""
    old = s.parse(_page(100, [("0.1", 10), ("+Inf", 20)]), at=0.0)
    leap = s.parse(_page(100 + 30 * 2e4, [("0.1", 10), ("+Inf", 20)]), at=30.0)  # 20,000 requests/s
    with pytest.raises(s.ExpositionError, match="no engine"):
        s.between(old, leap)
    crowded = s.parse(_page(160, [("0.1", 10), ("+Inf", 20)], running=4e9), at=30.0)  # 8e9 running
    with pytest.raises(s.ExpositionError, match="no engine"):
        s.between(old, crowded)
    assert s.between(old, s.parse(_page(160, [("0.1", 10), ("+Inf", 20)]), at=30.0)) is not None


def test_a_real_page_with_a_long_model_name_and_a_custom_label_is_read() -> None:
    """Custom labels (--tokenizer-metrics-allowed-custom-labels) carry request header values:
    a long one is a long line, not a hostile one."""
    page = _page(7, [("0.1", 1), ("+Inf", 2)]).replace(
        'model_name="m"', f'model_name="{"m" * 256}",tenant="{"t" * 4000}"'
    )
    assert s.parse(page, at=0.0).requests == 7
