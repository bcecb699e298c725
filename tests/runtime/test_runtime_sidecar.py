"""Sidecar HTTP API: health/readiness, load windows, placement pushes with auth, metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiohttp import web
from rt_helpers import free_port, metric

from moe_placement.maps import trivial_map
from moe_runtime import exchange
from moe_runtime.sidecar.service import Sidecar, SidecarOptions
from moe_runtime.sidecar.state import EngineLayout

LAYOUT = EngineLayout(num_gpus=4, gpus_per_node=2, num_redundant=4, num_layers=3, num_experts=8, top_k=2)
TOKEN = "s3cret"


@asynccontextmanager
async def sidecar(tmp: Path, **kw: Any) -> AsyncIterator[tuple[Sidecar, httpx.AsyncClient]]:
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    opts = SidecarOptions(
        host="127.0.0.1",
        port=free_port(),
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
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{opts.port}", timeout=10) as client:
            yield side, client
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


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_push_requires_the_bearer_token(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (_, c):
            assert (await c.put("/v1/placement", json=placement_body(1))).status_code == 401
            r = await c.put("/v1/placement", json=placement_body(1), headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
            r = await c.put("/v1/placement", json=placement_body(1), headers=AUTH)
            assert r.status_code == 200 and r.json()["result"] == "accepted"
            (tmp_path / "token").write_text("rotated")  # the Secret was updated in place
            assert (await c.put("/v1/placement", json=placement_body(2), headers=AUTH)).status_code == 401
            r = await c.post(
                "/v1/placement", json=placement_body(2), headers={"Authorization": "Bearer rotated"}
            )
            assert r.status_code == 200
            (tmp_path / "token").unlink()
            r = await c.put("/v1/placement", json=placement_body(3), headers=AUTH)
            assert r.status_code == 503 and "disabled" in r.json()["error"]
            metrics = (await c.get("/metrics")).text
            assert 'moe_runtime_placement_pushes_total{result="unauthorized"} 4.0' in metrics

    asyncio.run(run())


def test_push_validation_and_versions(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            drop = np.zeros((3, 12), dtype=np.int64)
            r = await c.put("/v1/placement", json=placement_body(1, drop), headers=AUTH)
            assert r.status_code == 422 and "drops" in r.json()["error"]
            r = await c.put("/v1/placement", json=placement_body(1, trivial_map(3, 8, 16)), headers=AUTH)
            assert r.status_code == 422 and "slots" in r.json()["error"]
            r = await c.put("/v1/placement", json=placement_body(1, trivial_map(2, 8, 12)), headers=AUTH)
            assert r.status_code == 422 and "layers" in r.json()["error"]
            r = await c.put("/v1/placement", content=b"not json", headers=AUTH)
            assert r.status_code == 400
            r = await c.put("/v1/placement", json={"physical_to_logical_map": [[0]]}, headers=AUTH)
            assert r.status_code == 400 and "version" in r.json()["error"]

            assert (await c.put("/v1/placement", json=placement_body(5), headers=AUTH)).status_code == 200
            r = await c.put("/v1/placement", json=placement_body(5), headers=AUTH)
            assert r.json()["result"] == "refreshed"
            assert (
                await c.put("/v1/placement", json=placement_body(5, trivial_map(3, 8, 12)), headers=AUTH)
            ).status_code == 409
            assert (await c.put("/v1/placement", json=placement_body(4), headers=AUTH)).status_code == 409

            got = (await c.get("/v1/placement")).json()
            assert got["version"] == 5 and np.asarray(got["physical_to_logical_map"]).shape == (3, 12)
            # the plugin reads this file
            on_disk = exchange.load_placement(exchange.placement_path(side.opts.state_dir))
            assert on_disk.version == 5
            metrics = (await c.get("/metrics")).text
            assert "moe_runtime_placement_version 5.0" in metrics

    asyncio.run(run())


def test_windows_from_the_plugin_spool(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (side, c):
            base = side.opts.state_dir
            before = (await c.get("/metrics")).text
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
                return bool((await c.get("/v1/status")).json()["windows"]["count"] == 3)

            await until(three)
            w = (await c.get("/v1/windows", params={"after": 1})).json()["windows"]
            assert [x["seq"] for x in w] == [2, 3]
            assert w[0]["passes"] == 100 and w[0]["counts"][1][0] == 80
            assert w[0]["tokens"] == 2 * 160 / 2  # busiest layer's assignments / top_k
            assert (await c.get("/v1/windows", params={"counts": "false"})).json()["windows"][0].get(
                "counts"
            ) is None
            assert (await c.get("/v1/windows/latest")).json()["seq"] == 3
            assert not list(exchange.spool_dir(base).iterdir())

            metrics = (await c.get("/metrics")).text
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
                {"decisions": {"operator": 1}, "errors": {"planner": 2}, "last": {"hook_seconds": 0.002}},
            )

            async def applied() -> bool:
                return "moe_runtime_placement_applied_version 9.0" in (await c.get("/metrics")).text

            await until(applied)
            metrics = (await c.get("/metrics")).text
            assert 'moe_runtime_plugin_errors_total{stage="planner"} 2.0' in metrics
            assert 'moe_runtime_plugin_decisions_total{source="operator"} 1.0' in metrics
            assert "moe_runtime_plugin_hook_seconds 0.002" in metrics
            # GPU loads 35, 25, 30, 10 (x3): copies on GPUs 0, 2, 3 serve ranks 0+1, 2, 3
            assert metric(metrics, "moe_runtime_layer_balancedness", layer="1") == pytest.approx(25 / 35)

    asyncio.run(run())


def test_readiness_follows_engine_health_and_drain(tmp_path: Path) -> None:
    async def run() -> None:
        healthy = {"ok": False}

        async def health(request: web.Request) -> web.Response:
            return web.Response(status=200 if healthy["ok"] else 503)

        app = web.Application()
        app.router.add_get("/health", health)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with sidecar(tmp_path, engine_health_url=f"http://127.0.0.1:{port}/health") as (side, c):
                assert (await c.get("/healthz")).status_code == 200

                async def status(code: int) -> Any:
                    async def check() -> bool:
                        return bool((await c.get("/readyz")).status_code == code)

                    return check

                await until(await status(503))
                healthy["ok"] = True
                await until(await status(200))
                assert "moe_runtime_engine_ready 1.0" in (await c.get("/metrics")).text
                side.set_draining()
                r = await c.get("/readyz")
                assert r.status_code == 503 and r.json()["reason"] == "draining"
        finally:
            await runner.cleanup()

    asyncio.run(run())


def test_status_reports_identity_and_layout(tmp_path: Path) -> None:
    async def run() -> None:
        async with sidecar(tmp_path) as (_, c):
            st = (await c.get("/v1/status")).json()
            assert st["instance"] == "i-0" and st["role"] == "decode"
            assert st["layout"]["num_experts"] == 8 and st["placement"]["applied"]["source"] == "trivial"
            assert (await c.get("/v1/windows/latest")).status_code == 404

    asyncio.run(run())
