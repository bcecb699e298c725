"""How many instances a pool needs now, and whether to change: data in, a decision out.

The need is what the model says the forecast load takes at the SLO, with headroom; a breach
the model did not predict adds one instance; a pool whose KV cache is full needs room, not
compute, and a wider width is recommended when it holds that room on fewer GPUs. Scale-out
plans on the rate one boot time ahead (wide-EP groups take minutes to come up), plus what
drains the queue those instances will find; scale-in
plans on the highest rate of the last window, one instance at a time, never while an
instance is booting or an SLO is breached, and never below what the current load needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .model import Fit, update

HISTORY_S = 2 * 3600.0  # rate samples kept at most: the longest boot time or scale-in window
MAX_NEED = 1_000_000  # instances: a need past it is reported as it, not computed
SURGE_HALF_LIFE_S = 6 * 3600.0  # how fast a remembered surge is forgotten
# Spare capacity per remembered surge (spec: burstReserve). More meets the SLO through bursts
# that land on a higher load (they rise more) and costs GPU-hours; benchmarks/autoscale_bench.py
# prints both sides, and no value won on both there (docs/autoscaling.md).
BURST_RESERVE = 1.0


@dataclass(frozen=True)
class Objective:
    metric: str  # "ttft" or "itl"
    slo_s: float
    quantile: float  # 0.5 .. 0.99


@dataclass(frozen=True)
class Width:
    """One allowed instance size: nodes, GPUs, and the KV tokens an instance holds at that size."""

    nodes: int
    gpus: int
    kv_tokens: float


@dataclass(frozen=True)
class PoolPolicy:
    objectives: tuple[Objective, ...]
    min_instances: int
    max_instances: int
    width: Width  # the pool's current instance size
    widths: tuple[Width, ...] = ()  # sizes the pool may be recommended (with the current one)
    headroom: float = 0.9  # share of the SLO rate planned to
    kv_target: float = 0.9  # KV use one instance is planned to
    scale_out_cooldown_s: float = 60.0
    scale_in_cooldown_s: float = 120.0
    scale_in_window_s: float = 600.0
    boot_s: float = 300.0
    drain_timeout_s: float = 600.0
    max_step_out: int = 4
    surge_half_life_s: float = SURGE_HALF_LIFE_S
    burst_reserve: float = BURST_RESERVE  # spare capacity held, as a multiple of the remembered surge


@dataclass(frozen=True)
class PoolObservation:
    """The pool over the last interval, summed over its serving instances."""

    at: float
    serving: int  # instances that answered with a usable interval
    rate: float  # finished requests/s, the pool's total
    latency: dict[str, float | None]  # objective metric -> measured quantile
    token_usage: float  # mean KV use of the serving instances, 0..1
    queued: float  # requests waiting, the pool's total
    # every serving instance (and, for a P/D prefill pool, every decode instance its TTFT comes
    # from) runs the spec's number of ranks: only then does the interval say what one instance of
    # that width serves (during a width change's roll it does not)
    one_width: bool = True


@dataclass(frozen=True)
class PoolState:
    """What one decision hands to the next (kept in status)."""

    instances: int  # instances the autoscaler wants (groups kept, booting included)
    fits: dict[str, Fit]
    rates: tuple[tuple[float, float], ...] = ()  # (time, pool rate)
    last_out: float | None = None
    last_in: float | None = None
    queued: float = 0.0  # the pool's queue at the last decision
    surge: float = 0.0  # largest rise of the pool rate within one boot time, decayed (requests/s)
    gpus: int = 0  # GPUs per instance the fits were measured on (0: not recorded)


@dataclass(frozen=True)
class PoolDecision:
    before: int  # instances the autoscaler wanted before this decision
    instances: int
    reason: str  # a metric label
    message: str  # for status and events
    need: int  # instances the load needs (forecast, scale-in window, KV, breach; before min, max, budget)
    state: PoolState
    width: Width | None = None  # a recommended size, when it holds the load on fewer GPUs
    numbers: dict[str, float] = field(default_factory=dict)
    # instances the load needs now: the offered rate and queue, KV room, a breach (before min, max,
    # budget). ``need`` also holds the burst reserve and the scale-in window's peak, spare capacity
    # whose absence is no load going unserved (MoEAutoscalerAtLimit reads this one)
    load: int = 0


def _smoothed(rates: tuple[tuple[float, float], ...]) -> list[tuple[float, float]]:
    """Each rate as the median of itself and the two before: one noisy interval moves nothing."""
    out = []
    for i, (t, _) in enumerate(rates):
        window = sorted(r for _, r in rates[max(0, i - 2) : i + 1])
        out.append((t, window[len(window) // 2]))
    return out


def _noise(rate: float, rates: tuple[tuple[float, float], ...]) -> float:
    """Two standard deviations of a Poisson rate measured over one interval: rises below it are noise."""
    dt = rates[-1][0] - rates[-2][0] if len(rates) > 1 else 0.0
    return 2 * math.sqrt(rate / dt) if dt > 0 and rate > 0 else 0.0


def _surge(
    state: PoolState, smooth: list[tuple[float, float]], now: float, boot_s: float, half_life_s: float
) -> float:
    """What load can add before a new instance serves: the largest rise seen within a boot time.

    A reactive autoscaler of groups that take minutes to boot meets an SLO through a burst only
    if the capacity for the burst's first boot time is already there. Rates are medians of
    three and a rise within two Poisson standard deviations is noise; the memory halves every
    ``half_life_s`` (spec: burstMemory), so a one-off surge stops costing GPUs.
    """
    previous = [r for t, r in smooth[:-1] if now - t <= boot_s]
    newest = smooth[-1][1]
    rise = newest - min(previous) if previous else 0.0
    rise -= _noise(newest, tuple(smooth))
    last = state.rates[-1][0] if state.rates else now  # the previous decision, before pruning
    decayed = state.surge * float(0.5 ** ((now - last) / half_life_s))
    return max(decayed, rise, 0.0)


def _backlog(policy: PoolPolicy, queued: float, growth: float, overloaded: bool, capacity: float) -> float:
    """The rate that drains, within one boot time, the queue an instance ordered now finds.

    Instances ordered under overload serve only after ``boot_s``; by then the queue holds what
    waits now and what joins it meanwhile. Sized to the arrivals alone they would serve the new
    load and leave that queue (and its TTFT) to drain at the headroom's pace. Only while an SLO
    is breached: a queue that stands while latency is fine is no backlog and must not hold the
    pool up, and one interval's growth is too noisy a sign of overload (an e2e run scaled out on
    it). At most what the largest pool serves.
    """
    if not overloaded:
        return 0.0
    boot = max(policy.boot_s, 1.0)
    rate = (queued + max(0.0, growth) * boot) / boot
    return min(rate, policy.max_instances * capacity) if capacity > 0 else rate


def _capacity(policy: PoolPolicy, fits: dict[str, Fit]) -> float:
    """Requests/s one instance serves with every objective at its SLO times the headroom."""
    rates = [fits[o.metric].rate_at(o.slo_s) * policy.headroom for o in policy.objectives]
    return max(0.0, min(rates, default=0.0))


def _need(policy: PoolPolicy, fits: dict[str, Fit], rate: float) -> tuple[int, str]:
    """Instances that serve ``rate`` with every objective at its SLO times the headroom."""
    need, bound = 0, "idle"
    for o in policy.objectives:
        per = fits[o.metric].rate_at(o.slo_s) * policy.headroom
        if not math.isfinite(per) or per <= 0:
            return policy.max_instances, f"{o.metric}_unreachable"
        ratio = rate / per
        n = math.ceil(ratio - 1e-9) if math.isfinite(ratio) and ratio < MAX_NEED else MAX_NEED
        if n > need:
            need, bound = n, o.metric
    return need, bound


def _kv_need(policy: PoolPolicy, obs: PoolObservation) -> int:
    usage = min(1.0, obs.token_usage)
    return math.ceil(obs.serving * usage / policy.kv_target - 1e-9) if obs.serving else 0


def recommend_width(
    policy: PoolPolicy, obs: PoolObservation, kv_need: int, compute_need: int
) -> Width | None:
    """A wider size when KV room binds: the tokens in use held on fewer GPUs than today."""
    if kv_need <= compute_need or not policy.widths:
        return None
    in_use = obs.serving * obs.token_usage * policy.width.kv_tokens
    per_compute = compute_need * policy.width.gpus  # compute scales with GPUs at any width

    def gpus(w: Width) -> float:
        kv = math.ceil(in_use / (w.kv_tokens * policy.kv_target)) * w.gpus
        return max(kv, per_compute)

    best = min(policy.widths, key=lambda w: (gpus(w), w.nodes))
    return best if best.nodes != policy.width.nodes and gpus(best) < gpus(policy.width) else None


def _breach(policy: PoolPolicy, obs: PoolObservation) -> str:
    over = [
        f"{o.metric} p{round(o.quantile * 100)} {v:.3g}s > {o.slo_s:g}s"
        for o in policy.objectives
        if (v := obs.latency.get(o.metric)) is not None and v > o.slo_s
    ]
    return ", ".join(over)


def _usable(obs: PoolObservation) -> bool:
    numbers = [
        obs.at,
        obs.rate,
        obs.token_usage,
        obs.queued,
        *(v for v in obs.latency.values() if v is not None),
    ]
    return all(math.isfinite(v) and v >= 0 for v in numbers)


def decide_pool(policy: PoolPolicy, state: PoolState, obs: PoolObservation | None) -> PoolDecision:
    """One interval's decision for one pool."""
    if obs is None or obs.serving <= 0 or not _usable(obs):
        why = "no instance answered with a usable interval; keeping the current size"
        return PoolDecision(
            state.instances, state.instances, "no_data", why, state.instances, state, load=state.instances
        )
    now = obs.at
    per = obs.rate / obs.serving
    fits = (
        {o.metric: update(state.fits[o.metric], per, obs.latency.get(o.metric)) for o in policy.objectives}
        if obs.one_width
        else dict(state.fits)  # instances of two widths: the rate still counts, the curve waits
    )
    # Under overload the finished rate is what the pool serves, not what arrives: the queue's
    # growth over the interval is the rest of the offered load.
    last_t = state.rates[-1][0] if state.rates else None
    growth = (obs.queued - state.queued) / (now - last_t) if last_t is not None and now > last_t else 0.0
    offered = obs.rate + max(0.0, growth)
    keep = min(HISTORY_S, max(policy.scale_in_window_s, policy.boot_s))
    rates = (*tuple((t, r) for t, r in state.rates if now - t <= keep), (now, offered))
    smooth = _smoothed(rates)
    surge = _surge(state, smooth, now, policy.boot_s, policy.surge_half_life_s)
    # a surge past what the largest pool serves buys nothing, and would take days to fade
    # (where the SLO looks unreachable for now, capacity is 0: the memory is kept as it is)
    capacity = _capacity(policy, fits)
    if capacity > 0:
        surge = min(surge, policy.max_instances * capacity)
    base_level = min(r for t, r in smooth if now - t <= policy.boot_s)
    breach = _breach(policy, obs)
    backlog = _backlog(policy, obs.queued, growth, bool(breach), capacity)
    ahead = max(offered, base_level + policy.burst_reserve * surge) + backlog
    recent = max(r for t, r in rates if now - t <= policy.scale_in_window_s)
    need_out, bound = _need(policy, fits, ahead)
    need_in, _ = _need(policy, fits, max(recent, offered))
    kv = _kv_need(policy, obs)
    booting = max(0, state.instances - obs.serving)
    floor = obs.serving + 1 if breach and booting == 0 else 0
    need = max(need_out, kv, floor)  # what scale-out grows to
    load = max(_need(policy, fits, offered + backlog)[0], kv, floor)  # and of it, what the load takes now
    keep_need = max(need, need_in)  # what scale-in keeps: the burst memory too, so a drain is not undone
    width = recommend_width(policy, obs, kv, max(need_out, floor))
    if kv > max(need_out, floor):
        bound = "kv"
    elif floor > need_out:
        bound = "breach"
    numbers = {
        "rate": obs.rate,
        "offeredRate": offered,
        "forecastRate": ahead,
        "tokenUsage": obs.token_usage,
        "queued": obs.queued,
        **{f"{o.metric}RatePerInstance": fits[o.metric].rate_at(o.slo_s) for o in policy.objectives},
    }
    new_state = replace(state, fits=fits, rates=rates, surge=surge, queued=obs.queued)
    lo, hi = policy.min_instances, policy.max_instances
    target, reason = min(max(state.instances, lo), hi), "steady"
    detail = f"load {offered:.3g} req/s (ahead {ahead:.3g}) needs {keep_need} instance(s), {bound}-bound"
    if breach:
        detail += f"; SLO breached: {breach}"
    if not obs.one_width:
        detail += (
            "; a listed instance does not run the spec's number of ranks (a width change rolls, or a rank"
            " is being replaced): the curve learns again once every instance does"
        )
    if need > state.instances and state.instances < hi:
        if state.last_out is not None and now - state.last_out < policy.scale_out_cooldown_s:
            reason = "cooldown"
        else:
            target, reason = min(need, state.instances + policy.max_step_out, hi), "scale_out"
            new_state = replace(new_state, last_out=now)
    elif max(keep_need, lo) < state.instances and not breach:
        last = max(t for t in (state.last_out, state.last_in, -math.inf) if t is not None)
        if booting:
            reason = "booting"
        elif now - last < policy.scale_in_cooldown_s:
            reason = "cooldown"
        else:
            target, reason = state.instances - 1, "scale_in"
            new_state = replace(new_state, last_in=now)
    if target < lo or state.instances < lo:
        target, reason = max(target, lo), "min_instances"
    elif state.instances > hi:  # maxReplicas lowered: one drained instance at a time
        target, reason = state.instances - 1, "max_instances"
    message = f"{reason}: {state.instances} -> {target}; {detail}"
    if width is not None:
        message += f"; KV-bound: {width.nodes} node(s) per instance would hold it on fewer GPUs"
    new_state = replace(new_state, instances=target)
    return PoolDecision(state.instances, target, reason, message, keep_need, new_state, width, numbers, load)


def within_budget(
    decisions: dict[str, PoolDecision], budget_gpus: int | None, gpus: dict[str, int]
) -> dict[str, PoolDecision]:
    """Trim growth so the deployment's GPUs stay inside the budget (None: no budget).

    Only growth is trimmed, the largest first, so a budget never forces a scale-in; a budget
    lowered below what runs stops growth until load lets the pools shrink.
    """
    if budget_gpus is None:
        return decisions
    out = dict(decisions)
    while sum(d.instances * gpus[p] for p, d in out.items()) > budget_gpus:
        growing = [p for p, d in out.items() if d.instances > d.before]
        if not growing:
            break
        p = max(growing, key=lambda q: out[q].instances - out[q].before)
        d = out[p]
        n = d.instances - 1
        reason = "budget" if n == d.before else d.reason
        msg = (
            f"{reason}: {d.before} -> {n} inside the {budget_gpus}-GPU budget; "
            + d.message.split("; ", 1)[-1]
        )
        out[p] = replace(d, instances=n, reason=reason, message=msg, state=replace(d.state, instances=n))
    return out
