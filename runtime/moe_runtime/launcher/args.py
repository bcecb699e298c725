"""The SGLang command line and environment for one pod (pure: config + pod facts in, argv out)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from moe_contract.engine import EngineConfig
from moe_runtime import eplb_hook, exchange, recorder
from moe_runtime.config import PodEnv

ENGINE_MODULE = "sglang.launch_server"


def build_command(
    cfg: EngineConfig,
    pod: PodEnv,
    *,
    init_expert_location: str | None = None,
    python: str = "python3",
) -> list[str]:
    """``python -m sglang.launch_server ...`` for this pod; flag order is stable (goldens)."""
    p = cfg.parallel
    argv = [python, "-m", ENGINE_MODULE, "--model-path", cfg.model_path]
    if cfg.served_model_name:
        argv += ["--served-model-name", cfg.served_model_name]
    argv += ["--host", cfg.host, "--port", str(cfg.ports.http)]
    if p.nnodes > 1:
        argv += [
            "--nnodes",
            str(p.nnodes),
            "--node-rank",
            str(pod.rank),
            "--dist-init-addr",
            f"{pod.leader_address}:{cfg.ports.dist_init}",
        ]
    argv += ["--tp-size", str(p.tp_size)]
    if p.attn_dp > 1:
        argv += ["--attn-dp-size", str(p.attn_dp)]
    if p.ep_size > 1:
        argv += ["--ep-size", str(p.ep_size)]
    if p.a2a_backend != "none":
        argv += ["--moe-a2a-backend", p.a2a_backend]
        if p.a2a_backend.startswith("deepep"):
            argv += ["--deepep-mode", cfg.deepep_mode]
            if p.deepep_config:
                argv += ["--deepep-config", p.deepep_config]
    argv += _disaggregation_args(cfg)
    argv += _eplb_args(cfg)
    if init_expert_location:
        argv += ["--init-expert-location", init_expert_location]
    if cfg.enable_metrics:
        argv += ["--enable-metrics"]
        if p.ep_size > 1:
            argv += ["--expert-balancedness-report-mode", "prometheus"]
    if cfg.load_format:
        argv += ["--load-format", cfg.load_format]
    if cfg.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    if cfg.trust_remote_code:
        argv += ["--trust-remote-code"]
    return argv + list(cfg.extra_args)


def _disaggregation_args(cfg: EngineConfig) -> list[str]:
    if cfg.role == "standalone":
        return []
    d = cfg.disaggregation
    out = ["--disaggregation-mode", cfg.role, "--disaggregation-transfer-backend", d.transfer_backend]
    if cfg.role == "prefill":
        out += ["--disaggregation-bootstrap-port", str(d.bootstrap_port)]
    if d.ib_devices:
        out += ["--disaggregation-ib-device", ",".join(d.ib_devices)]
    return out


def _eplb_args(cfg: EngineConfig) -> list[str]:
    e = cfg.eplb
    out: list[str] = []
    if cfg.eplb_enabled:
        out += ["--enable-eplb", "--ep-num-redundant-experts", str(e.num_redundant_experts)]
        out += ["--eplb-rebalance-num-iterations", str(e.rebalance_iterations)]
        if e.rebalance_layers_per_chunk:
            out += ["--eplb-rebalance-layers-per-chunk", str(e.rebalance_layers_per_chunk)]
        if e.algorithm:
            out += ["--eplb-algorithm", e.algorithm]
    else:
        if e.mode == "static" and cfg.parallel.ep_size > 1:
            # No rebalance without --enable-eplb, so no window reaches the plugin: the leader's
            # sidecar dumps SGLang's recorder instead (moe_runtime.recorder). Its circular
            # buffer holds --eplb-rebalance-num-iterations passes (SGLang sizes it from that
            # flag; it does nothing else without --enable-eplb).
            out += ["--expert-distribution-recorder-mode", "stat"]
            out += ["--eplb-rebalance-num-iterations", str(e.rebalance_iterations)]
        if e.num_redundant_experts:
            out += ["--ep-num-redundant-experts", str(e.num_redundant_experts)]
    if e.dispatch_algorithm:
        out += ["--ep-dispatch-algorithm", e.dispatch_algorithm]
    return out


def engine_env(
    cfg: EngineConfig, pod: PodEnv, state_dir: Path, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The engine's environment: the pod's, plus what the plugin and SGLang need to find."""
    env = dict(base or {})
    env.update(
        {
            exchange.STATE_DIR_ENV: str(state_dir),
            eplb_hook.ENV_MODE: cfg.eplb.mode,
            eplb_hook.ENV_MAX_AGE: str(cfg.eplb.placement_max_age_seconds),
            eplb_hook.ENV_DISPATCH: cfg.dispatch,
            eplb_hook.ENV_INSTANCE: pod.instance,
            recorder.DIR_ENV: str(recorder.recorder_dir(state_dir)),
        }
    )
    if cfg.eplb.placement_file:
        env[eplb_hook.ENV_PLACEMENT_FILE] = cfg.eplb.placement_file
    if pod.pod_ip:
        env.setdefault("SGLANG_HOST_IP", pod.pod_ip)
    env.update(cfg.env)
    return env
