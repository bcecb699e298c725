"""The start-up phase of each instance on its way up, asked of its leader's runtime (thin shell).

Only trusted leader pods (reconcile.observe.trusted_pods) that run but are not ready are asked,
each at most every POLL_S, at most MAX_PER_RECONCILE per reconcile, with the runtime client's byte
cap and deadline. What a runtime answers is parsed as untrusted (reconcile.start.start_report);
a runtime that does not answer leaves its group on the plain start-up allowance.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from moe_operator.control.client import RuntimeAnswerError, RuntimeClient
from moe_operator.handlers.runtime_tokens import leader_tokens
from moe_operator.lifecycle import StartReport
from moe_operator.reconcile.start import start_report

if TYPE_CHECKING:
    from moe_operator.handlers.reconcile import Target

POLL_S = 20.0
MAX_PER_RECONCILE = 16
TIMEOUT_S = 2.0


def read_starts(t: Target, pods: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], StartReport]:
    """(pool, instance) -> the phase its leader reported (cached between polls in the deployment's state)."""
    cache = t.state.starts
    starting = {(p["pool"], p["instance"]) for p in pods if not p["ready"]}
    for done in [k for k in cache if k not in starting]:
        del cache[done]  # ready (or gone): nothing to show
    now = time.time()
    due = [
        p
        for p in pods
        if p["rank"] == 0 and p["phase"] == "Running" and p.get("ip")
        and (p["pool"], p["instance"]) in starting
        and now - cache.get((p["pool"], p["instance"]), (None, 0.0))[1] >= POLL_S
    ][:MAX_PER_RECONCILE]  # fmt: skip
    if due:
        tokens = leader_tokens(t.op, t.owner, due)
        if tokens:
            with RuntimeClient(tokens, timeout_s=TIMEOUT_S) as client:
                for pod in due:
                    cache[(pod["pool"], pod["instance"])] = (_ask(client, pod["ip"]), now)
    return {k: report for k, (report, _) in cache.items() if report is not None}


def _ask(client: RuntimeClient, ip: str) -> StartReport | None:
    try:
        return start_report(client.status(ip), datetime.now(UTC))
    except RuntimeAnswerError:
        return None
