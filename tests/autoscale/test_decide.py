"""The capacity decision: data in, a decision out; every rule here could be broken by a change."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from moe_operator.autoscale.decide import (
    Objective,
    PoolObservation,
    PoolPolicy,
    PoolState,
    Width,
    decide_pool,
    within_budget,
)
from moe_operator.autoscale.model import Fit

FIT = Fit(base_s=0.03, mu=4.0)  # 2 requests/s per instance at a 60 ms ITL; 1.8 with headroom 0.9
NARROW = Width(nodes=2, gpus=16, kv_tokens=100_000)
WIDE = Width(nodes=4, gpus=32, kv_tokens=500_000)  # expert weights per GPU shrink: more KV per GPU
POLICY = PoolPolicy(
    objectives=(Objective("itl", 0.06, 0.9),),
    min_instances=1,
    max_instances=10,
    width=NARROW,
    widths=(NARROW, WIDE),
)


def _obs(
    at: float, rate: float, serving: int, itl: float | None = None, usage: float = 0.3
) -> PoolObservation:
    latency = min(FIT.latency(rate / serving), 5.0) if itl is None else itl  # overload: the queue's wait
    return PoolObservation(
        at=at, serving=serving, rate=rate, latency={"itl": latency}, token_usage=usage, queued=0
    )


def _run(state: PoolState, points: list[tuple[float, float, int]], policy: PoolPolicy = POLICY):
    d = None
    for at, rate, serving in points:
        d = decide_pool(policy, state, _obs(at, rate, serving))
        state = d.state
    assert d is not None
    return d


def _steady(instances: int, rate: float, until: float = 600.0) -> PoolState:
    """A pool that has run ``instances`` instances at ``rate`` for a while."""
    state = PoolState(instances=instances, fits={"itl": FIT})
    return _run(state, [(t, rate, instances) for t in range(0, int(until), 30)]).state


def test_steady_load_keeps_the_size() -> None:
    state = _steady(3, 4.0)
    d = decide_pool(POLICY, state, _obs(630, 4.0, 3))
    assert (d.instances, d.reason) == (3, "steady")


def test_a_load_step_scales_out_to_the_need_bounded_by_the_step_and_max() -> None:
    state = _steady(2, 3.0)
    d = decide_pool(POLICY, state, _obs(630, 12.0, 2))
    assert d.reason == "scale_out"
    assert d.instances == 2 + POLICY.max_step_out  # the need (7+) is more than one step
    narrow_max = dataclasses.replace(POLICY, max_instances=4)
    assert decide_pool(narrow_max, state, _obs(630, 12.0, 2)).instances == 4
    assert "needs" in d.message and "req/s" in d.message


def test_a_growing_queue_orders_the_instances_that_drain_it() -> None:
    """Instances ordered under overload find a queue when they boot: sized to the arrivals alone,
    they would leave it (and its TTFT) to drain at the headroom's pace."""
    state = _steady(2, 3.0)
    grows = dataclasses.replace(_obs(600, 3.6, 2, itl=0.2), queued=90.0)  # 3 requests/s more, breached
    d = decide_pool(POLICY, state, grows)
    # offered 3.6 + 3; then what waits when they serve (90 + 3 x 300 s) drained in 300 s: 3.3
    assert d.numbers["offeredRate"] == pytest.approx(6.6)
    assert d.numbers["forecastRate"] == pytest.approx(6.6 + 3.3)
    assert d.need == 6  # 4 for the arrivals alone, at 1.8 requests/s each
    # the same growth with latency inside the SLO: one interval's growth is no overload
    calm = decide_pool(POLICY, state, dataclasses.replace(grows, latency={"itl": 0.05}))
    assert calm.numbers["forecastRate"] == pytest.approx(6.6)
    # a flood is drained by at most what the largest pool serves (10 instances at the fitted rate)
    flood = decide_pool(POLICY, state, dataclasses.replace(grows, queued=1e6))
    largest = POLICY.max_instances * flood.numbers["itlRatePerInstance"] * POLICY.headroom
    assert flood.numbers["forecastRate"] == pytest.approx(flood.numbers["offeredRate"] + largest)


def test_a_queue_that_stands_while_latency_is_fine_holds_nothing_up() -> None:
    """A queue that neither grows nor comes with a breach is no overload (a lying pod can say so):
    it must not block a scale-in nor add an instance."""
    state = dataclasses.replace(_steady(3, 3.0), queued=1e6)
    d = decide_pool(POLICY, state, dataclasses.replace(_obs(630, 3.0, 3), queued=1e6))
    assert d.numbers["forecastRate"] == pytest.approx(3.0, rel=0.05) and d.need == 2
    later = _run(d.state, [(660 + 30 * i, 3.0, 3) for i in range(30)])
    assert later.state.instances == 2  # scaled in


def test_scale_out_waits_for_its_cooldown() -> None:
    state = _steady(2, 3.0)
    first = decide_pool(POLICY, state, _obs(630, 6.0, 2))
    assert first.reason == "scale_out"
    again = decide_pool(POLICY, first.state, _obs(660, 14.0, 2))
    assert (again.instances, again.reason) == (first.instances, "cooldown")


def test_a_breach_the_model_did_not_predict_adds_an_instance() -> None:
    state = _steady(3, 4.0)
    d = decide_pool(POLICY, state, _obs(630, 4.0, 3, itl=0.2))
    assert d.instances >= 4 and d.reason == "scale_out"
    assert "SLO breached" in d.message


def test_scale_in_is_one_at_a_time_after_the_window() -> None:
    state = _steady(6, 10.0)
    low = [(600 + 30 * i, 1.0, 6) for i in range(1, 60)]
    sizes = []
    for at, rate, _ in low:
        d = decide_pool(POLICY, state, _obs(at, rate, state.instances))
        sizes.append(d.instances)
        state = d.state
    steps = [a - b for a, b in itertools.pairwise(sizes)]
    assert max(steps) == 1 and min(steps) >= 0  # never more than one at a time
    assert sizes[0] == 6  # the high rate is still inside the scale-in window
    assert sizes[-1] == 1


def test_no_scale_in_while_booting_or_breached() -> None:
    state = dataclasses.replace(_steady(4, 1.0, until=1800), instances=5)  # one still booting
    d = decide_pool(POLICY, state, _obs(1830, 1.0, 4))
    assert (d.instances, d.reason) == (5, "booting")
    state = _steady(4, 1.0, until=1800)
    d = decide_pool(POLICY, state, _obs(1830, 1.0, 4, itl=0.5))
    assert d.instances >= 4


def test_never_below_min_nor_what_the_load_needs() -> None:
    policy = dataclasses.replace(POLICY, min_instances=3)
    d = decide_pool(policy, PoolState(instances=1, fits={"itl": FIT}), _obs(0, 0.1, 1))
    assert d.instances == 3
    state = _steady(4, 7.0, until=1800)
    d = decide_pool(POLICY, state, _obs(1830, 7.0, 4))
    assert d.instances == 4  # 7 req/s needs ceil(7 / 1.8) = 4


def test_no_data_keeps_the_size() -> None:
    state = PoolState(instances=3, fits={"itl": FIT})
    for obs in (None, dataclasses.replace(_obs(0, 1.0, 1), serving=0)):
        d = decide_pool(POLICY, state, obs)
        assert (d.instances, d.reason) == (3, "no_data")


def test_an_unreachable_slo_asks_for_the_maximum() -> None:
    policy = dataclasses.replace(POLICY, objectives=(Objective("itl", 0.02, 0.9),))  # below the no-load ITL
    d = decide_pool(policy, PoolState(instances=2, fits={"itl": FIT}), _obs(0, 1.0, 2))
    assert d.instances == 2 + policy.max_step_out
    assert "itl_unreachable" in d.message


def test_full_kv_at_low_compute_recommends_a_wider_instance() -> None:
    state = _steady(4, 2.0)
    d = decide_pool(POLICY, state, _obs(630, 2.0, 4, usage=0.99))
    assert d.width == WIDE
    assert "KV-bound" in d.message and d.need >= 5
    calm = decide_pool(POLICY, state, _obs(630, 2.0, 4, usage=0.3))
    assert calm.width is None


def test_a_remembered_surge_keeps_headroom_then_fades() -> None:
    state = _steady(2, 2.0)
    burst = [(630 + 30 * i, 2.0 + 1.0 * i, state.instances) for i in range(6)]  # +5 req/s in 3 min
    d = _run(state, burst)
    assert d.state.surge >= 3.0  # +4 req/s (medians of three) less two Poisson deviations
    back = _run(d.state, [(900 + 30 * i, 2.0, d.state.instances) for i in range(20)])
    assert back.need > 2  # still covering the surge at the old rate
    later = _run(back.state, [(60_000 + 30 * i, 2.0, back.state.instances) for i in range(3)])
    assert later.state.surge < d.state.surge / 4


def test_the_burst_reserve_scales_the_spare_capacity_held_for_a_remembered_surge() -> None:
    """burstReserve: 0 holds nothing for bursts, 1 the largest rise remembered, 1.5 half as much again."""
    state = dataclasses.replace(_steady(2, 2.0), surge=3.6)  # two instances' worth at 1.8 each
    held = {
        r: decide_pool(dataclasses.replace(POLICY, burst_reserve=r), state, _obs(630, 2.0, 2))
        for r in (0.0, 1.0, 1.5)
    }
    forecast = [held[r].numbers["forecastRate"] for r in (0.0, 1.0, 1.5)]
    assert forecast == pytest.approx([2.0, 5.6, 7.4], rel=0.01)  # the surge fades a little in 30 s
    assert [held[r].need for r in (0.0, 1.0, 1.5)] == [2, 4, 5]


def test_budget_trims_growth_only_largest_first() -> None:
    state = _steady(2, 3.0)
    grow = decide_pool(POLICY, state, _obs(630, 12.0, 2))  # 2 -> 6
    keep = decide_pool(POLICY, _steady(3, 4.0), _obs(630, 4.0, 3))  # 3, steady
    gpus = {"decode": 16, "prefill": 16}
    out = within_budget({"decode": grow, "prefill": keep}, 16 * 6, gpus)
    assert out["prefill"].instances == 3
    assert out["decode"].instances == 3 and out["decode"].state.instances == 3
    assert "budget" in out["decode"].message
    none = within_budget({"decode": grow, "prefill": keep}, 16 * 2, gpus)
    assert none["decode"].instances == 2 and none["decode"].reason == "budget"
    assert none["prefill"].instances == 3  # a budget never forces a scale-in
    assert within_budget({"decode": grow}, None, gpus)["decode"].instances == grow.instances


@pytest.mark.parametrize("rate", [float("nan"), float("inf"), -1.0])
def test_a_nonsense_rate_does_not_move_the_fit(rate: float) -> None:
    state = _steady(2, 3.0)
    d = decide_pool(POLICY, state, PoolObservation(630, 2, rate, {"itl": 0.05}, 0.3, 0))
    assert d.state.fits == state.fits or d.state.fits["itl"].samples == state.fits["itl"].samples


def test_a_pod_reporting_absurd_but_finite_numbers_cannot_break_the_decision() -> None:
    idle_prior = PoolState(instances=2, fits={"itl": Fit(base_s=0.02, mu=0.01)})
    for rate, queued, itl in ((1e12, 1e12, 1e-4), (1e12, 0.0, 1e4), (1e-9, 1e12, 0.05)):
        d = decide_pool(POLICY, idle_prior, PoolObservation(0.0, 2, rate, {"itl": itl}, 1.0, queued))
        assert 1 <= d.instances <= POLICY.max_instances
        d = decide_pool(POLICY, d.state, PoolObservation(30.0, 2, rate, {"itl": itl}, 1.0, queued))
        assert 1 <= d.instances <= POLICY.max_instances


def test_a_surge_is_never_remembered_past_what_the_largest_pool_serves() -> None:
    """A glitch (or a forged counter) of millions of requests/s for a few intervals is a surge no
    pool can serve: remembered as that, it would hold maxReplicas for days while it fades."""
    state = _steady(2, 2.0)
    spike = _run(state, [(630 + 30 * i, 2e6, 2) for i in range(3)])
    capacity = POLICY.max_instances * FIT.rate_at(0.06) * POLICY.headroom
    assert spike.state.surge <= capacity + 1e-9
    # one burst-memory half-life later the remembered surge no longer needs the whole pool
    later = _run(spike.state, [(630 + POLICY.surge_half_life_s + 30 * i, 2.0, 2) for i in range(3)])
    assert later.need < POLICY.max_instances


def test_a_surge_is_kept_while_the_slo_looks_unreachable() -> None:
    """Capacity 0 (the fit says no rate meets the SLO, e.g. a slow spell) caps nothing: the memory
    of a burst must survive it."""
    state = dataclasses.replace(_steady(2, 2.0), fits={"itl": Fit(base_s=0.1, mu=4.0)}, surge=5.0)
    blind = PoolObservation(at=630, serving=2, rate=2.0, latency={"itl": None}, token_usage=0.3, queued=0)
    d = decide_pool(POLICY, state, blind)
    assert d.state.surge == pytest.approx(5.0, rel=1e-2)


def test_the_curve_waits_while_instances_run_at_two_widths() -> None:
    """An interval from a pool mid-way through a width change moves the rates, not the fit."""
    state = _steady(3, 4.0)
    obs = dataclasses.replace(_obs(630, 5.4, 3, itl=0.5), one_width=False)
    d = decide_pool(POLICY, state, obs)
    assert d.state.fits == state.fits
    assert d.state.rates[-1] == (630, 5.4)
    assert "spec's number of ranks" in d.message
    learned = decide_pool(POLICY, state, dataclasses.replace(obs, one_width=True))
    assert learned.state.fits != state.fits  # the same interval at one width does teach
