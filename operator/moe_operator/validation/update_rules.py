"""Rules on updates: fields that cannot change in place (mirrors the CRD's CEL transition rules)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hardware import known_profile, lookup_profile
from .problem import Problem


def _get(spec: Mapping[str, Any], path: str, default: Any = None) -> Any:
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return default
        node = node[part]
    return node


def _gpus_per_node(spec: Mapping[str, Any]) -> Any:
    """As the spec is read: written, else its hardware profile's, else 8."""
    written = _get(spec, "topology.gpusPerNode")
    hardware = _get(spec, "topology.hardware")
    if written is None and isinstance(hardware, str) and known_profile(hardware):
        return lookup_profile(hardware).gpus_per_node
    return 8 if written is None else written


def check_update(spec: Mapping[str, Any], old_spec: Mapping[str, Any]) -> list[Problem]:
    """Refuse in-place changes that would need a new deployment."""
    problems: list[Problem] = []
    old_name, new_name = _get(old_spec, "model.name"), _get(spec, "model.name")
    if old_name is not None and new_name != old_name:
        problems.append(
            Problem(
                "spec.model.name",
                f"spec.model.name is immutable ({old_name!r} -> {new_name!r}): another model replaces every "
                "pod; create a new MoEDeployment and move traffic to it",
            )
        )
    old_arch, new_arch = _get(old_spec, "model.architecture"), _get(spec, "model.architecture")
    if old_arch != new_arch:
        problems.append(
            Problem(
                "spec.model.architecture",
                "spec.model.architecture is immutable once the deployment exists: it describes the model "
                "being served; create a new MoEDeployment for a different architecture",
            )
        )
    old_hw, new_hw = _get(old_spec, "topology.hardware"), _get(spec, "topology.hardware")
    if old_hw != new_hw:
        problems.append(
            Problem(
                "spec.topology.hardware",
                f"spec.topology.hardware is immutable ({old_hw or 'unset'} -> {new_hw or 'unset'}): it shapes "
                "every pod group; create a new MoEDeployment for other hardware",
            )
        )
    old_gpus, new_gpus = _gpus_per_node(old_spec), _gpus_per_node(spec)
    if old_gpus != new_gpus:
        problems.append(
            Problem(
                "spec.topology.gpusPerNode",
                f"spec.topology.gpusPerNode is immutable ({old_gpus} -> {new_gpus}): every pod group and "
                "expert "
                "placement is shaped by it; create a new MoEDeployment for nodes of another size",
            )
        )
    had_prefill, has_prefill = _get(old_spec, "prefill") is not None, _get(spec, "prefill") is not None
    if had_prefill != has_prefill:
        change = "removed" if had_prefill else "added"
        problems.append(
            Problem(
                "spec.prefill",
                f"spec.prefill cannot be {change} in place: it switches the decode pool between serving "
                "alone "
                "and P/D disaggregation, which restarts every group; create a new MoEDeployment and move "
                "traffic to it",
            )
        )
    return problems


def update_warnings(spec: Mapping[str, Any], old_spec: Mapping[str, Any]) -> list[str]:
    """What an update admits but costs: a pool's width change restarts its instances (no surge)."""
    out: list[str] = []
    for pool in ("prefill", "decode"):
        applied = _get(old_spec, f"{pool}.autoscaling.widthChanges") == "Apply"
        scaled = _get(spec, f"{pool}.autoscaling.mode", "Operator") == "Operator"
        if (
            applied
            and _get(spec, pool) is not None
            and (_get(spec, f"{pool}.autoscaling.widthChanges") != "Apply" or not scaled)
        ):
            out.append(
                f"spec.{pool}.autoscaling.widthChanges is no longer Apply: if the autoscaler runs the pool at "
                f"another width (status.autoscaling.{pool}.nodesPerReplica), every {pool} instance rolls back "
                f"to spec.{pool}.nodesPerReplica, one at a time"
            )
    for pool in ("prefill", "decode"):
        old_nodes, new_nodes = (
            _get(old_spec, f"{pool}.nodesPerReplica", 1),
            _get(spec, f"{pool}.nodesPerReplica", 1),
        )
        if _get(old_spec, pool) is None or _get(spec, pool) is None or old_nodes == new_nodes:
            continue
        scaled = _get(spec, f"{pool}.autoscaling.mode", "External") == "Operator"
        how = (
            "the autoscaler first creates one instance at the new width where maxReplicas and gpuBudget "
            "leave room, then takes each instance off the router and lets it finish its requests before "
            "it restarts (one instance alone without room restarts at once)"
            if scaled
            else "a restarting instance's requests in flight are lost (with autoscaling.mode Operator the "
            "autoscaler drains each instance first)"
        )
        out.append(
            f"spec.{pool}.nodesPerReplica {old_nodes} -> {new_nodes} restarts every {pool} instance: one at a "
            "time where the cluster has free nodes for each new group beside the running ones; an instance "
            "that can only be placed onto nodes another still runs restarts at once, and so does the one "
            f"running there, whichever pool it is in, losing its requests in flight; otherwise {how}. "
            "Nothing restarts where the autoscaler already runs the pool at this width (widthChanges Apply). "
            "To keep full capacity without autoscaling, create a second MoEDeployment at the new width, move "
            "traffic to it, then delete this one"
        )
    return out
