"""Acting on a decision gang-safely: whole instances, drained before they go, rolled back when stuck.

A pool's size is two numbers: ``instances`` (groups that exist) and ``serving`` (the first
that many are on the router's worker list). A scale-out creates groups first and puts them on
the list only when every new one is ready; one that is not ready after twice the boot time is
removed again (it could not be placed, or does not start) and growth pauses for a boot time.
A scale-in takes the last instance off the list first, waits until it has finished what it
runs (no running or queued request) or the drain timeout passes, and only then removes its
group. Load that returns during a drain puts the warm instance back on the list.

A width change (``nodesPerReplica`` edited) is made before it breaks: while the pool has room
(``maxReplicas``, the GPU budget) one instance at the new width is created first and listed once
ready; then each instance still at the old width in turn is taken off the list (``rolling``),
finishes its requests, and only then is released to the reconciler, which rolls it onto the new
width; it is listed again once ready. The extra instance goes like any other, when the load lets
the pool shrink. Without room the same drain comes first, at one instance fewer while each rolls.
An instance created at the new width that does not come up is rolled back like any scale-out;
the change then goes on without room (drain first: the cluster may have no nodes to spare). A
released instance not ready twice the boot time after its release stops the change where it is
(``width_stuck``): the others keep serving at the old width and no other one drains. A listed
instance that stays down holds the change too (a roll takes one instance at a time, the others
serving); twice the boot time into that wait it is reported, and again every twice the boot time.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import UTC, datetime

# Step reasons of a change that did not come up: a scale-out rolled back, an instance released to
# roll not ready (status words; MoEAutoscalerChangeFailing alerts on them)
FAILED = ("rolled_back", "width_stuck", "spec_stuck")
MIN_DRAIN_S = 30.0  # and the router settled: old router pods may still send until they are replaced
WIDTH_RETRY_BOOTS = 6  # a chosen width that did not come up is not chosen again for this many bootTimes,
WIDTH_RETRY_MAX_BOOTS = 96  # doubled for each one in a row that did not, up to this many


@dataclass(frozen=True)
class Roll:
    """What a roll changes, in status words, event reasons and messages: a width change, or any other
    change of the instances' pod template (an image, an argument, an environment variable)."""

    word: str  # status reasons: <word>_draining, ...
    events: str  # event reasons: <events>Draining, ...
    new: str  # "the new width"
    at_new: str  # "at the new width"
    alone: str  # why the only instance listed rolls undrained


WIDTH = Roll(
    "width", "Width", "the new width", "at the new width",
    "no room for one at the new width first (maxReplicas or gpuBudget)",
)  # fmt: skip
SPEC = Roll("spec", "Spec", "the new spec", "on the new spec", "a spec roll creates no extra instance")


@dataclass(frozen=True)
class Scale:
    instances: int
    serving: int
    pending_since: float | None = None  # a scale-out or a drain under way since
    last_change: float | None = None
    blocked_until: float | None = None  # no growth before (after a rollback)
    draining: bool = False  # instance ``serving`` is off the router and finishing its requests
    rolling: int | None = None  # an instance off the router for its width change
    released: bool = False  # ``rolling`` finished its requests: the reconciler may roll it now
    rolling_since: float | None = None  # when ``rolling`` left the list, or was released
    rolling_spec: bool = False  # ``rolling`` rolls to a new pod template at its width (not to a new width)
    waiting_since: float | None = None  # a roll has waited for a listed instance that is down since
    waiting_reported: float | None = None  # and last said so


@dataclass(frozen=True)
class Step:
    scale: Scale
    reason: str  # a status word: scale_out, draining, drained, rolled_back, ...; empty: nothing happened
    event: str = ""  # an event reason when something a user should see happened
    message: str = ""


def initial(replicas: int, lo: int, hi: int) -> Scale:
    """Where a pool starts when the autoscaler first sees it: its spec size inside the bounds."""
    n = min(max(replicas, lo), hi)
    return Scale(instances=n, serving=n)


def advance(
    s: Scale,
    want: int,
    need: int | None,
    ready: Collection[int],
    idle: Collection[int],
    now: float,
    boot_s: float,
    drain_timeout_s: float,
    router_settled: bool = True,
    old_width: Collection[int] = (),
    room: bool = False,
    up: Collection[int] | None = None,
    blocked: Collection[int] = (),
    outdated: Collection[int] = (),
) -> Step:
    """One tick: ``want`` is the decision's size and ``need`` what the load needs (a drain is
    cancelled only when the load needs the instance back; None: no data, nothing is cancelled);
    ``ready`` and ``idle`` are instance indexes as observed; ``router_settled``: the router runs
    the current worker list everywhere (a drained instance may go only then, or at the timeout);
    ``old_width``: instances whose group still runs another width than the spec's; ``room``: one
    more instance fits the pool's bounds and the budget (a width change then creates one at the
    new width first); ``up``: the instances with every rank of their group's width ready (default
    ``ready``, which counts only the new width's); ``blocked``: instances a width change cannot roll
    yet (their new nodes busy, or none planned): the others at the old width drain first;
    ``outdated``: instances at the spec's width whose pods run an older template, rolled the same way
    (drained, released, listed again once ready on the new one) but at one instance fewer (none is
    created for them, and the pool may shrink between two of them), after a width change if both.
    A roll's wait for a listed instance that is down is timed only while it lasts: any other step
    ends it."""
    wait = (s.waiting_since, s.waiting_reported)
    s = replace(s, waiting_since=None, waiting_reported=None)
    if s.blocked_until is not None and now < s.blocked_until:
        want = min(want, s.instances)
    if s.draining:
        return _drain(s, need, idle, now, drain_timeout_s, router_settled)
    if s.rolling is not None or any(i < s.serving for i in old_width):
        # a roll under way keeps its instance; a width change keeps what it created until every
        # instance is wide (a spec roll does not hold the pool's size: a scale-in the load allows
        # goes between two of its instances, and none is created for it)
        want = max(want, s.instances)
    if s.instances > s.serving:
        return _grow(s, want, ready, now, boot_s)
    if s.rolling is not None and want == s.instances:  # growth for load goes first
        done_unless = frozenset(outdated) if s.rolling_spec else frozenset(old_width)
        return _roll(s, done_unless, ready, idle, now, boot_s, drain_timeout_s, router_settled)
    listed_old = sorted(i for i in old_width if i < s.serving)
    listed_outdated = sorted(i for i in outdated if i < s.serving and i not in old_width)
    if listed_old and want == s.instances:
        paused = s.blocked_until is not None and now < s.blocked_until  # one at the new width failed
        first = [i for i in listed_old if i not in blocked] + [i for i in listed_old if i in blocked]
        return _widen(s, first, ready if up is None else up, now, room and not paused, boot_s, wait)
    if listed_outdated and want == s.instances:
        return _widen(s, listed_outdated, ready if up is None else up, now, False, boot_s, wait, SPEC)
    if want > s.instances:
        grown = replace(s, instances=want, pending_since=now, last_change=now)
        return Step(
            grown,
            "scale_out",
            "ScalingOut",
            f"creating {want - s.instances} instance(s): {s.instances} -> {want}",
        )
    if want < s.instances:
        n = s.instances - 1
        drained = replace(s, serving=n, pending_since=now, last_change=now, draining=True)
        return Step(
            drained,
            "draining",
            "Draining",
            f"instance {n} off the router; it finishes its requests, then goes",
        )
    return Step(s, "")


def _drain(
    s: Scale, need: int | None, idle: Collection[int], now: float, timeout_s: float, router_settled: bool
) -> Step:
    leaving = s.serving
    waited = now - (s.pending_since if s.pending_since is not None else now)
    if need is not None and need > s.serving:  # load came back: the warm instance serves again
        back = replace(s, serving=s.instances, pending_since=None, last_change=now, draining=False)
        return Step(back, "steady", "DrainCancelled", f"instance {leaving} back on the router: load needs it")
    if waited >= min(MIN_DRAIN_S, timeout_s) and leaving in idle and router_settled:
        gone = replace(s, instances=s.serving, pending_since=None, last_change=now, draining=False)
        return Step(
            gone,
            "drained",
            "ScaledIn",
            f"instance {leaving} finished its requests after {waited:.0f}s; removed",
        )
    if waited >= timeout_s:
        gone = replace(s, instances=s.serving, pending_since=None, last_change=now, draining=False)
        held = _held(leaving in idle, router_settled)
        return Step(
            gone, "drained", "DrainTimedOut",
            f"instance {leaving} {held} after the {timeout_s:.0f}s drain timeout; removed",
        )  # fmt: skip
    return Step(s, "draining")


def _held(idle: bool, router_settled: bool) -> str:
    """What kept a drain from ending before its timeout, for the event: the instance's own requests,
    the router's roll to the list without it (a replaced router pod still exiting included), or both:
    the first says the timeout cut requests, the second that it cut none. (Idle with the router
    settled is no timeout: a drainTimeout under the 30 s minimum ends the drain as finished.)"""
    if idle:
        return "had no requests left, but the router had not finished rolling to the list without it"
    if router_settled:
        return "still had requests"
    return "still had requests, and the router had not finished rolling to the list without it"


def _grow(s: Scale, want: int, ready: Collection[int], now: float, boot_s: float) -> Step:
    new = range(s.serving, s.instances)
    if all(i in ready for i in new):
        up = replace(s, serving=s.instances, pending_since=None, last_change=now)
        return Step(up, "scaled_out", "ScaledOut", f"{s.instances} instance(s) serving")
    if s.pending_since is None:  # growth the autoscaler did not start (minReplicas raised): time it now
        return Step(replace(s, pending_since=now), "booting")
    since = s.pending_since
    if now - since > 2 * boot_s:
        stuck = [i for i in new if i not in ready]
        back = replace(
            s, instances=s.serving, pending_since=None, last_change=now, blocked_until=now + boot_s
        )
        return Step(
            back, "rolled_back", "ScaleOutRolledBack",
            f"instance(s) {stuck} not ready {now - since:.0f}s after creation (bootTime x2): removed; "
            f"no growth for {boot_s:.0f}s. See the pool's Progressing condition for why they did not start",
        )  # fmt: skip
    if want != s.instances:
        target = max(want, s.serving)  # instances still booting can go; serving ones drain first
        pending = s.pending_since if target > s.serving else None  # none left to boot: nothing pending
        return Step(
            replace(s, instances=target, pending_since=pending),
            "scale_out" if target > s.instances else "booting",
        )
    return Step(s, "booting")


def _widen(
    s: Scale, old: list[int], up: Collection[int], now: float, room: bool, boot_s: float,
    wait: tuple[float | None, float | None], kind: Roll = WIDTH,
) -> Step:  # fmt: skip
    """The next step of a roll: (for a width change) an instance at the new width first when none
    serves yet and there is room, then the first of ``old`` (in the order to drain them) off the list
    once every listed one is up. A wait for a listed one that is down (``wait``: since when, last
    reported) is reported twice the boot time after it began, and again every twice the boot time."""
    if room and len(old) == s.serving:
        grown = replace(s, instances=s.instances + 1, pending_since=now, last_change=now)
        return Step(
            grown,
            "scale_out",
            "ScalingOut",
            f"creating instance {s.instances} at the new width before any at the old width drains: "
            f"{s.instances} -> {s.instances + 1}",
        )
    down = [i for i in range(s.serving) if i not in up]
    if down:  # a roll takes one instance at a time, the others serving
        since = wait[0] if wait[0] is not None else now
        last = wait[1] if wait[1] is not None else since
        if now - last <= 2 * boot_s:
            return Step(replace(s, waiting_since=since), f"{kind.word}_waiting")
        return Step(
            replace(s, waiting_since=since, waiting_reported=now), f"{kind.word}_waiting",
            f"{kind.events}RollWaiting",
            f"listed instance(s) {down} not up, and the roll to {kind.new} waiting for them, for "
            f"{now - since:.0f}s (reported every bootTime x2): no other instance drains meanwhile. See the "
            "pool's Progressing condition for why",
        )  # fmt: skip
    i = old[0]
    spec = kind is SPEC
    if s.serving == 1:  # the router keeps its only instance (an empty list serves nothing either)
        alone = replace(s, rolling=i, released=True, rolling_since=now, last_change=now, rolling_spec=spec)
        return Step(
            alone,
            f"{kind.word}_drained",
            f"{kind.events}Drained",
            f"instance {i}, the only one listed, rolls to {kind.new} at once: {kind.alone}; its requests "
            "in flight are lost",
        )
    off = replace(s, rolling=i, released=False, rolling_since=now, last_change=now, rolling_spec=spec)
    return Step(
        off,
        f"{kind.word}_draining",
        f"{kind.events}Draining",
        f"instance {i} off the router before it rolls to {kind.new}; it finishes its requests first",
    )


def _roll(
    s: Scale, old: Collection[int], ready: Collection[int], idle: Collection[int], now: float,
    boot_s: float, timeout_s: float, router_settled: bool,
) -> Step:  # fmt: skip
    """Instance ``rolling``: drained (idle after the router dropped it, or the timeout), then released
    to the reconciler, then listed again once it is ready and no longer ``old`` (for a width change,
    at the new width: a pod template that changed meanwhile is a spec roll of its own, later). One
    released and not ready twice the boot time later is reported, again every twice the boot time
    while it lasts."""
    i, kind = s.rolling, SPEC if s.rolling_spec else WIDTH
    waited = now - (s.rolling_since if s.rolling_since is not None else now)
    if i is None or i >= s.serving or (i not in old and i in ready):
        back = replace(
            s, rolling=None, released=False, rolling_since=None, last_change=now, rolling_spec=False
        )
        return Step(
            back,
            f"{kind.word}_rolled",
            f"{kind.events}Rolled",
            f"instance {i} back on the router {kind.at_new}",
        )
    if s.released and waited > 2 * boot_s:
        return Step(
            replace(s, rolling_since=now), f"{kind.word}_stuck", f"{kind.events}RollStuck",
            f"instance {i} not ready {waited:.0f}s after it was released to roll (bootTime x2); the other "
            "instances keep serving and nothing more rolls. See the pool's Progressing condition for why it "
            "does not start",
        )  # fmt: skip
    if s.released:
        return Step(s, f"{kind.word}_rolling")
    done = waited >= min(MIN_DRAIN_S, timeout_s) and i in idle and router_settled
    if done or waited >= timeout_s:
        how = (
            f"finished its requests after {waited:.0f}s"
            if done
            else f"{_held(i in idle, router_settled)} after the {timeout_s:.0f}s drain timeout"
        )
        out = replace(s, released=True, rolling_since=now)
        return Step(
            out,
            f"{kind.word}_drained",
            f"{kind.events}Drained",
            f"instance {i} {how}; it rolls to {kind.new} now",
        )
    return Step(s, f"{kind.word}_draining")


def width_failed(step: Step) -> bool:
    """An instance released to roll onto the new width did not come up: a width the autoscaler chose
    is then given up (autoscaling.widthChanges Apply). An extra instance created for the change that
    is rolled back is not (the cluster may only lack a node to spare: the change goes on drain first)."""
    return step.event == "WidthRollStuck"


def retry_pause_boots(failures: int) -> int:
    """bootTimes before a wider width is chosen again after ``failures`` chosen widths in a row did
    not come up: a cause that lasts (a quota, a node pool too small) costs one drained instance per
    try, so tries grow rarer."""
    doublings = max(0, min(failures, 16) - 1)
    return min(WIDTH_RETRY_MAX_BOOTS, WIDTH_RETRY_BOOTS << doublings)


def width_to_apply(
    apply: bool, recommended: int | None, running: int, s: Scale, old: Collection[int], fits: bool,
    retry_at: float | None = None, now: float = 0.0,
) -> tuple[int | None, str]:  # fmt: skip
    """The width to run the pool at from now (autoscaling.widthChanges Apply), or None and why not.

    A wider recommendation is taken only while no width change, scale-out or drain is under way,
    with two instances or more listed (one keeps serving while the other drains and rolls) and
    ``fits`` (the pool's instances at that width inside the GPU budget), and not before ``retry_at``
    (a chosen width that did not come up). The reason is empty when there is nothing to apply:
    Recommend, no recommendation, or a narrower one (only recommended).
    """
    if not apply or recommended is None or recommended <= running:
        return None, ""
    if retry_at is not None and now < retry_at:
        at = datetime.fromtimestamp(retry_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return None, f"a wider width did not come up; none is chosen again before {at} (widthRetryAfter)"
    if not fits:
        return None, f"the pool's instances at {recommended} node(s) each would pass spec.gpuBudget"
    if s.rolling is not None and s.rolling_spec:
        return None, "a spec change is still rolling"
    if s.rolling is not None or old:
        return None, "a width change is still rolling"
    if s.draining or s.instances != s.serving:
        return None, "a scale-out or drain is under way"
    if s.serving < 2:
        return None, (
            "one instance serves: rolling it to the new width would stop the pool (minReplicas 2 lets it"
            " change make-before-break)"
        )
    return recommended, ""
