"""One placement per engine instance (pure): each instance's own windows, the pool's as a prior.

Why per instance (docs/placement.md, "Cluster level"): a replica's in-flight requests and its
router affinity make its own recent windows the best forecast of its next one; one map per
pool fitted on the pool's sum was up to 3.17x worse than a replica's own engine EPLB, per
instance plans never worse. moe_placement.plan_instances plans each instance from its own
history with the pool's as a prior and keeps its own guard (per layer, the instance's own
engine EPLB map where that scores better).

Versions: one counter per pool. An evaluation that changes any instance takes the next number;
every instance is then pushed that number (the changed ones their new map, the others the map
they hold), and the live ConfigMap gets the pool plan under it. The engine applies the highest
version among its pushed document and the mounted ConfigMap (on a tie the pushed one), so no
instance may be left on a lower number than the ConfigMap, or it would switch to the pool map.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from moe_contract import plan_wire
from moe_operator.control import aggregate, score
from moe_operator.control.decide import Decision, Inputs, decide
from moe_operator.control.evaluate import NoFreshWindows, Policy, PoolShape, UnsafePlan
from moe_operator.control.windows import FloatArray, Window, instance_of, newest
from moe_placement import document, plan, plan_instances
from moe_placement.planner import rescore

MAX_STATUS_INSTANCES = 32  # status.placement.<pool>.instances and the provenance annotation


@dataclass(frozen=True)
class Held:
    """What one runtime says it holds (GET /v1/placement), checked like any peer's answer."""

    version: int | None  # None: nothing valid pushed (a new or restarted pod)
    phy2log: np.ndarray | None
    problem: str = ""  # why the answer was not taken ('' when it was, or held nothing)


def read_held(answer: Any, shape: PoolShape, now: float) -> Held:
    """A runtime's placement answer: its version and map when both are valid for this pool."""
    if not isinstance(answer, Mapping) or answer.get("version") is None:
        return Held(None, None)
    try:
        parsed = document.parse(answer, now=now, default_generated_at=now)
    except (ValueError, TypeError, RecursionError) as exc:
        return Held(None, None, f"held placement unreadable: {exc}"[:200])
    problems = shape.problems(parsed.physical_to_logical_map)
    if problems:
        return Held(None, None, f"held placement v{parsed.version} unfit: {problems[0]}"[:200])
    return Held(parsed.version, np.asarray(parsed.physical_to_logical_map, dtype=np.int64))


def current_of(held: Held | None, live: np.ndarray, live_version: int) -> tuple[np.ndarray, int]:
    """The map an instance runs, and its version. The engine takes the higher version of its pushed
    document and the live ConfigMap: a runtime holding nothing valid, or an older version than the
    live one (a rollback, a push it missed), runs the live map."""
    if held is None or held.phy2log is None or held.version is None or held.version < live_version:
        return live, live_version
    return held.phy2log, held.version


@dataclass(frozen=True)
class InstanceResult:
    """One instance's evaluation: its own measured and predicted balancedness and decision."""

    name: str
    current: np.ndarray
    candidate: np.ndarray
    measured: float
    predicted: float
    moved: int
    decision: Decision
    window_end: float
    step_samples: int = 0  # single passes of its newest window the plan hedged on

    @property
    def target(self) -> np.ndarray:
        """The map it should hold after this evaluation."""
        return self.candidate if self.decision.publish else self.current


@dataclass(frozen=True)
class PoolEvaluation:
    """Every planned instance of a pool, and the pool plan when anything is published."""

    results: dict[str, InstanceResult]
    pool_candidate: np.ndarray | None  # the live ConfigMap's next map (None: nothing published)
    window_range: tuple[int, int]
    history_buckets: int
    restored_buckets: int

    @property
    def publish(self) -> bool:
        return any(r.decision.publish for r in self.results.values())

    @property
    def changed(self) -> list[InstanceResult]:
        return [r for r in self.results.values() if r.decision.publish]

    @property
    def measured(self) -> float:
        return float(np.mean([r.measured for r in self.results.values()]))

    @property
    def predicted(self) -> float:
        """Mean over instances of what each will run: the prediction where it changes, else measured."""
        return float(
            np.mean([r.predicted if r.decision.publish else r.measured for r in self.results.values()])
        )

    @property
    def moved(self) -> int:
        return sum(r.moved for r in self.changed)

    def head(self) -> str:
        """What happened, in one clause."""
        if self.publish:
            return f"new placement for {len(self.changed)} of {len(self.results)} instance(s)"
        return "no instance gets a new placement"

    def details(self) -> str:
        """Each instance's decision, by name."""
        return "; ".join(f"{n}: {r.decision.message}" for n, r in sorted(self.results.items()))

    def message(self) -> str:
        """Why this evaluation did or did not publish, per instance (events)."""
        return f"{self.head()}: {self.details()}"


def histories(
    windows: Sequence[Window], names: Sequence[str], bucket_s: float
) -> tuple[list[int], FloatArray, dict[str, FloatArray]]:
    """The pool's buckets (every window, restored ones and gone instances' included) and each named
    instance's own on the SAME keys (zero rows where it has no window: the planner ignores them)."""
    keys, pool = aggregate.bucketed(windows, bucket_s)
    index = {k: i for i, k in enumerate(keys)}
    own = {name: np.zeros_like(pool) for name in names}
    for w in windows:
        i = index.get(int(w.ended_at // bucket_s))
        name = instance_of(w.instance)
        if i is not None and name in own and not w.restored:
            own[name][i] += w.counts
    return keys, pool, own


def newest_fresh(windows: Sequence[Window], fresh_after: float) -> dict[str, Window]:
    """Each instance's newest window ending after ``fresh_after`` (restored buckets never score)."""
    found: dict[str, Window] = {}
    for w in windows:
        name = instance_of(w.instance)
        if w.restored or w.ended_at < fresh_after:
            continue
        if name not in found or newest(w) > newest(found[name]):
            found[name] = w
    return found


def plan_requests(
    windows: Sequence[Window],
    currents: Mapping[str, np.ndarray],
    shape: PoolShape,
    policy: Policy,
    fresh_after: float,
    request: str,
) -> dict[str, plan_wire.PlanRequest]:
    """For planning in the runtimes: what each instance with a fresh window needs from the
    operator (the pool's buckets and their sums as the prior, the map it runs, the shape and the
    move cap); its own windows and step samples the runtime holds itself."""
    fresh = [n for n in newest_fresh(windows, fresh_after) if n in currents]
    if not fresh:
        return {}
    keys, pool = aggregate.bucketed(windows, policy.bucket_s)

    def request_of(n: str) -> plan_wire.PlanRequest:
        return plan_wire.PlanRequest(
            request=request, bucket_s=policy.bucket_s, keys=tuple(keys), fresh_after=fresh_after,
            num_gpus=shape.num_gpus, num_nodes=shape.num_nodes, num_redundant=shape.num_redundant,
            num_groups=shape.num_groups, dispatch=shape.dispatch, max_moves=policy.max_moves or None,
            prior=pool, current=np.asarray(currents[n], dtype=np.int64),
        )  # fmt: skip

    return {n: request_of(n) for n in fresh}


def evaluate_instances(
    windows: Sequence[Window],
    currents: Mapping[str, np.ndarray],
    live: np.ndarray,
    shape: PoolShape,
    policy: Policy,
    since_change: Mapping[str, float | None],
    fresh_after: float,
    proposals: Mapping[str, np.ndarray] | None = None,
) -> PoolEvaluation:
    """Plan every instance in ``currents`` that reported a fresh window, decide each on its own
    numbers, and plan the pool (from the live map) when any of them publishes. ``proposals``: maps
    the instances' own runtimes planned; each is checked and scored here on the operator's own
    windows exactly as the operator's plan would be (one it cannot use is planned here instead).

    Raises NoFreshWindows (no instance to plan), UnsafePlan or ValueError (bad input)."""
    fresh = {n: w for n, w in newest_fresh(windows, fresh_after).items() if n in currents}
    if not fresh:
        raise NoFreshWindows("no fresh load windows from any instance")
    keys, pool, own = histories(windows, sorted(fresh), policy.bucket_s)
    kw: dict[str, Any] = {
        "num_gpus": shape.num_gpus, "num_nodes": shape.num_nodes, "num_redundant": shape.num_redundant,
        "num_groups": shape.num_groups, "dispatch": shape.dispatch,
    }  # fmt: skip
    plans: dict[str, Any] = {}
    for n, proposal in (proposals or {}).items():
        checked = (
            _checked(proposal, own[n], pool, fresh[n], currents[n], shape, policy, kw) if n in fresh else None
        )
        if checked is not None:
            plans[n] = checked
    rest = {n: own[n] for n in fresh if n not in plans}
    if rest:
        plans |= plan_instances(
            rest, **kw, pool=pool, currents={n: currents[n] for n in rest},
            steps={n: fresh[n].steps for n in rest}, max_moves=policy.max_moves or None,
        )  # fmt: skip
    results = {
        n: _result(n, fresh[n], currents[n], plans[n], shape, policy, since_change.get(n)) for n in fresh
    }
    restored = {int(w.ended_at // policy.bucket_s) for w in windows if w.restored}
    ends = [w.ended_at for w in fresh.values()]
    out = PoolEvaluation(
        results, None, (int(min(ends)), int(max(ends))), len(keys), len(restored.intersection(keys))
    )
    if not out.publish:
        return out
    return replace(out, pool_candidate=_pool_plan(pool, live, shape, policy))


def _checked(
    proposal: np.ndarray, own: FloatArray, pool: FloatArray, newest: Window, current: np.ndarray,
    shape: PoolShape, policy: Policy, kw: dict[str, Any],
) -> Any:  # fmt: skip
    """A runtime's map scored as the operator's own plan would be, or None when it is not a safe
    map of this pool, moves past the cap, or scores below the map the instance runs on the same
    forecast (the operator then plans that instance itself: an honest proposal is its own plan,
    so the decision is the same; a skewed one gains nothing)."""
    if shape.problems(proposal):
        return None
    try:
        scored, kept = rescore(own, proposal, current, prior=pool, steps=newest.steps, current=current, **kw)
    except (ValueError, TypeError, IndexError):
        return None
    if policy.max_moves and scored.moved_slots > policy.max_moves:
        return None
    gain = score.mean_over_moe(scored.predicted_balancedness, newest.counts) - score.mean_over_moe(
        kept.predicted_balancedness, newest.counts
    )
    return scored if gain >= 0 else None


def _result(
    name: str, newest: Window, current: np.ndarray, planned: Any, shape: PoolShape, policy: Policy,
    since: float | None,
) -> InstanceResult:  # fmt: skip
    candidate = planned.physical_to_logical_map
    bad = shape.problems(candidate)
    if bad:
        raise UnsafePlan(f"the planner's map for {name} is unsafe, not published: " + "; ".join(bad[:3]))
    measured = score.measured(current, newest.counts, shape.num_gpus, shape.num_nodes, shape.dispatch)
    predicted = score.mean_over_moe(planned.predicted_balancedness, newest.counts)
    decision = decide(
        Inputs(
            mode=policy.mode, measured=measured, predicted=predicted, moved=planned.moved_slots,
            min_improvement=policy.min_improvement, max_moves=policy.max_moves,
            min_interval_s=policy.min_interval_s, since_last_publish_s=since, paused=policy.paused,
        )
    )  # fmt: skip
    samples = 0 if newest.steps is None else int(newest.steps.shape[0])
    return InstanceResult(
        name, current, candidate, measured, predicted, planned.moved_slots, decision, newest.ended_at, samples
    )


def _pool_plan(pool: FloatArray, live: np.ndarray, shape: PoolShape, policy: Policy) -> np.ndarray:
    """What new and restarted groups boot with: the pool's mix is the best forecast for a group
    with no windows of its own; planned from the live map under the move cap, so an instance that
    misses a push (and so takes the ConfigMap) moves little."""
    result = plan(
        pool, num_gpus=shape.num_gpus, num_nodes=shape.num_nodes, num_redundant=shape.num_redundant,
        num_groups=shape.num_groups, current=live, dispatch=shape.dispatch,
        max_moves=policy.max_moves or None,
    )  # fmt: skip
    bad = shape.problems(result.physical_to_logical_map)
    if bad:
        raise UnsafePlan("the planner's pool map is unsafe, not published: " + "; ".join(bad[:3]))
    return result.physical_to_logical_map


def next_version(pool_version: int, held: Mapping[str, Held]) -> int:
    """The number a publishing evaluation takes: above the pool's and every runtime's."""
    return max([pool_version, *(h.version or 0 for h in held.values())]) + 1


def push_version(pool_version: int, held: Held | None) -> int:
    """The number an instance is pushed when nothing is published: the pool's, or its own when a
    runtime holds a higher one (pushed outside this loop): runtimes refuse lower numbers."""
    return max(pool_version, (held.version or 0) if held is not None else 0)


def provenance(ev: PoolEvaluation, version: int) -> dict[str, Any]:
    """Per-instance provenance for the live ConfigMap's annotation (bounded, no maps)."""
    rows = sorted(ev.results.values(), key=lambda r: r.name)[:MAX_STATUS_INSTANCES]
    return {
        r.name: {
            "version": version,
            "changed": r.decision.publish,
            "measuredBalancedness": round(r.measured, 4),
            "predictedBalancedness": round(r.predicted, 4),
            "movedExperts": r.moved if r.decision.publish else 0,
            "stepSamples": r.step_samples,
        }
        for r in rows
    }
