"""The order children are written in, and the pool that writes them: pods never precede what they
need, and in a burst one deployment's workloads do not wait behind other deployments' Services."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from moe_operator.handlers.priority_pool import PriorityPool
from moe_operator.reconcile.children import apply_waves
from render_cases import EXAMPLES, example_children


def _kinds(wave: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in wave}


@pytest.mark.parametrize("backend", ["StatefulSet", "LeaderWorkerSet"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_what_pods_need_is_written_before_the_workloads_and_services_after(
    example: str, backend: str
) -> None:
    objects = example_children(example, backend=backend)
    waves = apply_waves(objects)
    assert sorted(map(id, (o for w in waves for o in w))) == sorted(map(id, objects))  # each once
    first, workloads = waves[0], waves[1]
    assert _kinds(workloads) <= {"StatefulSet", "Deployment", "LeaderWorkerSet"}
    assert {"ServiceAccount", "NetworkPolicy", "ConfigMap"} <= _kinds(first)
    assert not _kinds(first) & {"Service", "PodDisruptionBudget"}  # those wait until pods are asked for
    # every ServiceAccount a pod template names exists before the workload that creates the pod
    accounts = {o["metadata"]["name"] for o in first if o["kind"] == "ServiceAccount"}
    for w in workloads:
        spec = w["spec"]
        templates = [spec["template"]] if "template" in spec else [
            t for t in (spec["leaderWorkerTemplate"].get(k) for k in ("leaderTemplate", "workerTemplate")) if t
        ]  # fmt: skip
        for t in templates:
            assert t["spec"].get("serviceAccountName", "default") in accounts | {"default"}
    if len(waves) > 2:
        assert not _kinds(waves[2]) & {"ServiceAccount", "NetworkPolicy", "StatefulSet", "Deployment"}


def test_no_empty_wave() -> None:
    assert apply_waves([{"kind": "Service"}]) == [[{"kind": "Service"}]]
    assert apply_waves([]) == []


def test_the_pool_runs_lower_priorities_first_and_fifo_within_one() -> None:
    pool = PriorityPool(1, "test")
    gate, ran = threading.Event(), []
    pool.submit(0, gate.wait)  # the one worker waits while the rest queue up
    futures = [pool.submit(p, ran.append, f"{p}-{i}") for i, p in enumerate([2, 1, 2, 0, 1])]
    gate.set()
    for f in futures:
        f.result(timeout=5)
    pool.shutdown()
    assert ran == ["0-3", "1-1", "1-4", "2-0", "2-2"]


def test_the_pool_hands_exceptions_to_the_caller_and_keeps_working() -> None:
    pool = PriorityPool(2, "test")

    def boom() -> None:
        raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        pool.submit(0, boom).result(timeout=5)
    assert pool.submit(0, lambda: 7).result(timeout=5) == 7
    started = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - started < 5


def test_the_reconcile_that_started_first_goes_first_wave_by_wave() -> None:
    """(reconcile start, wave): an earlier deployment's StatefulSets go before a later one's
    ServiceAccounts, and its Services too, so its reconcile ends and frees its thread first."""
    pool = PriorityPool(1, "test")
    gate, ran = threading.Event(), []
    pool.submit((0.0, 0), gate.wait)
    jobs = [
        ((2.0, 0), "b-sa"),
        ((1.0, 1), "a-sts"),
        ((1.0, 2), "a-svc"),
        ((2.0, 1), "b-sts"),
        ((1.0, 0), "a-sa"),
    ]
    futures = [pool.submit(p, ran.append, name) for p, name in jobs]
    gate.set()
    for f in futures:
        f.result(timeout=5)
    pool.shutdown()
    assert ran == ["a-sa", "a-sts", "a-svc", "b-sa", "b-sts"]
