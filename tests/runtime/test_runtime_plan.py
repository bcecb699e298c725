"""The runtime plans its own instance (PUT/GET /v1/plan, moe_runtime.sidecar.planning): the route
takes a moe_contract.plan_wire request only with the token, refuses hostile or mismatched bodies
before anything is queued, plans off the event loop on its own windows and answers the map the
operator's own planning call gives for the same inputs."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rt_helpers import metric
from test_runtime_sidecar import TOKEN, Clients, sidecar, until

from moe_contract import plan_wire
from moe_contract.plan_wire import PlanRequest
from moe_placement.instances import own_history, plan_instances
from moe_placement.maps import trivial_map
from moe_runtime import exchange
from moe_runtime.sidecar import planning
from moe_runtime.sidecar.app import ApiPolicy
from moe_runtime.sidecar.service import Sidecar

WIRE = {"Content-Type": plan_wire.MEDIA_TYPE}
BUCKET_S = 10.0
KEYS = tuple(range(8))  # buckets 0-7: windows end at 10 .. 60, so buckets 0 and 7 hold none


def request(name: str = "r-1", **kw: Any) -> PlanRequest:
    rng = np.random.default_rng(3)
    base: dict[str, Any] = {
        "request": name, "bucket_s": BUCKET_S, "keys": KEYS, "fresh_after": 55.0, "num_gpus": 4,
        "num_nodes": 2, "num_redundant": 4, "num_groups": 1, "dispatch": "static", "max_moves": 6,
        "prior": rng.integers(0, 500, (len(KEYS), 3, 8)).astype(np.float64),
        "current": trivial_map(3, 8, 12),
    }  # fmt: skip
    return PlanRequest(**{**base, **kw})


def records() -> list[exchange.WindowRecord]:
    """Six windows of skewed traffic ending at 10 .. 60; the newest with step samples."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(6):
        counts = rng.poisson(rng.gamma(0.6, 400, (3, 8)))
        steps = rng.poisson(counts / 50, (4, 3, 8)) if i == 5 else None
        meta = {"num_gpus": 4, "num_physical": 12}
        out.append(exchange.WindowRecord(counts, 100, 10.0 * i + 5, 10.0 * i + 10, meta, steps=steps))
    return out


async def with_windows(side: Sidecar, c: Clients, recs: list[exchange.WindowRecord]) -> None:
    for rec in recs:
        exchange.write_window(side.opts.state_dir, rec)

    async def all_in() -> bool:
        return bool((await c.api.get("/v1/status")).json()["windows"]["count"] == len(recs))

    await until(all_in)


async def put(c: Clients, req: PlanRequest) -> Any:
    return await c.api.put("/v1/plan", content=plan_wire.encode(req), headers=WIRE)


async def settled(c: Clients, name: str) -> dict[str, Any]:
    """The request's proposal once it is done or failed."""
    got: dict[str, Any] = {}

    async def ended() -> bool:
        got.update((await c.api.get("/v1/plan", params={"request": name})).json())
        return got["state"] in ("done", "failed")

    await until(ended, timeout=60)
    return got


def test_the_plan_route_needs_the_token_even_where_reads_are_open(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path, policy=ApiPolicy(open_reads=True)) as (_, c):
            body = plan_wire.encode(request())
            assert (await c.bare.put("/v1/plan", content=body, headers=WIRE)).status_code == 401
            r = await c.bare.put("/v1/plan", content=body, headers={**WIRE, "Authorization": "Bearer no"})
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
            assert (await c.bare.post("/v1/plan", content=body, headers=WIRE)).status_code == 401
            idle = (await c.bare.get("/v1/plan")).json()  # --reads open opens GET routes only
            assert idle["state"] == "idle" and idle["request"] is None
            text = await c.scrape()
            assert metric(text, "moe_runtime_api_refused_total", reason="unauthorized") == 3

    asyncio.run(run())


def hostile() -> dict[str, tuple[bytes, dict[str, str], int, str]]:
    good = plan_wire.encode(request())
    return {
        "garbage": (b"not a plan at all", WIRE, 400, "not a plan request"),
        "empty": (b"", WIRE, 400, "prefix"),
        "wrong magic": (b"MOEW" + good[4:], WIRE, 400, "not a plan request of version"),
        "truncated": (good[:-1], WIRE, 400, "runs past"),
        "trailing bytes": (good + b"\0\0", WIRE, 400, "past the last array"),
        "json": (b'{"request": "r-1"}', {"Content-Type": "application/json"}, 415, plan_wire.MEDIA_TYPE),
        "compressed": (good, {**WIRE, "Content-Encoding": "gzip"}, 415, "Content-Encoding"),
    }


@pytest.mark.parametrize("case", list(hostile()))
def test_hostile_plan_bodies_are_refused_and_queue_nothing(tmp_path: Path, case: str) -> None:
    body, headers, status, words = hostile()[case]

    async def run() -> None:
        async with sidecar(tmp_path) as (_, c):
            r = await c.api.put("/v1/plan", content=body, headers=headers)
            assert r.status_code == status and words in r.json()["error"], r.text
            assert (await c.api.get("/v1/plan")).json()["state"] == "idle"
            assert metric(await c.scrape(), "moe_runtime_plans_total", result="rejected") == 1

    asyncio.run(run())


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"prior": np.zeros((8, 4, 8)), "current": trivial_map(4, 8, 12)}, "num_layers"),
        ({"prior": np.zeros((8, 3, 4)), "current": trivial_map(3, 4, 8)}, "num_experts"),
        ({"num_redundant": 8, "current": trivial_map(3, 8, 16)}, "num_physical"),
        ({"num_gpus": 2}, "num_gpus"),
        ({"dispatch": "dynamic"}, "dispatch"),
    ],
)
def test_a_request_for_another_engine_shape_is_refused_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (_, c):
            r = await put(c, request(**changes))
            assert r.status_code == 422 and r.json()["error"].startswith(field + ":"), r.text
            assert (await c.api.get("/v1/plan")).json()["state"] == "idle"

    asyncio.run(run())


def test_the_route_reads_past_the_placement_cap_but_refuses_past_its_own_unread(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            # 64 buckets of [3, 800]: 1.2 MB, past the 1 MiB placements get, read and decoded whole
            big = request(
                keys=tuple(range(64)), prior=np.ones((64, 3, 800)), current=trivial_map(3, 800, 804)
            )
            body = plan_wire.encode(big)
            assert len(body) > 1 << 20
            r = await c.api.put("/v1/plan", content=body, headers=WIRE)
            assert r.status_code == 422 and r.json()["error"].startswith("num_experts:"), r.text

            # a declared size past the cap: 413 after a 64 kB of it, the rest never sent
            reader, writer = await asyncio.open_connection("127.0.0.1", side.ports["api"])
            head = (
                f"PUT /v1/plan HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: {plan_wire.MEDIA_TYPE}\r\nContent-Length: {64 << 20}\r\n\r\n"
            )
            writer.write(head.encode() + b"\0" * 65536)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(4096), timeout=10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
            assert b"exceeds the limit" in answer

            async def chunks() -> Any:  # no Content-Length: cut off once past the cap
                for _ in range(plan_wire.MAX_REQUEST_BYTES // (1 << 20) + 2):
                    yield b"\0" * (1 << 20)

            r = await c.api.put("/v1/plan", content=chunks(), headers=WIRE)
            assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]
            text = await c.scrape()
            assert metric(text, "moe_runtime_api_refused_total", reason="too_large") == 2
            assert (await c.api.get("/v1/plan")).json()["state"] == "idle"

    asyncio.run(run())


def test_the_runtime_plans_the_map_the_operators_own_call_gives_for_the_same_inputs(tmp_path: Path) -> None:
    recs = records()
    req = request()

    async def run() -> dict[str, Any]:
        async with sidecar(tmp_path) as (side, c):
            await with_windows(side, c, recs)
            r = await put(c, req)
            assert r.status_code == 202 and r.json() == {"request": "r-1", "state": "queued"}
            got = await settled(c, "r-1")
            assert (await c.api.get("/v1/plan")).json() == got  # the newest request by default
            text = await c.scrape()
            assert metric(text, "moe_runtime_plans_total", result="done") == 1
            assert metric(text, "moe_runtime_plan_seconds_count") == 1
            # a retried PUT of the same request plans nothing twice
            again = await put(c, req)
            assert again.status_code == 202 and again.json()["state"] == "done"
            assert metric(await c.scrape(), "moe_runtime_plans_total", result="done") == 1
            return got

    got = asyncio.run(run())
    assert got["state"] == "done" and got["newest_seq"] == 6 and got["message"] is None
    assert got["seconds"] is not None and got["seconds"] >= 0
    # the operator's path: the same windows on the same buckets, the same prior, steps and map
    own = own_history([(r.ended_at, r.counts) for r in recs], KEYS, BUCKET_S, (3, 8))
    want = plan_instances(
        {"i": own}, pool=req.prior, steps={"i": recs[-1].steps}, currents={"i": req.current},
        num_gpus=4, num_nodes=2, num_redundant=4, num_groups=1, dispatch="static", max_moves=6,
    )["i"]  # fmt: skip
    np.testing.assert_array_equal(np.asarray(got["physical_to_logical_map"]), want.physical_to_logical_map)
    assert want.moved_slots > 0  # the test plans something, not the current map back


def test_without_a_window_fresh_enough_the_plan_fails(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            assert (await put(c, request("early"))).status_code == 202
            early = await settled(c, "early")
            assert early["state"] == "failed" and early["message"].startswith("no fresh window")
            await with_windows(side, c, records())
            assert (await put(c, request("stale", fresh_after=60.5))).status_code == 202
            stale = await settled(c, "stale")
            assert stale["state"] == "failed" and "no fresh window" in stale["message"]
            assert stale["physical_to_logical_map"] is None
            assert metric(await c.scrape(), "moe_runtime_plans_total", result="failed") == 2

    asyncio.run(run())


def test_a_planner_error_fails_the_plan_with_a_short_message(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            await with_windows(side, c, records())
            # 3 groups do not divide 8 experts: the planner refuses, the peer reads why in a line
            assert (await put(c, request("odd", num_groups=3))).status_code == 202
            got = await settled(c, "odd")
            assert got["state"] == "failed" and got["message"].startswith("ValueError")
            assert "Traceback" not in got["message"] and len(got["message"]) <= planning.MESSAGE_CHARS

    asyncio.run(run())


def test_a_newer_request_replaces_a_queued_one_and_a_running_plan_keeps_its_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real = planning.plan_request

    def held(state: Any, req: PlanRequest) -> Any:
        if req.request == "a":
            release.wait(30)
        return real(state, req)

    monkeypatch.setattr(planning, "plan_request", held)

    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            await with_windows(side, c, records())
            assert (await put(c, request("a"))).status_code == 202

            async def planning_a() -> bool:
                return bool(
                    (await c.api.get("/v1/plan", params={"request": "a"})).json()["state"] == "planning"
                )

            await until(planning_a)
            assert (await put(c, request("b"))).json()["state"] == "queued"
            assert (await put(c, request("c", max_moves=2))).json()["state"] == "queued"
            b = (await c.api.get("/v1/plan", params={"request": "b"})).json()
            assert b["state"] == "failed" and b["message"] == "replaced by request c"
            newest = (await c.api.get("/v1/plan")).json()
            assert newest["request"] == "c" and newest["state"] == "queued"
            release.set()
            a, cc = await settled(c, "a"), await settled(c, "c")
            assert a["state"] == cc["state"] == "done"
            text = await c.scrape()
            assert metric(text, "moe_runtime_plans_total", result="replaced") == 1
            assert metric(text, "moe_runtime_plans_total", result="done") == 2
            r = await c.api.get("/v1/plan", params={"request": "gone"})
            assert r.status_code == 404
            r = await c.api.get("/v1/plan", params={"request": "a b"})
            assert r.status_code == 400

    asyncio.run(run())


def test_the_request_is_checked_against_the_layout_the_first_window_taught(tmp_path: Path) -> None:
    """A runtime started without the model's shape learns it from its first window."""
    from moe_runtime.sidecar.state import EngineLayout

    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            side.state.layout = EngineLayout(num_gpus=4, gpus_per_node=2, num_redundant=4)
            five = {"prior": np.zeros((8, 5, 8)), "current": trivial_map(5, 8, 12)}
            assert (await put(c, request("before", **five))).status_code == 202
            await with_windows(side, c, records())
            r = await put(c, request("after", **five))
            assert r.status_code == 422 and r.json()["error"].startswith("num_layers:")

    asyncio.run(run())


def test_the_operator_gets_the_runtimes_plan_and_decides_as_if_it_had_planned_itself(tmp_path: Path) -> None:
    """End to end over HTTP, with the operator's own code on both ends: it collects the windows,
    sends the plan request (control.instances.plan_requests), gathers the proposal
    (handlers.runtime_planning) and evaluates it: the same decision as its own plan."""
    from moe_operator.control.client import RuntimeClient
    from moe_operator.control.evaluate import Policy, PoolShape
    from moe_operator.control.instances import evaluate_instances, plan_requests
    from moe_operator.control.windows import History, parse_windows
    from moe_operator.handlers.runtime_planning import gather_proposals

    shape = PoolShape(3, 8, 4, 4, 2, 1, "static")
    policy = Policy("operator", 0.0, 6, 0.0, BUCKET_S)
    live = trivial_map(3, 8, 12)
    history = History()

    async def run() -> tuple[dict[str, Any], dict[str, str]]:
        async with sidecar(tmp_path) as (side, c):
            await with_windows(side, c, records())
            ip, port = "127.0.0.1", side.ports["api"]
            with RuntimeClient(tokens={ip: TOKEN}, port=port) as client:
                answer = await asyncio.to_thread(client.windows, ip, 0)
                history.add(parse_windows("leader-0/uid", answer, (3, 8), now=70.0))
                requests = plan_requests(
                    list(history.windows), {"leader-0": live}, shape, policy, 55.0, "v1-7"
                )
                leaders = [{"name": "leader-0", "ip": ip}]
                return await asyncio.to_thread(gather_proposals, client, leaders, requests, 60.0)

    proposals, missing = asyncio.run(run())
    assert missing == {} and list(proposals) == ["leader-0"]
    args = (list(history.windows), {"leader-0": live}, live, shape, policy, {"leader-0": None}, 55.0)
    theirs, ours = evaluate_instances(*args, proposals), evaluate_instances(*args)
    r, o = theirs.results["leader-0"], ours.results["leader-0"]
    np.testing.assert_array_equal(r.candidate, o.candidate)
    assert (r.predicted, r.moved, r.decision) == (o.predicted, o.moved, o.decision)
    assert r.moved > 0
