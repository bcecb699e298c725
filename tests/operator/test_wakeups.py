"""Wakeups: marked deployments are due at once, unmarked ones once per period."""

from moe_operator.handlers.wakeups import Wakeups


def test_unmarked_deployment_is_due_once_per_period() -> None:
    w = Wakeups(5.0)
    key = ("ns", "a")
    assert w.due(key, 100.0)  # never reconciled
    assert not w.due(key, 101.0)
    assert not w.due(key, 104.9)
    assert w.due(key, 105.0)


def test_a_mark_makes_it_due_on_the_next_tick_once() -> None:
    w = Wakeups(5.0)
    key = ("ns", "a")
    w.reconciled(key, 100.0)
    assert not w.due(key, 100.5)
    w.mark(key)
    w.mark(key)
    assert w.due(key, 101.0)
    assert not w.due(key, 102.0), "one mark, one reconcile"
    assert w.due(("ns", "b"), 102.0), "other keys are independent"


def test_forget_drops_marks_and_history() -> None:
    w = Wakeups(5.0)
    key = ("ns", "a")
    w.reconciled(key, 100.0)
    w.mark(key)
    w.forget(key)
    assert w.due(key, 100.1), "a forgotten key is new again"
    assert not w.due(key, 100.2)


def test_pending_specs_go_first_for_at_most_max_defer() -> None:
    w = Wakeups(5.0, max_defer_s=2.0)
    old, new = ("ns", "old"), ("ns", "new")
    w.reconciled(old, 100.0)
    w.pending(new, 100.5)
    w.mark(old)
    assert not w.due(new, 101.0), "the change handler reconciles a pending spec, not the tick"
    assert not w.due(old, 101.0), "a marked deployment waits while another's new spec is pending"
    assert not w.due(old, 102.5)
    assert w.due(old, 103.0), "... but never longer than max_defer_s after it was first due"
    w.mark(old)
    assert not w.due(old, 103.5), "held again: the next mark starts a new hold"
    w.settled(new)
    assert w.due(old, 104.0), "nothing pending: a mark is due at once again"


def test_a_pending_spec_whose_handler_keeps_failing_stops_holding_others_back() -> None:
    w = Wakeups(5.0, max_defer_s=100.0, pending_ttl_s=30.0)  # holds longer than the TTL
    old, stuck = ("ns", "old"), ("ns", "stuck")
    w.reconciled(old, 100.0)
    w.pending(stuck, 100.0)
    w.mark(old)
    assert not w.due(old, 120.0)
    assert w.due(old, 131.0), "the pending entry expired"
    assert w.due(stuck, 131.0), "and the tick catches the stuck one up"
