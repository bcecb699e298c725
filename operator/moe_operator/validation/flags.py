"""Which engine and router flags the operator owns, which ones SGLang retired, which ones bypass
the operator's expert placement, and a flag's value as SGLang would read it.

Ownership is by argparse dest, not by spelling: every option string of a dest in the catalog
(``--tp-size``, ``--tensor-parallel-size``) and every unambiguous prefix of one (``--tp``) is
covered, because SGLang's parser accepts all of them (moe_contract.flags.resolve).
"""

from __future__ import annotations

from collections.abc import Sequence

from moe_contract.flags import Catalog, engine_catalog, resolve, router_catalog

_POOL_WORLD = "spec.{pool}.nodesPerReplica x spec.topology.gpusPerNode"

# dest -> what the operator sets it from. Sources starting with "spec." are fields users set.
ENGINE_OWNED: dict[str, str] = {
    "model_path": "spec.model.path (or spec.model.name)",
    "served_model_name": "spec.model.name",
    "host": "the pod (engines listen on the pod IP)",
    "port": "spec.engine.port",
    "nnodes": "spec.{pool}.nodesPerReplica",
    "node_rank": "the pod's index in its group",
    "dist_init_addr": "the group's leader address and spec.engine.distInitPort",
    "tp_size": _POOL_WORLD,
    "ep_size": _POOL_WORLD + " (with spec.{pool}.allToAllBackend)",
    "dp_size": "spec.{pool}.attentionDataParallel",
    "attn_dp_size": "spec.{pool}.attentionDataParallel",
    "enable_dp_attention": "spec.{pool}.attentionDataParallel",
    "moe_a2a_backend": "spec.{pool}.allToAllBackend",
    "deepep_mode": "spec.{pool}.deepepMode",
    "deepep_config": "its engine config (the runtime's launcher owns --deepep-config)",
    "disaggregation_mode": "spec.prefill (set for P/D, omitted for a decode pool serving alone)",
    "disaggregation_transfer_backend": "spec.kvTransfer.backend",
    "disaggregation_ib_device": "spec.kvTransfer.ibDevices",
    "disaggregation_bootstrap_port": "spec.kvTransfer.bootstrapPort",
    "enable_eplb": "spec.eplb.mode",
    "ep_num_redundant_experts": "spec.eplb.redundantExperts",
    "eplb_rebalance_num_iterations": "spec.eplb.mode (the runtime's rebalance interval)",
    "eplb_rebalance_layers_per_chunk": "spec.eplb.mode (the runtime's rebalance settings)",
    "ep_dispatch_algorithm": "spec.eplb.mode (the runtime's EPLB plugin must know how tokens pick a replica)",
    "init_expert_location": "spec.eplb (the operator boots groups from its persisted placement)",
    "expert_distribution_recorder_mode": "spec.eplb.mode (the runtime records expert load)",
    "expert_balancedness_report_mode": "spec.monitoring (balancedness is exported to Prometheus)",
    "enable_metrics": "the runtime (metrics are always on)",
    "kv_cache_dtype": "spec.model.kvCacheDtype",
}

# Flags users may pass, which the operator moves out of extraArgs into the engine config
# (render.engine._lift_runtime_flags): only their full spelling is recognised there.
ENGINE_LIFTED: frozenset[str] = frozenset({"trust_remote_code", "load_format"})

ROUTER_OWNED: dict[str, str] = {
    "pd_disaggregation": "spec.prefill",
    "prefill": "the prefill pool's instances (the operator lists them)",
    "decode": "the decode pool's instances (the operator lists them)",
    "worker_urls": "the decode pool's instances (the operator lists them)",
    "host": "the pod (the router listens on every address)",
    "port": "spec.router.port",
    "policy": "spec.router.policy",
    "worker_startup_timeout_secs": "spec.engine.startupTimeout",
    "health_check_endpoint": "the operator (workers are checked by SGLang's cheap /ready)",
    "service_discovery": "the operator (it lists the instances itself)",
    "service_discovery_namespace": "the operator (it lists the instances itself)",
    "service_discovery_port": "spec.engine.port",
    "selector": "the operator (it lists the instances itself)",
    "prefill_selector": "the operator (it lists the instances itself)",
    "decode_selector": "the operator (it lists the instances itself)",
    "prometheus_port": "the operator (the router's metrics port 29000)",
    "prometheus_host": "the operator (the router's metrics port 29000)",
    "control_plane_api_keys": "the operator (it locks the router's worker-management API with a key "
    "only the router process holds: a key in the spec would be readable by everyone who can read it)",
    "mini_lb": "the operator (the Python mini load balancer has no control-plane authentication: its "
    "/flush_cache and worker info would be open to every client)",
}

# Engine flags that SGLang dropped (not in the catalog any more), with what replaced them.
REMOVED_ENGINE_FLAGS: dict[str, str] = {
    "--enable-ep-moe": "expert parallelism follows --ep-size, which the operator sets from " + _POOL_WORLD,
    "--enable-deepep-moe": "DeepEP is chosen by --moe-a2a-backend deepep, which the operator sets from "
    "spec.{pool}.allToAllBackend",
}

# Engine flags (by dest) whose every use switches off or bypasses the operator's expert
# placement, with the reason read in the sglang 0.5.23 wheel.
_ELASTIC = (
    "elastic EP resizes the expert-parallel world at run time (SGLang then forces its own "
    "elasticity_aware EPLB algorithm, pauses rebalancing while it scales and has rank 0 compute "
    "every later placement), which the operator's fixed-size pod groups and placements cannot follow"
)
PLACEMENT_BYPASS: dict[str, str] = {
    "elastic_ep_backend": _ELASTIC,
    "ep_join_mode": _ELASTIC,
    "ep_join_rank_offset": _ELASTIC,
    "elastic_ep_initial_size": _ELASTIC,
    "elastic_ep_scale_timeout": _ELASTIC,
    "max_ep_size": _ELASTIC,
    "enable_elastic_expert_backup": _ELASTIC,
    "expert_distribution_recorder_buffer_size": "the recorder's buffer is the load window the runtime "
    "reports at every rebalance; SGLang asserts it is no longer than --eplb-rebalance-num-iterations, "
    "which the operator sets",
}

# The router's shutdown grace sets its pods' terminationGracePeriodSeconds (render.shared), so its
# value is bounded: sglang-router 0.3.2's binary takes it as an unsigned number (a negative one
# stops it at start-up), a grace past the router's request timeout waits for nothing, and a day is
# the longest a replaced router pod may stay Terminating here (a policy, not the router's limit).
ROUTER_SHUTDOWN_GRACE = "shutdown_grace_period_secs"
ROUTER_SHUTDOWN_GRACE_FLAG = "--shutdown-grace-period-secs"
ROUTER_REQUEST_TIMEOUT_FLAG = "--request-timeout-secs"
MAX_ROUTER_SHUTDOWN_GRACE_S = 86_400
ROUTER_PRESTOP_S = 5
"""A replaced router pod keeps serving this long before SIGTERM: the Service's endpoints drop it first."""

# Engine flags whose value decides whether they bypass the placement (checked in arg_rules).
REBALANCE_THRESHOLD = "eplb_min_rebalancing_utilization_threshold"
DWDP_SIZE = "dwdp_size"

# Flags that stop the engine from serving or read more flags from elsewhere.
NOT_SERVING_ACTIONS: frozenset[str] = frozenset({"help", "version"})
CONFIG_FILE_DEST = "config"

# Flags whose value the capacity check reads when the user sets them.
MEM_FRACTION_FLAG = "--mem-fraction-static"
CONTEXT_LENGTH_FLAG = "--context-length"


def flag_value(args: list[str], flag: str, catalog: Catalog | None = None) -> str | None:
    """The value SGLang (or ``catalog``'s program) takes for ``flag`` (any alias or unambiguous prefix;
    the last one wins), converted by the flag's type (``--context-length 32k`` is 32000), as text."""
    catalog = catalog or engine_catalog()
    found = resolve(catalog, args).last(catalog.flag(flag).dest)
    if found is None or not isinstance(found.value, int | float | str) or isinstance(found.value, bool):
        return None
    return str(found.value)


def router_shutdown_grace_s(router_args: Sequence[str]) -> int:
    """How long the router finishes its requests in flight after SIGTERM: ``--shutdown-grace-period-secs``
    from spec.router.extraArgs, else sglang-router's own default (180 s in 0.3.2, read from its catalog)."""
    catalog = router_catalog()
    given = flag_value(list(router_args), ROUTER_SHUTDOWN_GRACE_FLAG, catalog)
    value = given if given is not None else catalog.flag(ROUTER_SHUTDOWN_GRACE_FLAG).default
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        return MAX_ROUTER_SHUTDOWN_GRACE_S
    return min(max(0, seconds), MAX_ROUTER_SHUTDOWN_GRACE_S)  # admission refuses the rest
