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
