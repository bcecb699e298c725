"""Acting gang-safely: whole instances, listed only when ready, drained before they go."""

from __future__ import annotations

from collections.abc import Collection

from moe_operator.autoscale.scale import MIN_DRAIN_S, Scale, Step, advance, initial, width_failed

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
    assert "still had requests after" in gone.message


def test_a_timed_out_drain_says_what_held_it() -> None:
    """The event tells an operator whether the timeout cut requests or only waited on the router."""
    s = advance(Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, BOOT, DRAIN).scale
    router = advance(s, 2, 2, {0, 1, 2}, {2}, DRAIN, BOOT, DRAIN, router_settled=False)
    assert router.event == "DrainTimedOut"
    assert "no requests left" in router.message and "router had not finished" in router.message
    both = advance(s, 2, 2, {0, 1, 2}, set(), DRAIN, BOOT, DRAIN, router_settled=False)
    assert "still had requests, and the router had not finished" in both.message
    # a drainTimeout under the 30 s minimum: idle with the router settled is a finished drain
    short = advance(Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, BOOT, 10).scale
    done = advance(short, 2, 2, {0, 1, 2}, {2}, 10, BOOT, 10)
    assert (done.scale.instances, done.event) == (2, "ScaledIn")


def test_load_back_during_a_drain_relists_the_warm_instance() -> None:
    s = advance(Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, BOOT, DRAIN).scale
    back = advance(s, 3, 3, {0, 1, 2}, set(), 60, BOOT, DRAIN)
    assert (back.scale.instances, back.scale.serving, back.event) == (3, 3, "DrainCancelled")
    assert not back.scale.draining


def test_steady_does_nothing() -> None:
    step = advance(Scale(2, 2), 2, 2, {0, 1}, {0}, 0, BOOT, DRAIN)
    assert step.scale == Scale(2, 2) and step.event == ""


def _tick(s: Scale, now: float, *, narrow: Collection[int], ready: Collection[int], idle: Collection[int] = (),
          up: Collection[int] | None = None, room: bool = False, want: int | None = None,
          settled: bool = True) -> Step:  # fmt: skip
    n = s.instances if want is None else want
    return advance(s, n, n, ready, idle, now, BOOT, DRAIN, settled, narrow, room, up)


def test_a_width_change_with_room_makes_the_wide_instance_before_any_narrow_one_drains() -> None:
    """Two narrow instances serving; maxReplicas leaves room for one more: it is created at the new
    width and listed once ready; only then does a narrow one leave the list, finish its requests
    after the router dropped it, and roll; it serves again once ready at the new width; then the next."""
    narrow_up = {0, 1}  # up at the old width (``ready`` counts only the new width's ranks)
    s = _tick(Scale(2, 2), 0, narrow={0, 1}, ready=set(), up=narrow_up, room=True)
    assert (s.scale.instances, s.scale.serving, s.event) == (3, 2, "ScalingOut")
    assert "at the new width before" in s.message
    # while it boots nothing drains, and the decision's lower size cannot drop it
    booting = _tick(s.scale, 30, narrow={0, 1}, ready=set(), up=narrow_up, room=True, want=2)
    assert (booting.scale.instances, booting.scale.serving, booting.scale.rolling) == (3, 2, None)
    listed = _tick(booting.scale, 60, narrow={0, 1}, ready={2}, up={0, 1, 2}, room=True)
    assert (listed.scale.serving, listed.event) == (3, "ScaledOut")
    # the wide one serves: no second surge, the first narrow one leaves the list
    off = _tick(listed.scale, 90, narrow={0, 1}, ready={2}, up={0, 1, 2}, room=True)
    assert (off.scale.instances, off.scale.rolling, off.scale.released, off.event) == (
        3,
        0,
        False,
        "WidthDraining",
    )
    # not before the minimum drain, not while it runs requests, not before the router dropped it
    assert not _tick(off.scale, 90 + MIN_DRAIN_S - 1, narrow={0, 1}, ready={2}, idle={0}).scale.released
    assert not _tick(off.scale, 200, narrow={0, 1}, ready={2}, idle=set()).scale.released
    assert not _tick(off.scale, 200, narrow={0, 1}, ready={2}, idle={0}, settled=False).scale.released
    drained = _tick(off.scale, 200, narrow={0, 1}, ready={2}, idle={0})
    assert (drained.scale.rolling, drained.scale.released, drained.event) == (0, True, "WidthDrained")
    assert "finished its requests" in drained.message
    # the reconciler rolls it: gone, then booting at the new width: it stays off the list
    rolling = _tick(drained.scale, 230, narrow={1}, ready={2})
    assert (rolling.scale.rolling, rolling.reason) == (0, "width_rolling")
    back = _tick(rolling.scale, 400, narrow={1}, ready={0, 2}, up={0, 1, 2})
    assert (back.scale.rolling, back.event) == (None, "WidthRolled")
    nxt = _tick(back.scale, 430, narrow={1}, ready={0, 2}, up={0, 1, 2}, room=True)
    assert (nxt.scale.instances, nxt.scale.rolling, nxt.event) == (3, 1, "WidthDraining")  # no second surge


def test_a_width_change_without_room_drains_each_narrow_instance_first() -> None:
    s = _tick(Scale(2, 2), 0, narrow={0, 1}, ready=set(), up={0, 1}, room=False)
    assert (s.scale.instances, s.scale.rolling, s.event) == (2, 0, "WidthDraining")
    timed_out = _tick(s.scale, DRAIN, narrow={0, 1}, ready=set(), idle=set())
    assert (timed_out.scale.released, timed_out.event) == (True, "WidthDrained")
    assert "instance 0 still had requests after the" in timed_out.message
    router = _tick(s.scale, DRAIN, narrow={0, 1}, ready=set(), idle={0}, settled=False)
    assert "instance 0 had no requests left, but the router had not finished" in router.message


def test_a_width_change_waits_while_a_listed_instance_is_down_and_load_growth_goes_first() -> None:
    waiting = _tick(Scale(2, 2), 0, narrow={0, 1}, ready=set(), up={1})
    assert (waiting.scale, waiting.reason) == (Scale(2, 2, waiting_since=0.0), "width_waiting")
    grow = _tick(Scale(2, 2), 0, narrow={0, 1}, ready=set(), up={0, 1}, want=4)
    assert (grow.scale.instances, grow.scale.rolling) == (4, None)
    during = _tick(Scale(2, 2, rolling=0, rolling_since=0.0), 10, narrow={0, 1}, ready=set(), want=3)
    assert (during.scale.instances, during.scale.rolling) == (3, 0)  # the roll's state is kept


def test_the_only_listed_instance_rolls_at_once_and_says_requests_are_lost() -> None:
    s = _tick(Scale(1, 1), 0, narrow={0}, ready=set(), up={0}, room=False)
    assert (s.scale.rolling, s.scale.released) == (0, True)
    assert "lost" in s.message


def test_a_width_reverted_during_its_drain_lists_the_instance_again() -> None:
    off = Scale(2, 2, rolling=1, rolling_since=0.0)
    back = _tick(off, 10, narrow=set(), ready={0, 1})
    assert (back.scale.rolling, back.event) == (None, "WidthRolled")


def test_a_released_instance_that_does_not_come_up_at_the_new_width_is_reported_and_nothing_more_rolls() -> (
    None
):
    """Released at t=0 (the reconciler may roll it); not ready at the new width twice the boot time
    later: a width_stuck step with its event, the roll kept (the others keep serving, no second
    instance drains), the clock restarted so the report repeats only every twice the boot time."""
    released = Scale(3, 3, rolling=0, released=True, rolling_since=0.0)
    waiting = _tick(released, 2 * BOOT, narrow={0, 1}, ready={2}, up={1, 2})
    assert (waiting.scale, waiting.reason, waiting.event) == (released, "width_rolling", "")
    stuck = _tick(released, 2 * BOOT + 1, narrow={0, 1}, ready={2}, up={1, 2})
    assert (stuck.reason, stuck.event) == ("width_stuck", "WidthRollStuck")
    assert (stuck.scale.rolling, stuck.scale.released, stuck.scale.rolling_since) == (0, True, 2 * BOOT + 1)
    assert "not ready 601s after it was released" in stuck.message
    assert width_failed(stuck)
    quiet = _tick(stuck.scale, 3 * BOOT, narrow={0, 1}, ready={2}, up={1, 2})
    assert (quiet.reason, quiet.event) == ("width_rolling", "")
    # it comes up after all (at the new width, or back at the old one once the width is given up)
    back = _tick(stuck.scale, 3 * BOOT, narrow={1}, ready={0, 2}, up={0, 1, 2})
    assert (back.scale.rolling, back.event) == (None, "WidthRolled")


def test_a_width_change_whose_new_instance_was_rolled_back_goes_on_without_room() -> None:
    """The instance created at the new width did not come up (ScaleOutRolledBack; maybe no nodes to
    spare): while growth is paused the change drains an instance at the old width first instead,
    and a released one that does not come up either stops it (the test above)."""
    s = _tick(Scale(2, 2), 0, narrow={0, 1}, ready=set(), up={0, 1}, room=True)
    rolled = _tick(s.scale, 2 * BOOT + 1, narrow={0, 1}, ready=set(), up={0, 1}, room=True)
    assert (rolled.scale.instances, rolled.event) == (2, "ScaleOutRolledBack")
    assert not width_failed(rolled)  # the cluster may only lack a node to spare
    drain = _tick(rolled.scale, 2 * BOOT + 30, narrow={0, 1}, ready=set(), up={0, 1}, room=True)
    assert (drain.scale.instances, drain.scale.rolling, drain.event) == (2, 0, "WidthDraining")


def test_a_width_change_drains_first_the_instances_it_can_roll() -> None:
    """The reconciler says instance 0's group at the new width would land on nodes instance 1 still
    runs (widthBlocked): instance 1 drains and rolls first, which frees them; with every instance
    blocked the first goes (and is reported if it does not come up)."""
    s = Scale(2, 2)
    first = advance(s, 2, 2, set(), set(), 0, BOOT, DRAIN, True, {0, 1}, False, {0, 1}, {0})
    assert (first.scale.rolling, first.event) == (1, "WidthDraining")
    both = advance(s, 2, 2, set(), set(), 0, BOOT, DRAIN, True, {0, 1}, False, {0, 1}, {0, 1})
    assert both.scale.rolling == 0
    stale = advance(s, 2, 2, set(), set(), 0, BOOT, DRAIN, True, {0, 1}, False, {0, 1}, {7})
    assert stale.scale.rolling == 0


def test_a_listed_instance_down_twice_the_boot_time_during_a_width_change_is_reported() -> None:
    """The change waits for a listed instance that is down (it drains no other); twice the boot time
    into the wait a Warning says which and for how long, again every twice the boot time with the
    whole wait; once it is up the wait's times go and the next instance drains. Any other step ends
    the wait (a width change reverted; load growth), and a scale-out's clock never becomes the wait's."""
    waiting = _tick(Scale(3, 3), 0, narrow={0, 1, 2}, ready=set(), up={0, 2})
    still = _tick(waiting.scale, 2 * BOOT, narrow={0, 1, 2}, ready=set(), up={0, 2})
    assert (still.scale.waiting_since, still.reason, still.event) == (0.0, "width_waiting", "")
    late = _tick(still.scale, 2 * BOOT + 1, narrow={0, 1, 2}, ready=set(), up={0, 2})
    assert (late.reason, late.event, late.scale.rolling) == ("width_waiting", "WidthRollWaiting", None)
    assert "[1] not up" in late.message and "for 601s" in late.message
    assert (late.scale.waiting_since, late.scale.waiting_reported, late.scale.pending_since) == (
        0.0,
        601.0,
        None,
    )
    quiet = _tick(late.scale, 3 * BOOT, narrow={0, 1, 2}, ready=set(), up={0, 2})
    assert (quiet.reason, quiet.event) == ("width_waiting", "")
    again = _tick(quiet.scale, 4 * BOOT + 2, narrow={0, 1, 2}, ready=set(), up={0, 2})
    assert again.event == "WidthRollWaiting" and "for 1202s" in again.message  # the whole wait
    up = _tick(again.scale, 4 * BOOT + 30, narrow={0, 1, 2}, ready=set(), up={0, 1, 2})
    assert (up.event, up.scale.rolling, up.scale.waiting_since, up.scale.waiting_reported) == (
        "WidthDraining",
        0,
        None,
        None,
    )
    reverted = _tick(late.scale, 3 * BOOT, narrow=set(), ready={0, 2}, up={0, 2})
    assert (reverted.scale.waiting_since, reverted.scale.waiting_reported) == (None, None)
    grows = _tick(late.scale, 3 * BOOT, narrow={0, 1, 2}, ready=set(), up={0, 2}, want=4)
    assert (grows.reason, grows.scale.waiting_since) == ("scale_out", None)
    # a scale-out the load no longer needs leaves no clock behind (before, a later wait or a raised
    # minReplicas read it as its own start)
    booting = Scale(3, 2, pending_since=0.0)
    fell = advance(booting, 2, 2, {0, 1}, set(), 30, BOOT, DRAIN)
    assert (fell.scale.instances, fell.scale.pending_since) == (2, None)
    fresh = _tick(fell.scale, 2 * BOOT + 30, narrow={0, 1}, ready=set(), up={0})
    assert (fresh.event, fresh.scale.waiting_since) == ("", 2 * BOOT + 30)


def test_a_spec_roll_drains_each_outdated_instance_first_and_names_itself() -> None:
    """Instances on an older pod template at the spec's width (``outdated``): the same drained roll
    as a width change, in its own words (SpecDraining, SpecDrained, SpecRolled; spec_* reasons), at
    one instance fewer; a width change goes first when both are due, and a stuck spec roll is no
    width to give up."""

    def tick(s: Scale, now: float, outdated: Collection[int], **kw: object) -> Step:
        n = s.instances
        return advance(s, n, n, kw.get("ready", set()), kw.get("idle", set()), now, BOOT, DRAIN, True,
                       kw.get("narrow", ()), bool(kw.get("room", False)), kw.get("up", {0, 1, 2}), (),
                       outdated)  # type: ignore[arg-type]  # fmt: skip

    off = tick(Scale(2, 2), 0, {0, 1})
    assert (off.event, off.reason, off.scale.rolling, off.scale.rolling_spec) == (
        "SpecDraining",
        "spec_draining",
        0,
        True,
    )
    assert "rolls to the new spec" in off.message
    drained = tick(off.scale, 60, {0, 1}, idle={0})
    assert (drained.event, drained.scale.released) == ("SpecDrained", True)
    rolling = tick(drained.scale, 90, {1}, ready={1})
    assert rolling.reason == "spec_rolling"
    back = tick(rolling.scale, 120, {1}, ready={0, 1})
    assert (back.event, back.scale.rolling, back.scale.rolling_spec) == ("SpecRolled", None, False)
    stuck = tick(drained.scale, 60 + 2 * BOOT + 1, {1}, ready={1})
    assert (stuck.event, stuck.reason) == ("SpecRollStuck", "spec_stuck") and not width_failed(stuck)
    # none is created for it, even with room, and a scale-in the load allows goes between two of its
    # instances (a static-mode pool that publishes often must still shrink)
    no_surge = tick(Scale(2, 2), 0, {0, 1}, room=True)
    assert (no_surge.event, no_surge.scale.instances) == ("SpecDraining", 2)
    shrink = advance(
        Scale(3, 3), 2, 2, {0, 1, 2}, set(), 0, BOOT, DRAIN, True, (), True, {0, 1, 2}, (), {0, 1, 2}
    )
    assert (shrink.event, shrink.scale.serving) == ("Draining", 2)
    # a width roll ends at its new width even if the pod template changed meanwhile (that is a spec
    # roll of its own, later): before, it waited for the second restart and gave the width up
    wide = Scale(2, 2, rolling=0, released=True, rolling_since=0.0)
    rolled = tick(wide, 300, {0}, narrow={1}, ready={0})
    assert (rolled.event, rolled.scale.rolling) == ("WidthRolled", None)
    both = tick(Scale(2, 2), 0, {1}, narrow={0})
    assert (both.event, both.scale.rolling, both.scale.rolling_spec) == ("WidthDraining", 0, False)
    waits = tick(Scale(2, 2), 0, {0, 1}, up={1})
    assert (waits.reason, waits.scale.waiting_since) == ("spec_waiting", 0.0)
