"""Start-up phases: a runtime's answer read as untrusted input, a moving start earns time, a stuck
one does not, and status shows each starting instance's phase."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from moe_operator.lifecycle import GroupState, PodState, StartReport
from moe_operator.reconcile.groups import group_actions
from moe_operator.reconcile.start import start_report, starting

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"start": None},
        {"start": "cuda_graphs"},
        {"start": {"phase": "pwned", "since": 1}},
        {"start": {"phase": "cuda_graphs", "since": -5}},
        {"start": {"phase": "cuda_graphs", "since": float("nan")}},
        {"start": {"phase": "cuda_graphs", "since": 1e12}},
        {"start": {"phase": "cuda_graphs", "since": True}},
        {"start": {"phase": ["cuda_graphs"], "since": 1}},
    ],
)
def test_a_malformed_answer_gives_no_report(answer: dict[str, Any]) -> None:
    assert start_report(answer, NOW) is None


def test_the_phase_and_when_it_began() -> None:
    entered = NOW - timedelta(seconds=90)
    answer = {
        "start": {
            "phase": "deepgemm_warmup",
            "since": 90.4,
            "phases": {"deepgemm_warmup": entered.timestamp()},
        }
    }
    assert start_report(answer, NOW) == StartReport("deepgemm_warmup", entered)
    lying = {
        "start": {"phase": "deepgemm_warmup", "since": 90, "phases": {"deepgemm_warmup": NOW.timestamp()}}
    }
    assert start_report(lying, NOW) == StartReport("deepgemm_warmup", entered)  # since wins over a bad stamp


def _starting_group(start: StartReport | None, unready_for: timedelta) -> GroupState:
    pod = PodState(
        "p0-0", "u0-0", 0, "Running", False, 0, NOW - timedelta(hours=3), "t1", "n0", NOW - unready_for
    )
    return GroupState(
        "decode", 0, 1, "t1", NOW - timedelta(hours=3), 0, (pod,), unready_limit_s=3600, start=start
    )


def test_a_start_that_moves_gets_up_to_twice_the_allowance_a_stuck_one_does_not() -> None:
    past_limit = timedelta(minutes=70)
    moving = _starting_group(StartReport("deepgemm_warmup", NOW - timedelta(minutes=10)), past_limit)
    assert not group_actions([moving], NOW, nodes={"n0"}).restarts
    stuck = _starting_group(StartReport("loading_weights", NOW - timedelta(minutes=45)), past_limit)
    (restart,) = group_actions([stuck], NOW, nodes={"n0"}).restarts
    assert "(3600s); its leader's engine was in loading_weights" in restart.message
    unknown = _starting_group(None, past_limit)
    assert group_actions([unknown], NOW, nodes={"n0"}).restarts
    capped = _starting_group(StartReport("cuda_graphs", NOW - timedelta(minutes=5)), timedelta(minutes=121))
    assert group_actions([capped], NOW, nodes={"n0"}).restarts, "never more than twice the allowance"


def test_status_lists_each_starting_instance_with_its_phase() -> None:
    group = _starting_group(StartReport("cuda_graphs", NOW - timedelta(seconds=30)), timedelta(minutes=1))
    silent = _starting_group(None, timedelta(minutes=1))
    silent = GroupState("decode", 1, 1, "t1", silent.epoch, 0, silent.pods, unready_limit_s=3600)
    assert starting([group, silent], "decode") == [
        {"instance": 0, "phase": "cuda_graphs", "phaseSince": "2026-12-05T11:59:30Z"},
        {"instance": 1, "phase": "launching"},
    ]
    assert starting([group], "prefill") == []
