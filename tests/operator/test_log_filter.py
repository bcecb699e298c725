"""kopf's per-tick success lines are dropped from the operator log; other lines are kept."""

import logging

from moe_operator.cli.run import RoutineSuccessFilter


def test_routine_success_lines_are_dropped_and_failures_kept() -> None:
    f = RoutineSuccessFilter(["on_timer", "on_child_event"])

    def record(level: int, msg: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", level, __file__, 1, msg, None, None)

    assert not f.filter(record(logging.INFO, "Timer 'on_timer' succeeded."))
    assert not f.filter(record(logging.INFO, "Handler 'on_child_event' succeeded."))
    assert f.filter(record(logging.INFO, "Handler 'on_change' succeeded."))
    assert f.filter(record(logging.ERROR, "Timer 'on_timer' failed with an exception. Will retry."))
