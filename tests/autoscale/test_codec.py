"""Status written by the operator is read back as untrusted: anything odd falls back, never fails."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from moe_operator.autoscale import codec
from moe_operator.autoscale.decide import PoolDecision, PoolState
from moe_operator.autoscale.model import Fit, update
from moe_operator.autoscale.scale import Scale, Step

NOW = 1_800_000_000.0


def _state() -> PoolState:
    fit = update(Fit(0.03, 4.0), 1.0, 0.04)
    return PoolState(
        instances=3,
        fits={"itl": fit},
        rates=((NOW - 60, 2.0), (NOW - 30, 2.5)),
        last_out=NOW - 30,
        surge=1.5,
        gpus=16,
    )


def test_model_round_trips() -> None:
    state = _state()
    back = codec.read_model(codec.write_model(state), ("itl",), NOW)
    assert back is not None
    assert back.fits["itl"].curve() == pytest.approx(state.fits["itl"].curve())
    assert back.rates == state.rates and back.surge == state.surge and back.last_out == state.last_out
    assert back.gpus == state.gpus == 16


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(fits={"itl": [0.03, 4.0, 1, 0, 0, 0, 0]}),  # short
        lambda d: d.update(fits={"itl": [float("nan")] * 8}),
        lambda d: d.update(fits={"itl": [-1, 4.0, 1, 0, 0, 0, 0, 0]}),
        lambda d: d.update(fits={"ttft": d["fits"]["itl"]}),  # the targets changed
        lambda d: d.update(rates=[[NOW, 1.0]] * 10_000),
        lambda d: d.update(rates=[[NOW, 1.0], [NOW - 100, 1.0]]),  # out of order
        lambda d: d.update(rates=[[NOW + 10_000, 1.0]]),  # from the future
        lambda d: d.update(surge="lots"),
        lambda d: d.update(lastOut=True),
        lambda d: d.update(gpus=-8),
        lambda d: d.update(gpus=10**6),
        lambda d: d.update(gpus="16"),
        # integers too large for a float (hundreds of digits fit the field): no OverflowError
        lambda d: d.update(queued=10**400),
        lambda d: d.update(surge=10**400),
        lambda d: d.update(lastOut=10**400),
        lambda d: d["rates"][0].__setitem__(1, 10**400),
        lambda d: d["fits"]["itl"].__setitem__(3, 10**400),
    ],
)
def test_a_tampered_model_starts_over(mutate) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(codec.write_model(_state()))
    mutate(doc)
    assert codec.read_model(json.dumps(doc), ("itl",), NOW) is None


@pytest.mark.parametrize("text", ["", "[]", "{", "1e999", "x" * 20_000, '{"fits": 3}'])
def test_garbage_is_no_model(text: str) -> None:
    assert codec.read_model(text, ("itl",), NOW) is None


def test_scale_falls_back_on_nonsense_and_keeps_the_bounds() -> None:
    fallback = Scale(2, 2)

    def read(raw: dict) -> Scale:  # type: ignore[type-arg]
        return codec.read_scale(raw, fallback, 1, 4, NOW, 600)

    assert read({}) == fallback
    assert read({"instances": 3, "serving": 5}) == fallback
    assert read({"instances": "3", "serving": 3}) == fallback
    assert read({"instances": 0, "serving": 0}) == fallback
    assert read({"instances": 2.0, "serving": 2}) == fallback  # counts are integers
    assert read({"instances": True, "serving": 1}) == fallback
    assert read({"instances": 9, "serving": 3}).instances == 4
    assert codec.read_scale({"instances": 1, "serving": 1}, fallback, 2, 4, NOW, 600).instances == 2
    drain = read({"instances": 3, "serving": 2, "reason": "draining", "pendingSince": "2027-01-15T08:00:00Z"})
    assert drain.draining and drain.pending_since is not None


def test_times_from_the_future_are_not_the_operators() -> None:
    far = "9999-12-31T23:59:59Z"
    fallback = Scale(2, 2)
    held = codec.read_scale(
        {"instances": 3, "serving": 2, "reason": "draining", "pendingSince": far, "blockedUntil": far},
        fallback, 1, 4, NOW, 600,
    )  # fmt: skip
    assert held.pending_since is None and held.blocked_until is None and not held.draining
    soon = codec._iso(NOW + 300)
    assert codec.read_scale(
        {"instances": 2, "serving": 2, "blockedUntil": soon}, fallback, 1, 4, NOW, 600
    ).blocked_until
    # widthRetryAfter: a pause no longer than the operator writes, and only while it lasts
    assert codec.read_retry({"widthRetryAfter": soon}, NOW, 600) == NOW + 300
    assert codec.read_retry({"widthRetryAfter": far}, NOW, 600) is None
    assert codec.read_retry({"widthRetryAfter": codec.write_time(NOW - 1)}, NOW, 600) is None
    assert codec.read_retry({"widthRetryAfter": 12}, NOW, 600) is None
    assert codec.read_retry({}, NOW, 600) is None
    # widthFailures: a count in range, anything else none
    assert codec.read_failures({"widthFailures": 3}) == 3
    for bad in (-1, 65, True, 2.0, "3", None, [1]):
        assert codec.read_failures({"widthFailures": bad}) == 0, bad


def test_non_finite_numbers_never_reach_status() -> None:
    from moe_operator.autoscale.decide import PoolObservation

    obs = PoolObservation(NOW, 1, float("inf"), {"itl": float("nan"), "ttft": -1.0}, float("inf"), 0)
    d = PoolDecision(
        2, 2, "steady", "m", 2, _state(), numbers={"offeredRate": float("inf"), "itlRatePerInstance": 2.0}
    )
    out = codec.write_pool(Scale(2, 2), Step(Scale(2, 2), ""), d, obs)
    assert out["offeredRate"] is None and out["tokenUsage"] is None and out["latency"] == {}  # None: removed
    assert out["ratePerInstance"] == 2.0
    json.dumps(out, allow_nan=False)


def test_pool_status_is_what_the_crd_allows() -> None:
    from moe_operator.api.status import PoolAutoscalingStatus

    d = PoolDecision(2, 3, "scale_out", "m" * 5000, 3, _state(), numbers={"itlRatePerInstance": 2.0})
    out = codec.write_pool(Scale(3, 2, NOW, NOW), Step(Scale(3, 2), "scale_out"), d, None)
    PoolAutoscalingStatus.model_validate(out)  # refused by the schema if a field is wrong
    assert len(out["message"]) <= 2048


def test_the_model_fits_the_status_field_however_many_rates() -> None:
    many = tuple((NOW - 3000 + i + 0.1, 999999999999.1234) for i in range(2000))
    wide = Fit(123.456789012345, 987654.321098765, (999999.123456789, 1.23456789012345e14, 9.87654321098765e14,
               1.23456789012345e14, 9.87654321098765e14), 123456789)  # fmt: skip
    text = codec.write_model(PoolState(instances=1, fits={"itl": wide, "ttft": wide}, rates=many))
    assert len(text) <= codec.MAX_MODEL_CHARS
    back = codec.read_model(text, ("itl", "ttft"), NOW)
    assert back is not None and back.rates and back.rates[-1] == many[-1]


def test_a_width_roll_round_trips_and_a_tampered_one_is_dropped() -> None:
    from moe_operator.api.status import PoolAutoscalingStatus

    fallback = Scale(2, 2)
    rolling = Scale(3, 3, last_change=NOW, rolling=1, released=True, rolling_since=NOW - 30)
    d = PoolDecision(3, 3, "steady", "m", 3, _state())
    out = codec.write_pool(rolling, Step(rolling, "width_rolling"), d, None)
    PoolAutoscalingStatus.model_validate(out)
    assert codec.read_scale(out, fallback, 1, 4, NOW, 600) == rolling
    done = codec.write_pool(Scale(3, 3), Step(Scale(3, 3), "width_rolled"), d, None)
    assert done["rollingInstance"] is None and done["rollingReleased"] is None  # removed by the merge patch

    def read(**change: object) -> Scale:
        return codec.read_scale({**out, **change}, fallback, 1, 4, NOW, 600)

    assert read(rollingInstance=3).rolling is None  # not a listed instance
    assert read(rollingInstance=-1).rolling is None
    assert read(rollingInstance=True).rolling is None
    assert read(rollingInstance=1.0).rolling is None
    assert read(rollingSince=None).rolling is None  # no time: nothing to time a drain by
    assert read(rollingSince="9999-12-31T23:59:59Z").rolling is None
    assert read(rollingReleased="yes").released is False  # only the operator's own true releases
    spec_roll = replace(rolling, rolling_spec=True)
    spec_out = codec.write_pool(spec_roll, Step(spec_roll, "spec_rolling"), d, None)
    assert (
        spec_out["rollingSpec"] is True and codec.read_scale(spec_out, fallback, 1, 4, NOW, 600) == spec_roll
    )
    assert out["rollingSpec"] is None and done["rollingSpec"] is None  # removed when it is no spec roll
    assert read(rollingSpec="yes").rolling_spec is False and read(rollingSpec=1).rolling_spec is False
    assert (
        codec.read_scale({**spec_out, "rollingInstance": None}, fallback, 1, 4, NOW, 600).rolling_spec
        is False
    )
    assert not read(rollingInstance=None).released
    draining = read(reason="draining", instances=3, serving=2, pendingSince=codec._iso(NOW))
    assert draining.draining and draining.rolling is None  # never both at once


def test_a_width_wait_round_trips_and_a_tampered_one_is_dropped() -> None:
    from moe_operator.api.status import PoolAutoscalingStatus

    fallback = Scale(2, 2)
    waiting = Scale(3, 3, waiting_since=NOW - 900, waiting_reported=NOW - 300)
    d = PoolDecision(3, 3, "steady", "m", 3, _state())
    out = codec.write_pool(waiting, Step(waiting, "width_waiting"), d, None)
    PoolAutoscalingStatus.model_validate(out)
    assert codec.read_scale(out, fallback, 1, 4, NOW, 600) == waiting
    over = codec.write_pool(Scale(3, 3), Step(Scale(3, 3), "width_rolled"), d, None)
    assert over["widthWaitingSince"] is None and over["widthWaitingReported"] is None  # merge patch removes

    def read(**change: object) -> Scale:
        return codec.read_scale({**out, **change}, fallback, 1, 4, NOW, 600)

    future = read(widthWaitingSince="9999-12-31T23:59:59Z")
    assert (future.waiting_since, future.waiting_reported) == (None, None)
    assert read(widthWaitingReported=codec._iso(NOW - 1000)).waiting_reported is None  # before the wait began
    assert read(widthWaitingReported="9999-12-31T23:59:59Z").waiting_reported is None
    assert read(widthWaitingSince=12).waiting_since is None


def test_width_blocked_is_read_as_instance_indexes_only() -> None:
    def pools(value: object) -> dict[str, object]:
        return {"pools": {"decode": {"widthBlocked": value}}}

    assert codec.read_indexes(pools([0, 3]), "decode", "widthBlocked") == {0, 3}
    assert codec.read_indexes(pools([True, -1, 256, "1", 2.0, 5]), "decode", "widthBlocked") == {5}
    assert codec.read_indexes(pools("0,1"), "decode", "widthBlocked") == frozenset()
    assert codec.read_indexes(pools([1]), "prefill", "widthBlocked") == frozenset()
    assert codec.read_indexes({"pools": []}, "decode", "widthBlocked") == frozenset()
    assert codec.read_indexes({}, "decode", "widthBlocked") == frozenset()
