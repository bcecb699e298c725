"""Command-line flags the operator derives from the spec, and the field that sets each."""

from __future__ import annotations

_POOL_WORLD = "spec.{pool}.nodesPerReplica x spec.topology.gpusPerNode"

ENGINE_FLAGS: dict[str, str] = {
    "--model-path": "spec.model.path (or spec.model.name)",
    "--model": "spec.model.path (or spec.model.name)",
    "--host": "the operator (engines listen on the pod IP)",
    "--port": "spec.engine.port",
    "--nnodes": "spec.{pool}.nodesPerReplica",
    "--node-rank": "the pod's index in its group",
    "--dist-init-addr": "the group's leader address and spec.engine.distInitPort",
    "--tp-size": _POOL_WORLD,
    "--tp": _POOL_WORLD,
    "--tensor-parallel-size": _POOL_WORLD,
    "--ep-size": _POOL_WORLD + " (with spec.{pool}.allToAllBackend)",
    "--ep": _POOL_WORLD + " (with spec.{pool}.allToAllBackend)",
    "--expert-parallel-size": _POOL_WORLD + " (with spec.{pool}.allToAllBackend)",
    "--dp-size": "spec.{pool}.attentionDataParallel",
    "--dp": "spec.{pool}.attentionDataParallel",
    "--data-parallel-size": "spec.{pool}.attentionDataParallel",
    "--attn-dp-size": "spec.{pool}.attentionDataParallel",
    "--enable-dp-attention": "spec.{pool}.attentionDataParallel",
    "--moe-a2a-backend": "spec.{pool}.allToAllBackend",
    "--deepep-mode": "spec.{pool}.deepepMode",
    "--disaggregation-mode": "spec.prefill (set for P/D, omitted for a decode pool serving alone)",
    "--disaggregation-transfer-backend": "spec.kvTransfer.backend",
    "--disaggregation-ib-device": "spec.kvTransfer.ibDevices",
    "--disaggregation-bootstrap-port": "spec.kvTransfer.bootstrapPort",
    "--enable-eplb": "spec.eplb.mode",
    "--ep-num-redundant-experts": "spec.eplb.redundantExperts",
    "--init-expert-location": "spec.eplb (the operator boots groups from its persisted placement)",
    "--expert-distribution-recorder-mode": "spec.eplb.mode (the runtime records expert load)",
    "--kv-cache-dtype": "spec.model.kvCacheDtype",
}

ROUTER_FLAGS: dict[str, str] = {
    "--pd-disaggregation": "spec.prefill",
    "--prefill": "the prefill pool's pods (found by the operator)",
    "--decode": "the decode pool's pods (found by the operator)",
    "--worker-urls": "the decode pool's pods (found by the operator)",
    "--host": "the operator",
    "--port": "spec.router.port",
    "--policy": "spec.router.policy",
    "--service-discovery": "the operator",
    "--service-discovery-namespace": "the operator",
    "--service-discovery-port": "spec.engine.port",
    "--selector": "the operator",
    "--prefill-selector": "the operator",
    "--decode-selector": "the operator",
    "--prometheus-port": "the operator (spec.monitoring)",
    "--prometheus-host": "the operator (spec.monitoring)",
}

# Flags whose value the capacity check reads when the user sets them.
MEM_FRACTION_FLAG = "--mem-fraction-static"
CONTEXT_LENGTH_FLAG = "--context-length"


def flag_name(arg: str) -> str | None:
    """The flag an argument names (``--tp-size=8`` -> ``--tp-size``), or None for a value."""
    if not arg.startswith("--"):
        return None
    return arg.split("=", 1)[0].replace("_", "-")


def flag_value(args: list[str], flag: str) -> str | None:
    """The last value given to ``flag`` in ``args`` (``--flag v`` or ``--flag=v``), or None."""
    value: str | None = None
    for i, arg in enumerate(args):
        if flag_name(arg) != flag:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return value
