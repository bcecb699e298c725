"""The baseline the autoscaler is measured against: a queue/KV threshold rule, one step at a time.

Dynamo Planner's load mode as documented (ai-dynamo/dynamo docs/architecture/load_planner.md
and components/planner/src/dynamo/planner/defaults.py): decode adds an instance when its mean
KV-cache use is above 0.9 and removes one below 0.5; prefill adds one when queued requests per
instance are above 5 and removes one below 0.2; one instance per adjustment interval (180 s
in the code), and nothing while a change is still coming up. No latency model, no forecast.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThresholdRule:
    kv_up: float = 0.9
    kv_down: float = 0.5
    queue_up: float = 5.0  # queued requests per instance (prefill)
    queue_down: float = 0.2
    interval_s: float = 180.0


def threshold_step(
    rule: ThresholdRule,
    role: str,
    instances: int,
    serving: int,
    token_usage: float,
    queued: float,
    lo: int,
    hi: int,
) -> int:
    """Instances after one adjustment interval (the caller calls it every ``interval_s``)."""
    if serving < instances:  # a change is still coming up
        return instances
    if role == "prefill":
        per = queued / max(serving, 1)
        up, down = per > rule.queue_up, per < rule.queue_down
    else:
        up, down = token_usage > rule.kv_up, token_usage < rule.kv_down
    if up:
        return min(instances + 1, hi)
    if down:
        return max(instances - 1, lo)
    return instances
