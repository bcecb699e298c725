"""The pydantic models: defaults, camelCase round trip, status parsing, conditions helper."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from moe_operator.api import (
    READY,
    DecodePoolSpec,
    MoEDeploymentSpec,
    MoEDeploymentStatus,
    PrefillPoolSpec,
    Reason,
    get_condition,
    is_true,
    set_condition,
)
from moe_operator.api.types import parse_bytes, parse_count, parse_duration, parse_quantity
from moe_operator.validation import validate, warnings

from .invalid_specs import BASE_SPEC


def test_defaults() -> None:
    spec = MoEDeploymentSpec.model_validate({"model": {"name": "deepseek-v3"}})
    assert spec.prefill is None
    assert spec.decode.replicas == 1 and spec.decode.nodes_per_replica == 1
    assert spec.decode.attention_data_parallel is None
    assert spec.decode.deepep_mode == "auto" and PrefillPoolSpec().deepep_mode == "normal"
    assert spec.decode.all_to_all_backend == "deepep"
    assert spec.engine.image == "lmsysorg/sglang:v0.5.23" and spec.engine.port == 30000
    assert spec.topology.gpus_per_node == 8 and spec.topology.gpu_memory == "80Gi"
    assert spec.topology.nvlink_domain_label == "nvidia.com/gpu.clique"
    assert spec.topology.group_backend == "auto"
    assert spec.router.policy == "cache_aware"
    assert spec.kv_transfer.backend == "mooncake" and spec.kv_transfer.bootstrap_port == 8998
    assert (spec.eplb.mode, spec.eplb.redundant_experts, spec.eplb.refresh_interval) == ("operator", 0, "5m")
    assert spec.eplb.min_improvement == 0.03 and spec.eplb.min_interval == "10m" and spec.eplb.history == "1h"
    assert spec.monitoring.pod_monitor and spec.monitoring.prometheus_rule


def test_round_trip_keeps_camel_case_and_values() -> None:
    spec = MoEDeploymentSpec.model_validate(BASE_SPEC)
    wire = spec.to_wire()
    assert wire["decode"]["attentionDataParallel"] == 72
    assert wire["kvTransfer"]["ibDevices"] == ["mlx5_0"]
    assert wire["model"]["volume"] == {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    assert MoEDeploymentSpec.model_validate(wire) == spec
    assert "prefill" not in MoEDeploymentSpec.model_validate({"model": {"name": "x"}}).to_wire()


def test_snake_case_names_are_accepted_in_python() -> None:
    pool = DecodePoolSpec(nodes_per_replica=9, attention_data_parallel=72)
    assert pool.to_wire()["nodesPerReplica"] == 9


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        MoEDeploymentSpec.model_validate({"model": {"name": "x"}, "decode": {"gpus": 8}})


def test_status_parses_and_tolerates_newer_fields() -> None:
    status = MoEDeploymentStatus.model_validate(
        {
            "observedGeneration": 3,
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllPoolsReady"}],
            "pools": {"decode": {"replicas": 2, "readyReplicas": 2, "ready": "2/2", "futureField": 1}},
            "placement": {"decode": {"version": 4, "measuredBalancedness": 0.91}},
        }
    )
    assert status.pools is not None and status.pools.decode is not None
    assert status.pools.decode.ready_replicas == 2
    assert status.placement is not None and status.placement.decode is not None
    assert status.placement.decode.measured_balancedness == 0.91


def test_set_condition_keeps_transition_time_when_status_unchanged() -> None:
    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    conditions = set_condition([], READY, "False", Reason.WAITING_FOR_CAPACITY, "8 GPUs short", 1, t0)
    conditions = set_condition(conditions, "Progressing", "True", Reason.ROLLING_OUT, "", 1, t0)
    again = set_condition(conditions, READY, "False", Reason.POOLS_NOT_READY, "1/2", 2, t1)
    ready = get_condition(again, READY)
    assert ready is not None
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z" and ready["reason"] == "PoolsNotReady"
    assert ready["observedGeneration"] == 2
    assert [c["type"] for c in again] == [READY, "Progressing"]
    flipped = set_condition(again, READY, "True", Reason.ALL_POOLS_READY, "", 2, t1)
    assert is_true(flipped, READY)
    assert (get_condition(flipped, READY) or {}).get("lastTransitionTime") == "2026-01-02T00:00:00Z"


def test_parsers() -> None:
    assert parse_bytes("80Gi") == 80 * 2**30 and parse_bytes(1024) == 1024
    assert (
        parse_quantity("1.5k") == 1500
        and parse_quantity("2e3") == 2000
        and parse_bytes("500M") == 500_000_000
    )
    assert parse_duration("1h30m") == 5400 and parse_duration("250ms") == 0.25 and parse_duration("5m") == 300
    assert parse_count("671B") == 671_000_000_000 and parse_count("1.04T") == 1_040_000_000_000
    assert parse_count(42) == 42
    for bad in ("80 GB", "Gi"):
        with pytest.raises(ValueError):
            parse_quantity(bad)
    with pytest.raises(ValueError):
        parse_duration("5 minutes")


def test_a_width_change_admits_with_a_warning_that_says_what_it_costs() -> None:
    wider = copy.deepcopy(BASE_SPEC)
    wider["decode"].update(nodesPerReplica=18, attentionDataParallel=144)
    assert validate(wider, BASE_SPEC) == []
    said = warnings(wider, BASE_SPEC)
    assert any(
        "spec.decode.nodesPerReplica 9 -> 18 restarts every decode instance: one at a time" in w for w in said
    )
    assert not any("nodesPerReplica" in w for w in warnings(BASE_SPEC, BASE_SPEC))
    assert not any("nodesPerReplica" in w for w in warnings(wider))  # a creation changes nothing
    assert any("requests in flight are lost (with autoscaling" in w for w in said)
    scaled = _autoscaled(wider)
    drained = [w for w in warnings(scaled, BASE_SPEC) if "nodesPerReplica" in w]
    assert drained and "finish its requests before it restarts" in drained[0]
    applying = copy.deepcopy(scaled)
    applying["decode"]["autoscaling"]["widthChanges"] = "Apply"
    assert any("no longer Apply" in w for w in warnings(scaled, applying))
    assert not any("no longer Apply" in w for w in warnings(applying, applying))


def test_a_drain_timeout_shorter_than_the_router_may_finish_requests_admits_with_a_warning() -> None:
    """A replaced router pod may finish requests at the leaving instance for its pre-stop wait plus
    its shutdown grace (sglang-router 0.3.2: 180 s by default); a shorter drainTimeout cuts them."""
    scaled = _autoscaled(BASE_SPEC, drainTimeout="2m")
    assert validate(scaled) == []
    said = [w for w in warnings(scaled) if "drainTimeout" in w]
    assert len(said) == 1 and "spec.decode.autoscaling.drainTimeout (2m)" in said[0] and "185s" in said[0]
    enough = copy.deepcopy(scaled)
    enough["decode"]["autoscaling"]["drainTimeout"] = "185s"
    assert not any("drainTimeout" in w for w in warnings(enough))
    short_grace = copy.deepcopy(scaled)
    short_grace.setdefault("router", {})["extraArgs"] = ["--shutdown-grace-period-secs", "60"]
    assert validate(short_grace) == [] and not any("drainTimeout" in w for w in warnings(short_grace))
    no_router = copy.deepcopy(scaled)
    no_router.setdefault("router", {})["replicas"] = 0
    assert not any("drainTimeout" in w for w in warnings(no_router))
    external = copy.deepcopy(scaled)
    external["decode"]["autoscaling"]["mode"] = "External"
    assert not any("drainTimeout" in w for w in warnings(external))


def test_power_of_two_in_the_routers_role_flags_is_refused_only_where_a_list_can_hold_one() -> None:
    """An autoscaled decode pool lists one instance when scaled in, or with one of two off the list
    for its roll; sglang-router 0.3.2 does not start with power_of_two over one worker."""
    fixed = copy.deepcopy(BASE_SPEC)
    fixed.setdefault("router", {})["extraArgs"] = ["--decode-policy", "power_of_two"]
    assert validate(fixed) == []  # two replicas, not autoscaled
    scaled = _autoscaled(fixed, minReplicas=2)
    (problem,) = validate(scaled)
    assert problem.field == "spec.router.extraArgs[0]" and "autoscaled pool is scaled in" in problem.message
    external = copy.deepcopy(scaled)
    external["decode"]["autoscaling"]["mode"] = "External"
    assert validate(external) == []


def test_the_drain_timeout_warning_offers_a_fix_drain_timeout_can_take() -> None:
    scaled = _autoscaled(BASE_SPEC)
    scaled.setdefault("router", {})["extraArgs"] = [
        "--request-timeout-secs", "86400", "--shutdown-grace-period-secs", "80000",
    ]  # fmt: skip
    assert validate(scaled) == []
    (said,) = [w for w in warnings(scaled) if "drainTimeout" in w]
    assert "lower the router's shutdown grace to 7195s or less" in said and "set drainTimeout" not in said


def _autoscaled(spec: dict, **autoscaling: object) -> dict:  # type: ignore[type-arg]
    """``spec`` with its decode pool autoscaled by the operator on a 50 ms ITL, 1 to 4 instances."""
    out = copy.deepcopy(spec)
    out["decode"]["autoscaling"] = {
        "mode": "Operator", "minReplicas": 1, "maxReplicas": 4, "slo": {"itl": "50ms"}, **autoscaling,
    }  # fmt: skip
    return out
