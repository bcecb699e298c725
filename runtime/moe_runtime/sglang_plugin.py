"""SGLang general plugin: put the operator's expert placement into the engine's own EPLB.

Loaded by ``sglang.srt.plugins.load_plugins()`` in every SGLang process through the
entry point ``sglang.srt.plugins: moe_operator_eplb``. ``register`` adds an AROUND hook
on ``sglang.srt.eplb.eplb_algorithms.rebalance_experts``, which ``init_by_eplb`` looks
up at call time on every rebalance. This module is the thin torch adapter; the decision
itself is numpy code in ``moe_runtime.eplb_hook`` (shared with the replay engine).

Every rank must apply the same map. SGLang's normal path calls ``rebalance_experts`` on
every rank with the same all-reduced counts, so rank 0 decides and broadcasts a
[L, P] int64 map; an all ``-1`` map means "run SGLang's original", which every rank then
does itself (deterministic on identical inputs), so that case returns exactly what
SGLang would have. Where SGLang itself calls the function on rank 0 only and broadcasts
the result (elastic EP after a scale-up), the hook does not broadcast.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from moe_placement.maps import IntArray, expert_count, logical_to_all_physical
from moe_runtime import eplb_hook, exchange

log = logging.getLogger("moe_runtime.sglang_plugin")

TARGET = "sglang.srt.eplb.eplb_algorithms.rebalance_experts"

_STATE: eplb_hook.HookState | None = None


def register() -> None:
    """Entry point: register the AROUND hook (SGLang applies hooks after all plugins ran)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, around_rebalance_experts, HookType.AROUND)


def hook_state() -> eplb_hook.HookState:
    """This process's hook state, created on first use from the environment."""
    global _STATE
    if _STATE is None:
        _STATE = eplb_hook.HookState(eplb_hook.HookSettings.from_env())
    return _STATE


def reset_state(state: eplb_hook.HookState | None = None) -> None:
    """For tests: drop cached settings/counters (or install given ones)."""
    global _STATE
    _STATE = state


def around_rebalance_experts(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: same arguments and return contract as ``rebalance_experts``."""
    import torch

    try:
        params = inspect.signature(original).bind(*args, **kwargs).arguments
        tokens: Any = params["tokens_per_expert"]
        num_physical = int(params["num_physical_experts"])
        num_local = int(params["num_local_physical_experts"])
        num_groups = params.get("num_groups")
        num_nodes = int(params.get("num_nodes") or 1)
        algorithm = params.get("algorithm")
        num_layers, num_logical = int(tokens.shape[-2]), int(tokens.shape[-1])
    except Exception as exc:  # SGLang changed the signature: the same on every rank, so all defer
        log.warning("moe-runtime EPLB plugin: unexpected rebalance_experts call (%s); using SGLang's", exc)
        return original(*args, **kwargs)

    dist = _distributed()
    rank = dist.get_rank() if dist is not None else 0
    broadcast = dist is not None and dist.get_world_size() > 1 and not _engine_broadcasts()
    if not broadcast and rank != 0:
        return original(*args, **kwargs)

    state = hook_state()
    shape = eplb_hook.EngineShape(
        num_layers=num_layers,
        num_logical=num_logical,
        num_physical=num_physical,
        num_gpus=num_physical // num_local,
        num_nodes=num_nodes,
        num_groups=int(num_groups) if num_groups is not None else None,
    )
    start = time.perf_counter()
    decision = eplb_hook.Decision("original", None, reason="not decided")
    if rank == 0:
        decision = _decide_on_rank0(state, tokens, shape)
    chosen = decision.phy2log

    if broadcast:
        assert dist is not None
        # With NCCL the tensor must live on this rank's device; the window already does.
        buf = torch.full((num_layers, num_physical), -1, dtype=torch.int64, device=tokens.device)
        if rank == 0 and chosen is not None:
            buf.copy_(torch.from_numpy(chosen))
        try:
            dist.broadcast(buf, src=0)
        except Exception as exc:
            if rank == 0:
                state.error("broadcast", exc)
            raise  # ranks cannot safely diverge: let the engine fail loudly
        received = buf.cpu().numpy()
        chosen = None if bool((received < 0).all()) else received

    if chosen is None:
        t_orig = time.perf_counter()
        result = original(*args, **kwargs)
        original_seconds = time.perf_counter() - t_orig
        if rank == 0:
            applied = result[0].detach().cpu().numpy().astype(np.int64)
            hook_seconds = time.perf_counter() - start - original_seconds - decision.planner_seconds
            eplb_hook.record_applied(state, decision, applied, hook_seconds=hook_seconds)
        return result

    out = _to_outputs(chosen, num_logical, num_physical, algorithm, tokens)
    if rank == 0:
        hook_seconds = time.perf_counter() - start - decision.planner_seconds
        eplb_hook.record_applied(state, decision, chosen, hook_seconds=hook_seconds)
    return out


def _decide_on_rank0(
    state: eplb_hook.HookState, tokens: Any, shape: eplb_hook.EngineShape
) -> eplb_hook.Decision:
    """Export the window and choose a map; any failure degrades to SGLang's original."""
    try:
        window = tokens if tokens.dim() == 3 else tokens.unsqueeze(0)
        counts = window.sum(dim=0, dtype=_torch_int64()).cpu().numpy()
        # counts are >= 0: a pass routed tokens iff its max is positive (no [N, L, E] bool temp)
        routed = window.reshape(window.shape[0], -1).amax(dim=1) > 0
        passes = int(routed.sum().item())
    except Exception as exc:
        state.error("window", exc)
        return eplb_hook.Decision("original", None, reason=f"cannot read window: {exc}")
    steps = _step_samples(state, window, routed)
    eplb_hook.export_window(state, counts, passes, shape, steps)
    return eplb_hook.choose_map(state, counts, shape, current=lambda: _current_map(shape))


def _step_samples(state: eplb_hook.HookState, window: Any, routed: Any) -> exchange.StepArray | None:
    """Up to STEP_SAMPLES single passes of the window, oldest first, copied off the device alone
    (not the whole buffer); None when their order is unknown or they cannot be read."""
    try:
        rows = eplb_hook.sample_positions(routed.cpu().numpy(), _ring_next_index(int(window.shape[0])))
        if rows is None:
            return None
        index = _torch_from_numpy(rows).to(window.device)
        return np.asarray(window.index_select(0, index).cpu().numpy(), dtype=np.int32)
    except Exception as exc:
        state.error("steps", exc)
        return None


def _ring_next_index(rows: int) -> int | None:
    """The row SGLang's stat-mode ring writes next (its oldest once wrapped), read from the
    recorder's private state in 0.5.23 (tests/runtime check it against that code); None when
    this SGLang keeps it elsewhere or the buffer is not the one the window came from."""
    try:
        from sglang.srt.eplb.expert_distribution import get_global_expert_distribution_recorder

        ring = get_global_expert_distribution_recorder()._accumulator._global_physical_count_of_buffered_step
    except Exception:
        return None
    if type(ring).__name__ == "_InfiniteBuffer":
        return 0  # an unbounded buffer holds its passes in order from row 0
    index, buffer = getattr(ring, "_curr_index", None), getattr(ring, "_buffer", None)
    if not isinstance(index, int) or buffer is None or len(buffer) != rows:
        return None
    return index if 0 <= index < rows else None


def _to_outputs(
    phy2log: IntArray, num_logical: int, num_physical: int, algorithm: Any, tokens: Any
) -> tuple[Any, Any, Any]:
    """Tensors in the dtypes, device and log2phy width SGLang's chosen algorithm returns."""
    import torch

    log2phy = logical_to_all_physical(phy2log, num_logical)
    count = expert_count(phy2log, num_logical)
    name = str(getattr(algorithm, "name", algorithm))
    cpu = torch.device("cpu")
    if name.startswith("deepseek_vec"):
        # width num_redundant + 1; decode path: int32 on the window's device;
        # hierarchical path: int64 map, int32 log2phy and counts, on CPU
        width = num_physical - num_logical + 1
        padded = np.full((*log2phy.shape[:2], width), -1, dtype=np.int64)
        padded[..., : log2phy.shape[-1]] = log2phy
        log2phy = padded
        if name == "deepseek_vec":
            dtypes, device = (torch.int32, torch.int32, torch.int32), tokens.device
        else:
            dtypes, device = (torch.int64, torch.int32, torch.int32), cpu
    else:
        # deepseek / deepseek_hierarchical / elasticity_aware*: int64 on CPU, width = max copies
        dtypes, device = (torch.int64, torch.int64, torch.int64), cpu
    a, b, c = (
        torch.from_numpy(np.ascontiguousarray(arr)).to(device=device, dtype=dt)
        for arr, dt in zip((phy2log, log2phy, count), dtypes, strict=True)
    )
    return a, b, c


def _torch_from_numpy(arr: IntArray) -> Any:
    import torch

    return torch.from_numpy(arr)


def _torch_int64() -> Any:
    import torch

    return torch.int64


def _distributed() -> Any:
    """torch.distributed when initialized, else None."""
    try:
        import torch.distributed as dist
    except Exception:
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _engine_broadcasts() -> bool:
    """True on SGLang's elastic path, where only rank 0 runs the algorithm and SGLang broadcasts."""
    try:
        from sglang.srt.elastic_ep.elastic_ep import ElasticEPStateManager

        manager = ElasticEPStateManager.instance()
        return bool(manager is not None and getattr(manager, "has_scaled", False))
    except Exception:
        return False


def _current_map(shape: eplb_hook.EngineShape) -> IntArray | None:
    """The engine's current placement, for movement-aware planning; None when unknown."""
    try:
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        meta = get_global_expert_location_metadata()
        if meta is None:
            return None
        arr: IntArray = np.asarray(meta.physical_to_logical_map_cpu.numpy(), dtype=np.int64)
    except Exception:
        return None
    if arr.shape != (shape.num_layers, shape.num_physical):
        return None
    return arr
