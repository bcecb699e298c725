"""Planning in the runtimes (``moe-operator run --planning runtimes``; docs/scale.md): each leader's
runtime plans its own instance from its own windows, fed with what only the operator holds.

A thin shell: PUT every request at once, poll the answers until each is done or failed or the
deadline passes, and hand back the maps. Nothing a runtime answers is believed but the map,
which control.instances checks and scores itself; an instance without a usable proposal (an
older runtime, a failure, a timeout) is planned by the operator, as before.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from moe_contract import plan_wire
from moe_operator.control.client import RuntimeAnswerError, RuntimeClient

POLL_S = 0.5
WAIT_S = 60.0  # a runtime plans in about a second at DeepSeek-V3 shape; past this, the operator plans it


def gather_proposals(
    client: RuntimeClient,
    leaders: list[dict[str, Any]],
    requests: dict[str, plan_wire.PlanRequest],
    wait_s: float = WAIT_S,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Maps proposed by the instances' runtimes, and why the others did not propose (by instance)."""
    ips = {str(p["name"]): str(p["ip"]) for p in leaders if str(p["name"]) in requests}
    if not ips:
        return {}, {}
    deadline = time.monotonic() + wait_s  # the requests' own time counts too
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(ips)))) as pool:
        results = pool.map(lambda n: client.request_plan(ips[n], plan_wire.encode(requests[n])), ips)
        sent = dict(zip(ips, results, strict=True))
        missing = {n: f"plan request: {s.refusal}" for n, s in sent.items() if s.refusal is not None}
        pending = {n: ips[n] for n in ips if n not in missing}
        proposals: dict[str, np.ndarray] = {}
        while pending and time.monotonic() < deadline:
            time.sleep(POLL_S)
            asked = pool.map(lambda n: _answer(client, pending[n], requests[n].request), pending)
            answers = dict(zip(pending, asked, strict=True))
            for name, answer in answers.items():
                state, value = read_proposal(answer, requests[name].request)
                if state == "done" and isinstance(value, np.ndarray):
                    proposals[name] = value
                elif state in ("failed", "refused"):
                    missing[name] = f"plan: {value}"
                if state in ("done", "failed", "refused"):
                    del pending[name]
    missing.update({n: f"no plan after {wait_s:.0f}s" for n in pending})
    return proposals, missing


def planned_here(missing: dict[str, str]) -> str:
    """A note for the status message: how many instances the operator planned itself, and why (one)."""
    if not missing:
        return ""
    name, why = min(missing.items())
    return f"; planned here for {len(missing)} instance(s) without a runtime proposal ({name}: {why})"


def _answer(client: RuntimeClient, ip: str, request: str) -> dict[str, Any] | str:
    try:
        return client.proposal(ip, request)
    except RuntimeAnswerError as exc:
        return str(exc)


def read_proposal(answer: dict[str, Any] | str, request: str) -> tuple[str, np.ndarray | str]:
    """(state, map or why): 'done' with the proposed map, 'failed'/'refused' with a reason for status,
    or 'waiting' (planning, queued, or still another request's answer)."""
    if isinstance(answer, str):
        return "refused", answer[:120]
    if answer.get("request") != request:
        return "waiting", ""
    state = answer.get("state")
    if state == "failed":
        return "failed", str(answer.get("message") or "failed")[:120]
    if state != "done":
        return "waiting", ""
    rows = answer.get("physical_to_logical_map")
    if not _integer_matrix(rows):  # JSON integers only: nothing rounded, no booleans
        return "refused", "the proposed map is not a matrix of integers"
    try:
        return "done", np.asarray(rows, dtype=np.int64)
    except OverflowError:
        return "refused", "the proposed map is not a matrix of integers"


def _integer_matrix(rows: Any) -> bool:
    return (
        isinstance(rows, list)
        and bool(rows)
        and all(isinstance(r, list) and len(r) == len(rows[0]) for r in rows)
        and all(type(x) is int for r in rows for x in r)
    )
