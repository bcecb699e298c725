"""Acting gang-safely: whole instances, listed only when ready, drained before they go."""

from __future__ import annotations

from moe_operator.autoscale.scale import MIN_DRAIN_S, Scale, advance, initial

BOOT, DRAIN = 300.0, 600.0


def test_start_inside_the_bounds() -> None:
    assert initial(0, 1, 4) == Scale(1, 1)
    assert initial(9, 1, 4) == Scale(4, 4)


def test_scale_out_lists_new_instances_only_when_all_are_ready() -> None:
    s = Scale(2, 2)
    step = advance(s, 4, 4, ready={0, 1}, idle=set(), now=0, boot_s=BOOT, drain_timeout_s=DRAIN)
    assert (step.scale.instances, step.scale.serving, step.event) == (4, 2, "ScalingOut")
    half = advance(step.scale, 4, 4, ready={0, 1, 2}, idle=set(), now=60, boot_s=BOOT, drain_timeout_s=DRAIN)
    assert (half.scale.serving, half.reason) == (2, "booting")
    done = advance(
        half.scale, 4, 4, ready={0, 1, 2, 3}, idle=set(), now=120, boot_s=BOOT, drain_timeout_s=DRAIN
    )
    assert (done.scale.instances, done.scale.serving, done.event) == (4, 4, "ScaledOut")


def test_a_scale_out_that_does_not_come_up_is_rolled_back_and_growth_pauses() -> None:
    s = advance(Scale(2, 2), 3, 3, {0, 1}, set(), 0, BOOT, DRAIN).scale
    stuck = advance(s, 3, 3, {0, 1}, set(), 2 * BOOT + 1, BOOT, DRAIN)
    assert (stuck.scale.instances, stuck.scale.serving, stuck.event) == (2, 2, "ScaleOutRolledBack")
    assert "[2]" in stuck.message
    again = advance(stuck.scale, 3, 3, {0, 1}, set(), 2 * BOOT + 30, BOOT, DRAIN)
    assert again.scale.instances == 2  # blocked for a boot time
    later = advance(stuck.scale, 3, 3, {0, 1}, set(), 3 * BOOT + 2, BOOT, DRAIN)
    assert later.scale.instances == 3


def test_load_that_falls_while_booting_drops_the_unready_not_the_serving() -> None:
    s = advance(Scale(2, 2), 4, 4, {0, 1}, set(), 0, BOOT, DRAIN).scale
    step = advance(s, 1, 1, {0, 1}, set(), 30, BOOT, DRAIN)
    assert (step.scale.instances, step.scale.serving) == (2, 2)


def test_scale_in_drains_the_last_instance_first() -> None:
    s = Scale(3, 3)
    step = advance(s, 2, 2, {0, 1, 2}, set(), 0, BOOT, DRAIN)
    assert (step.scale.instances, step.scale.serving, step.event) == (3, 2, "Draining")
    busy = advance(step.scale, 2, 2, {0, 1, 2}, set(), MIN_DRAIN_S + 1, BOOT, DRAIN)
    assert busy.scale.instances == 3 and busy.reason == "draining"  # instance 2 still has requests
    early = advance(step.scale, 2, 2, {0, 1, 2}, {2}, MIN_DRAIN_S - 1, BOOT, DRAIN)
    assert early.scale.instances == 3  # the router's rollout may still be sending
    gone = advance(step.scale, 2, 2, {0, 1, 2}, {2}, MIN_DRAIN_S + 1, BOOT, DRAIN)
    assert (gone.scale.instances, gone.scale.serving, gone.event) == (2, 2, "ScaledIn")


def test_a_drain_that_never_ends_times_out() -> None:
    s = advance(Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, BOOT, DRAIN).scale
    gone = advance(s, 2, 2, {0, 1, 2}, set(), DRAIN, BOOT, DRAIN)
    assert (gone.scale.instances, gone.event) == (2, "DrainTimedOut")


def test_load_back_during_a_drain_relists_the_warm_instance() -> None:
    s = advance(Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, BOOT, DRAIN).scale
    back = advance(s, 3, 3, {0, 1, 2}, set(), 60, BOOT, DRAIN)
    assert (back.scale.instances, back.scale.serving, back.event) == (3, 3, "DrainCancelled")
    assert not back.scale.draining


def test_steady_does_nothing() -> None:
    step = advance(Scale(2, 2), 2, 2, {0, 1}, {0}, 0, BOOT, DRAIN)
    assert step.scale == Scale(2, 2) and step.event == ""
