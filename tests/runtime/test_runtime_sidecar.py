"""Sidecar HTTP API: probes, metrics and the token-protected API on their own listeners; load
windows from the plugin spool and (static mode) from SGLang's recorder dumps; placement pushes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiohttp import web
from rt_helpers import free_port, metric

from moe_placement.maps import trivial_map
from moe_runtime import exchange, recorder
from moe_runtime.sidecar.service import EngineCheck, RecorderSource, Sidecar, SidecarOptions
from moe_runtime.sidecar.state import EngineLayout

LAYOUT = EngineLayout(num_gpus=4, gpus_per_node=2, num_redundant=4, num_layers=3, num_experts=8, top_k=2)
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Clients:
    api: httpx.AsyncClient  # the API port, with the token
    bare: httpx.AsyncClient  # the API port, no token
    probes: httpx.AsyncClient
    metrics: httpx.AsyncClient

    async def scrape(self) -> str:
        return (await self.metrics.get("/metrics")).text


@asynccontextmanager
async def sidecar(tmp: Path, **kw: Any) -> AsyncIterator[tuple[Sidecar, Clients]]:
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    opts = SidecarOptions(
        host="127.0.0.1",
        port=0,
        probe_port=0,
        metrics_port=0,
        state_dir=tmp / "state",
        token_file=token,
        layout=LAYOUT,
        identity={"instance": "i-0", "role": "decode"},
        poll_s=0.05,
        health_s=0.05,
        **kw,
    )
    side = Sidecar(opts)
    await side.start()
    ports = side.ports
    url = "http://127.0.0.1:{}".format
    try:
        async with (
            httpx.AsyncClient(base_url=url(ports["api"]), headers=AUTH, timeout=10) as api,
            httpx.AsyncClient(base_url=url(ports["api"]), timeout=10) as bare,
            httpx.AsyncClient(base_url=url(ports["probes"]), timeout=10) as probes,
            httpx.AsyncClient(base_url=url(ports["metrics"]), timeout=10) as scrape,
        ):
            yield side, Clients(api, bare, probes, scrape)
    finally:
        await side.stop()


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def placement_body(version: int, m: np.ndarray | None = None) -> dict[str, Any]:
    if m is None:
        rng = np.random.default_rng(version)
        m = np.stack([rng.permutation(r) for r in trivial_map(3, 8, 12)])
    return {"version": version, "physical_to_logical_map": m.tolist()}


def test_push_requires_the_bearer_token(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (_, c):
            assert (await c.bare.put("/v1/placement", json=placement_body(1))).status_code == 401
            r = await c.bare.put(
                "/v1/placement", json=placement_body(1), headers={"Authorization": "Bearer nope"}
            )
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
            r = await c.bare.put("/v1/placement", json=placement_body(1), headers=AUTH)
            assert r.status_code == 200 and r.json()["result"] == "accepted"
            (tmp_path / "token").write_text("rotated")  # the Secret was updated in place
            assert (
                await c.bare.put("/v1/placement", json=placement_body(2), headers=AUTH)
            ).status_code == 401
            r = await c.bare.post(
                "/v1/placement", json=placement_body(2), headers={"Authorization": "Bearer rotated"}
            )
            assert r.status_code == 200
            (tmp_path / "token").unlink()
            r = await c.bare.put("/v1/placement", json=placement_body(3), headers=AUTH)
            assert r.status_code == 503 and "disabled" in r.json()["error"]
            metrics = await c.scrape()
            assert 'moe_runtime_placement_pushes_total{result="unauthorized"} 4.0' in metrics

    asyncio.run(run())


def test_push_validation_and_versions(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            drop = np.zeros((3, 12), dtype=np.int64)
            r = await c.bare.put("/v1/placement", json=placement_body(1, drop), headers=AUTH)
            assert r.status_code == 422 and "drops" in r.json()["error"]
            r = await c.bare.put("/v1/placement", json=placement_body(1, trivial_map(3, 8, 16)), headers=AUTH)
            assert r.status_code == 422 and "slots" in r.json()["error"]
            r = await c.bare.put("/v1/placement", json=placement_body(1, trivial_map(2, 8, 12)), headers=AUTH)
            assert r.status_code == 422 and "layers" in r.json()["error"]
            r = await c.bare.put("/v1/placement", content=b"not json", headers=AUTH)
            assert r.status_code == 400
            r = await c.bare.put("/v1/placement", json={"physical_to_logical_map": [[0]]}, headers=AUTH)
            assert r.status_code == 400 and "version" in r.json()["error"]

            assert (
                await c.bare.put("/v1/placement", json=placement_body(5), headers=AUTH)
            ).status_code == 200
            r = await c.bare.put("/v1/placement", json=placement_body(5), headers=AUTH)
            assert r.json()["result"] == "refreshed"
            assert (
                await c.bare.put("/v1/placement", json=placement_body(5, trivial_map(3, 8, 12)), headers=AUTH)
            ).status_code == 409
            assert (
                await c.bare.put("/v1/placement", json=placement_body(4), headers=AUTH)
            ).status_code == 409

            got = (await c.api.get("/v1/placement")).json()
            assert got["version"] == 5 and np.asarray(got["physical_to_logical_map"]).shape == (3, 12)
            # the plugin reads this file
            on_disk = exchange.load_placement(exchange.placement_path(side.opts.state_dir))
            assert on_disk.version == 5
            metrics = await c.scrape()
            assert "moe_runtime_placement_version 5.0" in metrics

    asyncio.run(run())


def test_windows_from_the_plugin_spool(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            base = side.opts.state_dir
            before = await c.scrape()
            # No window yet: no whole-placement gauge (a 0 would fire the imbalance alerts).
            assert metric(before, "moe_runtime_balancedness") is None
            assert metric(before, "moe_runtime_max_mean_ratio") is None
            counts = np.zeros((3, 8), dtype=np.int64)
            counts[1:] = [[40, 10, 10, 10, 10, 10, 5, 5], [20] * 8]
            for i in range(3):
                exchange.write_window(
                    base,
                    exchange.WindowRecord(
                        counts * (i + 1), 100, 10.0 * i, 10.0 * i + 10, {"num_gpus": 4, "num_physical": 12}
                    ),
                )

            async def three() -> bool:
                return bool((await c.api.get("/v1/status")).json()["windows"]["count"] == 3)

            await until(three)
            w = (await c.api.get("/v1/windows", params={"after": 1})).json()["windows"]
            assert [x["seq"] for x in w] == [2, 3]
            assert w[0]["passes"] == 100 and w[0]["counts"][1][0] == 80
            assert w[0]["tokens"] == 2 * 160 / 2  # busiest layer's assignments / top_k
            assert (await c.api.get("/v1/windows", params={"counts": "false"})).json()["windows"][0].get(
                "counts"
            ) is None
            assert (await c.api.get("/v1/windows/latest")).json()["seq"] == 3
            assert not list(exchange.spool_dir(base).iterdir())
            assert w[0]["step_samples"] == 0 and "steps" not in w[0]

            metrics = await c.scrape()
            assert "moe_runtime_windows_total 3.0" in metrics
            assert "moe_runtime_forward_passes_total 300.0" in metrics
            # uniform layer on the trivial map: experts 0-3 have two copies -> GPU loads 30, 50, 50, 30
            assert metric(metrics, "moe_runtime_layer_balancedness", layer="2") == pytest.approx(40 / 50)
            assert metric(metrics, "moe_runtime_layer_max_mean_ratio", layer="2") == pytest.approx(50 / 40)
            assert metric(metrics, "moe_runtime_layer_balancedness", layer="0") is None  # dense: no traffic
            assert metric(metrics, "moe_runtime_hottest_expert_fair_share_ratio") == pytest.approx(
                3.2
            )  # 40/100*8
            assert 'moe_runtime_placement_applied_source{source="trivial"} 1.0' in metrics
            assert metric(metrics, "moe_runtime_balancedness") is not None
            assert metric(metrics, "moe_runtime_max_mean_ratio_max") == pytest.approx(50 / 40)

            # the plugin applies a map: the sidecar re-scores the latest window with it
            assert metric(metrics, "moe_runtime_layer_balancedness", layer="1") == pytest.approx(25 / 30)
            good = trivial_map(3, 8, 12)
            good[1] = [
                0,
                7,
                1,
                6,
                2,
                5,
                3,
                4,
                0,
                0,
                0,
                0,
            ]  # expert 0 five times; static dispatch uses 3 copies
            exchange.write_applied(
                base, good, {"source": "operator", "version": 9, "applied_at": time.time()}
            )
            exchange.atomic_write_json(
                exchange.plugin_status_path(base),
                {
                    "decisions": {"operator": 1},
                    "errors": {"planner": 2, "steps": 1},
                    "windows": {"present": 3, "missing": 1},
                    "last": {"hook_seconds": 0.002},
                },
            )

            async def applied() -> bool:
                return "moe_runtime_placement_applied_version 9.0" in (await c.scrape())

            await until(applied)
            metrics = await c.scrape()
            assert 'moe_runtime_plugin_errors_total{stage="planner"} 2.0' in metrics
            assert 'moe_runtime_plugin_errors_total{stage="steps"} 1.0' in metrics
            assert 'moe_runtime_plugin_windows_total{step_samples="missing"} 1.0' in metrics
            assert 'moe_runtime_plugin_windows_total{step_samples="idle"} 0.0' in metrics
            assert 'moe_runtime_plugin_decisions_total{source="operator"} 1.0' in metrics
            assert "moe_runtime_plugin_hook_seconds 0.002" in metrics
            # GPU loads 35, 25, 30, 10 (x3): copies on GPUs 0, 2, 3 serve ranks 0+1, 2, 3
            assert metric(metrics, "moe_runtime_layer_balancedness", layer="1") == pytest.approx(25 / 35)

    asyncio.run(run())


def test_only_the_newest_window_keeps_its_step_samples_and_they_are_sent_when_asked(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            counts = np.zeros((3, 8), dtype=np.int64)
            counts[1:] = 40
            for i in range(2):
                steps = np.full((4, 3, 8), i + 1, dtype=np.int32)
                steps[:, 0] = 0
                exchange.write_window(
                    side.opts.state_dir,
                    exchange.WindowRecord(counts, 4, 10.0 * i, 10.0 * i + 10, {"num_gpus": 4}, steps=steps),
                )

            async def two() -> bool:
                return bool((await c.api.get("/v1/status")).json()["windows"]["count"] == 2)

            await until(two)
            plain = (await c.api.get("/v1/windows")).json()["windows"]
            assert [x["step_samples"] for x in plain] == [0, 4] and all("steps" not in x for x in plain)
            asked = (await c.api.get("/v1/windows", params={"steps": "true"})).json()["windows"]
            assert "steps" not in asked[0]
            sent = np.asarray(asked[1]["steps"])
            assert sent.shape == (4, 3, 8) and (sent[:, 1:] == 2).all() and (sent[:, 0] == 0).all()
            latest = (await c.api.get("/v1/windows/latest", params={"steps": "1"})).json()
            assert np.asarray(latest["steps"]).shape == (4, 3, 8)
            assert "steps" not in (await c.api.get("/v1/windows/latest")).json()

    asyncio.run(run())


def test_windows_are_binary_only_when_asked_and_read_by_the_operator_as_their_json(tmp_path: Path) -> None:
    """The runtime's own answer path (moe_contract.windows_wire) into the operator's client and
    parse_windows: the same windows, counts and step samples as from the JSON answer."""
    from moe_contract import windows_wire
    from moe_operator.control.client import RuntimeClient
    from moe_operator.control.windows import parse_windows

    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            rng = np.random.default_rng(11)
            for i in range(3):
                counts = rng.integers(2**24, 2**26, (3, 8))
                counts[0, i] = 2**33 + i  # past uint32: the encoder widens that window
                steps = rng.integers(0, 2**17, (5, 3, 8), dtype=np.int64) // 4 if i == 2 else None
                record = exchange.WindowRecord(
                    counts, 4, 10.0 * i, 10.0 * i + 10, {"num_gpus": 4}, steps=steps
                )
                exchange.write_window(side.opts.state_dir, record)

            async def three() -> bool:
                return bool((await c.api.get("/v1/status")).json()["windows"]["count"] == 3)

            await until(three)
            params = {"after": "0", "counts": "true", "steps": "true"}
            plain = await c.api.get("/v1/windows", params=params)
            assert plain.headers["Content-Type"].startswith("application/json")  # no Accept: JSON
            assert plain.headers["Vary"] == "Accept"
            for accept in ("application/json", "*/*", f"{windows_wire.MEDIA_TYPE};q=0"):
                r = await c.api.get("/v1/windows", params=params, headers={"Accept": accept})
                assert r.headers["Content-Type"].startswith("application/json"), accept
            binary = await c.api.get("/v1/windows", params=params, headers={"Accept": windows_wire.ACCEPT})
            assert binary.headers["Content-Type"] == windows_wire.MEDIA_TYPE
            assert len(binary.content) < len(plain.content)  # at 3 x 8 the header is half of it
            decoded = windows_wire.decode(binary.content)
            assert decoded["latest_seq"] == 3 and [w["seq"] for w in decoded["windows"]] == [1, 2, 3]
            assert [w["counts"].dtype.str for w in decoded["windows"]] == ["<u8"] * 3
            assert decoded["windows"][2]["steps"].dtype.str == "<u2"
            asked = {"Accept": windows_wire.MEDIA_TYPE}
            r = await c.api.get("/v1/windows", params={"after": "2", "counts": "false"}, headers=asked)
            bare = windows_wire.decode(r.content)["windows"]
            assert [w["seq"] for w in bare] == [3] and "counts" not in bare[0] and "steps" not in bare[0]

            ip, port = "127.0.0.1", side.ports["api"]
            with RuntimeClient(tokens={ip: TOKEN}, port=port) as client:
                answer = await asyncio.to_thread(client.windows, ip, 0)
            assert isinstance(answer["windows"][0]["counts"], np.ndarray)  # the operator asked for binary
            now = time.time()
            got = parse_windows("a", answer, (3, 8), now=now)
            want = parse_windows("a", plain.json(), (3, 8), now=now)
            assert [w.seq for w in got] == [w.seq for w in want] == [1, 2, 3]
            for g, w in zip(got, want, strict=True):
                assert g.ended_at == w.ended_at
                np.testing.assert_array_equal(g.counts, w.counts)
                assert (g.steps is None) == (w.steps is None)
            assert got[2].steps is not None and want[2].steps is not None
            np.testing.assert_array_equal(got[2].steps, want[2].steps)

    asyncio.run(run())


def test_windows_are_scored_off_the_event_loop_so_the_probes_keep_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring the placement on a window can take seconds (static dispatch at EP72: the first
    score of a new map). The probes share the event loop, so scoring must not run there: here it
    waits until the probe has answered, which it could not if it held the loop."""

    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            scoring, release = threading.Event(), threading.Event()
            waited: list[bool] = []
            real = side.state.evaluate

            def slow(counts: Any) -> Any:
                scoring.set()
                waited.append(release.wait(10))
                return real(counts)

            monkeypatch.setattr(side.state, "evaluate", slow)
            counts = np.full((3, 8), 10, dtype=np.int64)
            meta = {"num_gpus": 4, "num_physical": 12}
            exchange.write_window(side.opts.state_dir, exchange.WindowRecord(counts, 10, 0.0, 1.0, meta))

            async def started() -> bool:
                return scoring.is_set()

            await until(started)
            assert (await c.probes.get("/healthz")).status_code == 200
            assert (await c.probes.get("/readyz")).status_code == 200
            assert (await c.api.get("/v1/status")).status_code == 200
            release.set()

            async def scored() -> bool:
                return metric(await c.scrape(), "moe_runtime_balancedness") is not None

            await until(scored)
            assert waited == [True], "scoring held the event loop: the probes could not answer"

    asyncio.run(run())


def test_readiness_follows_engine_health_and_drain(tmp_path: Path) -> None:
    async def run() -> None:
        healthy = {"ok": False}

        async def health(request: web.Request) -> web.Response:
            return web.Response(status=200 if healthy["ok"] else 503)

        app = web.Application()
        app.router.add_get("/ready", health)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with sidecar(tmp_path, engine_check=EngineCheck(f"http://127.0.0.1:{port}/ready")) as (
                side,
                c,
            ):
                assert (await c.probes.get("/healthz")).status_code == 200

                async def status(code: int) -> Any:
                    async def check() -> bool:
                        return bool((await c.probes.get("/readyz")).status_code == code)

                    return check

                await until(await status(503))
                healthy["ok"] = True
                await until(await status(200))
                assert "moe_runtime_engine_ready 1.0" in (await c.scrape())
                side.set_draining()
                r = await c.probes.get("/readyz")
                assert r.status_code == 503 and r.json()["reason"] == "draining"
        finally:
            await runner.cleanup()

    asyncio.run(run())


def test_status_reports_identity_and_layout(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (_, c):
            st = (await c.api.get("/v1/status")).json()
            assert st["instance"] == "i-0" and st["role"] == "decode"
            assert st["layout"]["num_experts"] == 8 and st["placement"]["applied"]["source"] == "trivial"
            assert (await c.api.get("/v1/windows/latest")).status_code == 404

    asyncio.run(run())


def test_every_api_route_needs_the_token_and_probes_and_metrics_have_their_own_ports(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (_, c):
            for path in ("/v1/status", "/v1/windows", "/v1/windows/latest", "/v1/placement", "/v1/nope"):
                r = await c.bare.get(path)
                assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", path
                r = await c.bare.get(path, headers={"Authorization": "Bearer wrong"})
                assert r.status_code == 401, path
            assert (await c.api.get("/v1/status")).status_code == 200
            # the probe listener answers probes only, the metrics listener metrics only
            assert (await c.probes.get("/healthz")).status_code == 200
            for path in ("/metrics", "/v1/status", "/v1/windows"):
                assert (await c.probes.get(path)).status_code == 404, path
                assert (await c.probes.get(path, headers=AUTH)).status_code == 404, path
            assert (await c.metrics.get("/v1/status", headers=AUTH)).status_code == 404
            assert (await c.probes.put("/readyz", content=b"x")).status_code == 405
            text = await c.scrape()
            assert metric(text, "moe_runtime_api_refused_total", reason="unauthorized") == 10
            assert metric(text, "moe_runtime_listener_connections", listener="metrics") == 1
            # the API port has no probe or metrics route, with or without the token (as `launch` runs)
            for path in ("/healthz", "/readyz", "/metrics"):
                assert (await c.bare.get(path)).status_code == 401, path
                assert (await c.api.get(path)).status_code == 404, path
            # one request per connection: every answer closes it
            assert (await c.probes.get("/healthz")).headers["Connection"] == "close"

    asyncio.run(run())


def test_a_hung_engine_makes_the_pod_unready(tmp_path: Path) -> None:
    """A worker rank whose SGLang stops answering its placeholder /health (or never starts it)."""

    async def run() -> None:
        answering = asyncio.Event()

        async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await answering.wait()  # hung: the connection is accepted, no answer comes
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(engine, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        check = EngineCheck(f"http://127.0.0.1:{port}/health", timeout_s=0.3)
        try:
            async with sidecar(tmp_path, engine_check=check) as (_, c):

                async def ready(code: int) -> Any:
                    async def probe() -> bool:
                        return bool((await c.probes.get("/readyz")).status_code == code)

                    return probe

                async def hung() -> bool:
                    r = await c.probes.get("/readyz")
                    return r.status_code == 503 and "not answering" in r.json()["reason"]

                await until(hung)
                assert "/health" in (await c.probes.get("/readyz")).json()["reason"]
                answering.set()
                await until(await ready(200))
                answering.clear()  # hangs again
                await until(await ready(503))
        finally:
            answering.set()
            server.close()

    asyncio.run(run())


class FakeRecorderEngine:
    """SGLang's recorder endpoints as 0.5.23 answers them; dumps written like rank 0 does."""

    def __init__(self, directory: Path, shape: tuple[int, int, int]) -> None:
        self.directory = directory
        self.shape = shape
        self.calls: list[str] = []
        self.ready = True
        self.fail = False
        self.rng = np.random.default_rng(0)
        self.dumped: list[np.ndarray] = []

    def app(self) -> web.Application:
        async def ready(request: web.Request) -> web.Response:
            return web.Response(status=200 if self.ready else 503)

        async def start(request: web.Request) -> web.Response:
            self.calls.append(f"{request.method} start")
            return web.Response(text="Start recording the expert distribution.\n")

        async def dump(request: web.Request) -> web.Response:
            self.calls.append(f"{request.method} dump")
            if self.fail:
                return web.Response(status=500, text="Internal Server Error")
            counts = self.rng.integers(0, 50, self.shape).astype(np.int32)
            counts[-2:] = 0  # rows of passes not recorded yet
            counts[:, 0] = 0  # the dense layer
            recorder.write_dump(self.directory / recorder.dump_name(), counts)
            self.dumped.append(counts)
            return web.Response(text="Dump expert distribution record.\n")

        app = web.Application()
        app.router.add_get("/ready", ready)
        app.router.add_route("*", recorder.START_PATH, start)
        app.router.add_route("*", recorder.DUMP_PATH, dump)
        return app


async def scraped(c: Clients, name: str, at_least: float = 1, **labels: str) -> None:
    async def enough() -> bool:
        return (metric(await c.scrape(), name, **labels) or 0) >= at_least

    await until(enough)


def test_static_mode_takes_windows_from_the_recorder(tmp_path: Path) -> None:
    async def run() -> None:
        directory = tmp_path / "state" / "recorder"
        directory.mkdir(parents=True)
        (directory / recorder.dump_name(1.0)).write_bytes(b"an earlier run's leftover")
        fake = FakeRecorderEngine(directory, (6, 3, 8))
        runner = web.AppRunner(fake.app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        source = RecorderSource(url, directory, interval_s=0.05)
        try:
            async with sidecar(tmp_path, engine_check=EngineCheck(url + "/ready"), recorder=source) as (_, c):
                await scraped(c, "moe_runtime_windows_total", 2)
                assert fake.calls[0] == "POST start"  # recording turned on first, then dumps
                assert set(fake.calls[1:]) == {"POST dump"}
                got = (await c.api.get("/v1/windows")).json()["windows"]
                assert got[0]["counts"] == fake.dumped[0].sum(axis=0).tolist()
                assert got[0]["passes"] == 4  # rows that routed tokens
                assert got[0]["ended_at"] - got[0]["started_at"] < 5
                assert (await c.api.get("/v1/status")).json()["load_source"] == "recorder"
                assert len(list(directory.iterdir())) <= 1  # read files are removed (the leftover too)

                fake.fail = True  # SGLang answers 500: counted, then recording restarts
                await scraped(c, "moe_runtime_recorder_dumps_total", result="failed")
                fake.fail = False
                ok = metric(await c.scrape(), "moe_runtime_recorder_dumps_total", result="ok") or 0
                await scraped(c, "moe_runtime_recorder_dumps_total", ok + 2, result="ok")
                assert fake.calls.count("POST start") >= 2

                fake.shape = (6, 3, 9)  # a dump that does not fit the engine's layout is refused
                windows = metric(await c.scrape(), "moe_runtime_windows_total")
                await scraped(c, "moe_runtime_sidecar_errors_total", 2, stage="recorder")
                assert metric(await c.scrape(), "moe_runtime_windows_total") == windows
                fake.shape = (6, 3, 8)

                fake.ready = False  # an engine that is not ready is left alone

                async def unready() -> bool:
                    return (await c.probes.get("/readyz")).status_code == 503

                await until(unready)
                await asyncio.sleep(1.0)  # a dump begun before the engine turned unready finishes
                calls = len(fake.calls)
                await asyncio.sleep(0.5)
                assert len(fake.calls) == calls
        finally:
            await runner.cleanup()

    asyncio.run(run())


def test_a_malformed_plugin_status_reads_as_zeros_and_the_scrape_still_works(tmp_path: Path) -> None:
    """plugin-status.json is written in the engine container; nothing in it may fail /metrics."""
    from prometheus_client import CollectorRegistry, generate_latest

    from moe_runtime.sidecar.metrics import RuntimeMetrics
    from moe_runtime.sidecar.state import SidecarState

    state = SidecarState(tmp_path)
    metrics = RuntimeMetrics(state, CollectorRegistry())
    state.plugin_status = {
        "errors": "many",
        "decisions": {"operator": "3", "planner": float("nan"), "original": True},
        "windows": {"present": -4, "missing": 2},
        "last": [0.1],
    }
    text = generate_latest(metrics.registry).decode()
    assert 'moe_runtime_plugin_errors_total{stage="steps"} 0.0' in text
    assert 'moe_runtime_plugin_decisions_total{source="operator"} 0.0' in text
    assert 'moe_runtime_plugin_decisions_total{source="planner"} 0.0' in text
    assert 'moe_runtime_plugin_windows_total{step_samples="present"} 0.0' in text
    assert 'moe_runtime_plugin_windows_total{step_samples="missing"} 2.0' in text
    assert "moe_runtime_plugin_hook_seconds 0.0" in text


def test_the_plugins_own_status_document_is_read_back_as_written(tmp_path: Path) -> None:
    from moe_runtime import eplb_hook

    st = eplb_hook.HookState(eplb_hook.HookSettings(state_dir=tmp_path))
    st.decisions.update(operator=3, original=1)
    st.errors.update(steps=2)
    st.windows.update(present=5, idle=1)
    st.last = {"source": "operator", "version": 7, "reason": "operator placement v7", "at": time.time(),
               "hook_seconds": 0.002, "planner_seconds": 0.0}  # fmt: skip
    eplb_hook.write_status(st)
    doc = exchange.read_plugin_status(exchange.plugin_status_path(tmp_path))
    assert doc is not None
    assert doc["decisions"] == {"operator": 3, "original": 1} and doc["errors"] == {"steps": 2}
    assert doc["windows"] == {"present": 5, "idle": 1} and doc["last"] == st.last
    assert doc["pid"] > 0 and doc["dropped_writes"] == 0


def test_an_unknown_decision_source_is_dropped_and_the_counters_still_read() -> None:
    """A newer plugin (the engine image's runtime need not be the sidecar's) may name a source
    this sidecar does not know: refusing the whole status would freeze every counter."""
    doc = exchange.plugin_status_of({"decisions": {"operator": 2}, "last": {"source": "newer", "version": 3}})
    assert doc is not None
    assert doc["decisions"] == {"operator": 2} and doc["last"] == {"version": 3}


def _returns_within(fn: Any, seconds: float = 5.0) -> Any:
    """fn() run on a daemon thread; fails when it has not returned in ``seconds`` (a hang)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} blocked for {seconds} s"
    return out[0]


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return exc


def test_a_fifo_in_place_of_a_plugin_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """The engine container shares the state directory: a FIFO where a file belongs would block
    an ordinary open() forever, and with it the sidecar's one worker thread."""
    state = tmp_path / "state"
    spool = exchange.spool_dir(state)
    spool.mkdir(parents=True)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for path in (exchange.plugin_status_path(state), exchange.applied_path(state),
                 spool / "window-00000000000000000001-1.npz", dumps / recorder.dump_name(1.0)):  # fmt: skip
        os.mkfifo(path)
    assert _returns_within(lambda: exchange.read_plugin_status(exchange.plugin_status_path(state))) is None
    assert _returns_within(lambda: exchange.read_applied(state)) is None
    assert _returns_within(lambda: exchange.take_windows(state)) == []
    got = _returns_within(lambda: recorder.read_dump(dumps / recorder.dump_name(1.0)))
    assert isinstance(got, recorder.DumpError) and "not a regular file" in str(got)


def test_a_compressed_npz_that_inflates_past_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, counts=np.zeros(2_000_000, dtype=np.int64))  # 16 MB of arrays, ~16 kB on disk
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match="more than"), exchange.load_npz(path, limit=1 << 20):
        pass


HOSTILE_STATUS = {
    "an int past float's range": '{"windows": {"missing": ' + "9" * 401 + "}}",
    "NaN": '{"errors": {"planner": NaN}}',
    "Infinity in last": '{"last": {"hook_seconds": Infinity}}',
    "a string count": '{"decisions": {"operator": "3"}}',
    "a boolean count": '{"decisions": {"operator": true}}',
    "a negative count": '{"windows": {"present": -1}}',
    "a fraction as count": '{"errors": {"steps": 1.5}}',
    "a list as group": '{"errors": [1]}',
    "a list at the top": "[1, 2]",
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "not JSON": "{not json",
    "past the size cap": '{"last": {"reason": "' + "x" * exchange.STATUS_MAX_BYTES + '"}}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE_STATUS))
def test_a_malformed_plugin_status_is_refused_and_the_last_good_one_kept(tmp_path: Path, case: str) -> None:
    """plugin-status.json comes from the engine container: a version not as the plugin writes it
    is refused whole and counted, /metrics keeps the counters it had (none reads 0 for a while,
    which Prometheus would take for a reset), and windows are still ingested."""

    async def run() -> None:
        async with sidecar(tmp_path) as (_sc, c):
            path = exchange.plugin_status_path(tmp_path / "state")
            exchange.atomic_write_json(path, {"decisions": {"operator": 4}, "windows": {"missing": 2}})
            await scraped(c, "moe_runtime_plugin_decisions_total", 4, source="operator")
            path.write_text(HOSTILE_STATUS[case])
            await scraped(c, "moe_runtime_sidecar_errors_total", 1, stage="plugin-status")
            text = await c.scrape()
            assert metric(text, "moe_runtime_plugin_decisions_total", source="operator") == 4
            assert metric(text, "moe_runtime_plugin_windows_total", step_samples="missing") == 2
            assert (await c.api.get("/v1/status")).json()["plugin"]["decisions"] == {"operator": 4}
            exchange.write_window(
                tmp_path / "state", exchange.WindowRecord(np.ones((3, 8), np.int64), 1, 0.0, 1.0)
            )
            await until(lambda: _has_windows(c))

    asyncio.run(run())


def test_a_rewrite_of_the_same_size_and_mtime_is_read(tmp_path: Path) -> None:
    """A rewrite by rename of the same size whose mtime reads as before must not read as
    unchanged (exchange.file_key: the rename sets its change time)."""

    async def run() -> None:
        async with sidecar(tmp_path) as (_sc, c):
            path = exchange.plugin_status_path(tmp_path / "state")
            exchange.atomic_write_json(path, {"decisions": {"operator": 4}})
            await scraped(c, "moe_runtime_plugin_decisions_total", 4, source="operator")
            first = path.stat()
            exchange.atomic_write_json(path, {"decisions": {"operator": 5}})
            os.utime(path, ns=(first.st_atime_ns, first.st_mtime_ns))
            assert (path.stat().st_size, path.stat().st_mtime_ns) == (first.st_size, first.st_mtime_ns)
            await scraped(c, "moe_runtime_plugin_decisions_total", 5, source="operator")

    asyncio.run(run())


async def _has_windows(c: Clients) -> bool:
    return bool((await c.api.get("/v1/windows")).json()["windows"])
