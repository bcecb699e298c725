"""The control loop's shell in eplb mode operator, without a cluster: one evaluation per call of
evaluate_pool against an in-memory API and runtimes that keep the sidecar's version rules
(a lower version is refused, the same version only with the same map). The cluster test
(test_control_loop_e2e.py) runs the same loop against the real apiserver and replay runtimes."""

from __future__ import annotations

import base64
import json
import logging
import time
import types
from pathlib import Path
from typing import Any

import kopf
import numpy as np
import pytest
import yaml

from moe_contract.auth import instance_token
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.control.client import Pushed
from moe_operator.control.evaluate import PoolShape
from moe_operator.handlers import control_loop
from moe_operator.handlers.metrics import OperatorMetrics
from moe_operator.handlers.state import OperatorState, PoolState
from moe_operator.handlers.wakeups import Wakeups
from moe_operator.render.group import Owner, RuntimeSettings
from moe_operator.render.shared import token_secret
from moe_placement import document
from moe_placement.maps import trivial_map

REPO = Path(__file__).resolve().parents[2]
L, E, R, G = 4, 32, 8, 8
SHAPE = PoolShape(
    num_layers=L, num_experts=E, num_redundant=R, num_gpus=G, num_nodes=1, num_groups=1, dispatch="static"
)
REFRESH = 10.0
T0 = float(int(time.time()) - 3600)  # windows may not end in the future (parse_windows uses the clock)
KEY = bytes(range(32))  # the deployment's runtime key (moe_contract.auth)
NS, NAME, UID = "ns", "ds", "uid-1"
LIVE = f"/api/v1/namespaces/{NS}/configmaps/{NAME}-decode-placement"


class FakeKube:
    def __init__(self) -> None:
        rendered = token_secret(Owner(NAME, NS, UID), KEY)
        data = {k: base64.b64encode(v.encode()).decode() for k, v in rendered["stringData"].items()}
        self.objects: dict[str, dict[str, Any]] = {
            f"/api/v1/namespaces/{NS}/secrets/{NAME}-runtime-token": {**rendered, "data": data}
        }

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any] | None:
        return self.objects.get(path)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[f"/api/v1/namespaces/{NS}/configmaps/{obj['metadata']['name']}"] = obj
        return obj

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.objects.pop(f"/api/v1/namespaces/{namespace}/configmaps/{name}", None)


class Runtime:
    """One leader's sidecar: windows out, a held placement with the runtime's version rules."""

    def __init__(self, hot: list[int], seed: int) -> None:
        self.rng, self.hot, self.seq = np.random.default_rng(seed), hot, 0
        self.windows: list[dict[str, Any]] = []
        self.doc: dict[str, Any] | None = None
        self.up, self.silent = True, 0  # silent: evaluations to come without a new window

    def emit(self, now: float) -> None:
        if self.silent:
            self.silent -= 1
            return
        rates = np.full((L, E), 2000.0)  # windows of many tokens: little sampling noise
        rates[0], rates[1:, self.hot] = 0.0, 10000.0
        self.seq += 1
        self.windows.append({"seq": self.seq, "ended_at": now, "counts": self.rng.poisson(rates).tolist()})

    def push(self, doc: dict[str, Any]) -> Pushed:
        if self.doc is not None and doc["version"] < self.doc["version"]:
            return Pushed("http_409", "older")
        same = self.doc is not None and doc["version"] == self.doc["version"]
        if same and doc["physicalToLogicalMap"] != self.doc["physicalToLogicalMap"]:  # type: ignore[index]
            return Pushed("http_409", "same version, another map")
        self.doc = doc
        return Pushed("ok", None)

    @property
    def map(self) -> list[list[int]]:
        assert self.doc is not None
        return list(self.doc["physicalToLogicalMap"])


class FakeClient:
    runtimes: dict[str, Runtime] = {}

    def __init__(self, tokens: dict[str, str] | None = None) -> None:
        self.tokens = dict(tokens or {})
        self.has_token = bool(tokens)
        for ip, token in self.tokens.items():  # each runtime is called with its own instance's token
            assert token == instance_token(KEY, f"{NAME}-decode-{int(ip.rsplit('.', 1)[1])}"), ip

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def _up(self, ip: str) -> Runtime:
        rt = self.runtimes[ip]
        if not rt.up:
            raise control_loop.RuntimeAnswerError("ConnectError")
        return rt

    def windows(self, ip: str, after: int) -> dict[str, Any]:
        rt = self._up(ip)
        return {"windows": [w for w in rt.windows if w["seq"] > after], "latest_seq": rt.seq}

    def placement(self, ip: str) -> dict[str, Any]:
        doc = self._up(ip).doc
        if doc is None:
            return {"version": None}
        return {"version": doc["version"], "physical_to_logical_map": doc["physicalToLogicalMap"]}

    def push(self, ip: str, doc: dict[str, Any]) -> Pushed:
        try:
            return self._up(ip).push(doc)
        except control_loop.RuntimeAnswerError:
            return Pushed("unreachable", "ConnectError")

    def request_plan(self, ip: str, body: bytes) -> Pushed:
        """Runtimes from before runtime planning: the operator plans every instance itself."""
        try:
            self._up(ip)
        except control_loop.RuntimeAnswerError:
            return Pushed("unreachable", "ConnectError")
        return Pushed("http_404", "HTTP 404 Not Found")


class Loop:
    """The pool's evaluations, one refreshInterval apart, status carried between them."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, runtimes: dict[str, Runtime], mode: str = "operator"
    ) -> None:
        obj = yaml.safe_load((REPO / "examples" / "deepseek-v3-gb200.yaml").read_text())
        obj["spec"].pop("prefill", None)
        obj["spec"]["eplb"].update(
            refreshInterval="10s", minInterval="10s", minImprovement=0.05, history="5m", mode=mode
        )
        self.spec = MoEDeploymentSpec.model_validate(obj["spec"])
        self.kube = FakeKube()
        self.op = OperatorState(
            kube=self.kube,
            settings=RuntimeSettings(),
            metrics=OperatorMetrics(),
            wakeups=Wakeups(5.0),  # type: ignore[arg-type]
        )
        self.body = kopf.Body({"metadata": {"name": NAME, "namespace": NS, "uid": UID,
                                            "creationTimestamp": "2027-01-15T08:00:00Z"}})  # fmt: skip
        self.state, self.status, self.now = PoolState(), {}, T0
        self.runtimes, self.events = runtimes, []
        self.uids: dict[str, str] = {}  # leader pod -> uid (a recreated pod keeps its name)
        self.boots: dict[str, str] = {}  # leader pod -> the placement version it booted with (static)
        FakeClient.runtimes = {f"10.0.0.{i}": rt for i, rt in enumerate(runtimes.values())}
        monkeypatch.setattr(control_loop, "RuntimeClient", FakeClient)
        monkeypatch.setattr(kopf, "event", lambda *a, **kw: self.events.append(kw["message"]))

    def tick(self) -> dict[str, Any]:
        self.now += REFRESH
        for rt in self.runtimes.values():
            if rt.up:
                rt.emit(self.now - 1.0)
        leaders = [
            {
                "name": name,
                "uid": self.uids.get(name, "uid-0"),
                "ip": f"10.0.0.{i}",
                "pool": "decode",
                "instance": i,
            }
            for i, name in enumerate(self.runtimes)
        ]
        t = control_loop.Tick(
            self.op, self.body, self.spec, "decode", SHAPE, self.state, self.status, self.now
        )
        boots = {name: self.boots.get(name, "") for name in self.runtimes}
        out = control_loop.evaluate_pool(t, leaders, logging.getLogger("test"), boots)
        assert out is not None
        self.status = {**self.status, **out}
        if LIVE in self.kube.objects and self.spec.eplb.mode == "operator":  # none may lag the ConfigMap
            live = self.live()["version"]
            assert all(rt.doc and rt.doc["version"] >= live for rt in self.runtimes.values() if rt.up), out
        return out

    def live(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.kube.objects[LIVE]["data"]["placement.json"])
        return doc


@pytest.fixture()
def two(monkeypatch: pytest.MonkeyPatch) -> Loop:
    loop = Loop(
        monkeypatch, {"ds-decode-0-0": Runtime([0, 1, 2], 1), "ds-decode-1-0": Runtime([20, 21, 22], 2)}
    )
    loop.now = T0 - REFRESH  # the deployment was created one refresh before the first tick
    loop.body = kopf.Body({"metadata": {"name": NAME, "namespace": NS, "uid": UID,
                                        "creationTimestamp": control_loop._iso(T0 - 2 * REFRESH)}})  # fmt: skip
    return loop


def test_a_static_pool_publishes_again_only_after_it_rolled_onto_the_live_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mode static: each version is a drained roll of every instance. minInterval (10 s here) is
    shorter than any roll, so the hold is what keeps a pool from rolling without end."""
    loop = Loop(
        monkeypatch,
        {"ds-decode-0-0": Runtime([0, 1, 2], 1), "ds-decode-1-0": Runtime([0, 1, 2], 2)},
        "static",
    )
    loop.now = T0 - REFRESH
    loop.body = kopf.Body({"metadata": {"name": NAME, "namespace": NS, "uid": UID,
                                         "creationTimestamp": control_loop._iso(T0 - 2 * REFRESH)}})  # fmt: skip
    out = loop.tick()
    assert out.get("version") == 1 and "applied when groups restart" in out["message"], out["message"]
    assert all(rt.doc is None for rt in loop.runtimes.values())  # static: nothing pushed online
    for rt in loop.runtimes.values():
        rt.hot = [10, 11, 12]  # the load moves: a new map would gain
    loop.boots = {"ds-decode-0-0": "1"}  # instance 1 still boots the trivial map
    for _ in range(3):
        out = loop.tick()
        assert "version" not in out, out["message"]
        assert "1 of 2 instance(s) boot an older placement than v1: ds-decode-1-0" in out["message"], out
    loop.boots = {"ds-decode-0-0": "1", "ds-decode-1-0": "1"}
    meta = dict(loop.body["metadata"])
    loop.body = kopf.Body({"metadata": meta, "status": {"pools": {"decode": {"outdated": [1]}}}})
    out = loop.tick()  # every leader on v1, but the reconciler still rolls instance 1 (its pod replaced)
    assert "version" not in out and "instance(s) [1] run an older pod template" in out["message"], out
    loop.body = kopf.Body({"metadata": meta, "status": {"pools": {"decode": {"outdated": []}}}})
    out = loop.tick()  # the roll is over
    assert out.get("version") == 2, out["message"]
    # the hold compares with the version the reconciler renders (the status's): were the status's
    # version lost, the pods boot none, and this process's memory of v2 must not hold forever
    loop.status = {k: v for k, v in loop.status.items() if k != "version"}
    loop.boots = {}
    out = loop.tick()
    assert "older placement" not in out["message"], out["message"]


def test_the_timer_hands_the_hold_every_leader_pods_boot_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """control_timer's part: rank-0 pods of the pool, booting ones (no IP yet) too, none being deleted
    (the reconciler's outdated list covers an instance whose pod is replaced)."""
    obj = yaml.safe_load((REPO / "examples" / "deepseek-v3-gb200.yaml").read_text())
    obj["spec"].pop("prefill", None)
    obj["spec"]["eplb"]["mode"] = "static"
    op = OperatorState(
        kube=FakeKube(), settings=RuntimeSettings(), metrics=OperatorMetrics(), wakeups=Wakeups(5.0)
    )  # type: ignore[arg-type]
    body = kopf.Body(
        {"metadata": {"name": NAME, "namespace": NS, "uid": UID}, "spec": obj["spec"], "status": {}}
    )

    def pod(i: int, rank: int, boot: str, *, ip: bool = True, deleting: bool = False) -> dict[str, Any]:
        group = f"{NAME}-decode-{i}"
        return {"name": f"{group}-{rank}", "uid": f"p{i}{rank}", "pool": "decode", "instance": i, "rank": rank,
                "deleting": deleting, "ip": f"10.0.{i}.{rank}" if ip else None, "bootPlacement": boot,
                "owner": {"kind": "StatefulSet", "name": group, "uid": f"s{i}"}}  # fmt: skip

    pods = [pod(0, 0, "2"), pod(0, 1, "1"), pod(1, 0, "1", ip=False), pod(2, 0, "1", deleting=True)]
    groups = [{"kind": "StatefulSet", "name": f"{NAME}-decode-{i}", "uid": f"s{i}"} for i in range(3)]
    seen: list[tuple[list[str], dict[str, str]]] = []

    def evaluate_pool(t: Any, leaders: list[dict[str, Any]], logger: Any, boots: dict[str, str]) -> None:
        seen.append(([p["name"] for p in leaders], boots))

    monkeypatch.setattr(control_loop, "evaluate_pool", evaluate_pool)
    indexes = {
        "statefulset_index": {(NS, NAME): groups},
        "leaderworkerset_index": {},
        "engine_pod_index": {(NS, NAME): pods},
    }
    control_loop.control_timer(
        body=body,
        patch=kopf.Patch(),
        logger=logging.getLogger("t"),
        memo=types.SimpleNamespace(operator=op),
        **indexes,
    )  # type: ignore[arg-type]
    assert seen == [([f"{NAME}-decode-0-0"], {f"{NAME}-decode-0-0": "2", f"{NAME}-decode-1-0": "1"})]


def test_each_instance_is_pushed_its_own_map_under_the_pools_version(two: Loop) -> None:
    a, b = two.runtimes.values()
    out = two.tick()
    assert out["version"] == 1 and "new placement for 2 of 2" in out["message"], out["message"]
    assert a.doc and b.doc and a.doc["version"] == b.doc["version"] == two.live()["version"] == 1
    assert a.map != b.map, "different traffic, one map"
    live_cm = two.kube.objects[LIVE]
    prov = json.loads(live_cm["metadata"]["annotations"][K.PLACEMENT_PROVENANCE])
    assert set(prov["instances"]) == {"ds-decode-0-0", "ds-decode-1-0"}
    assert [r["name"] for r in out["instances"]] == ["ds-decode-0-0", "ds-decode-1-0"]
    assert all(r["version"] == 1 and r["predictedBalancedness"] > 0 for r in out["instances"])

    # the same traffic again: nothing worth moving; each keeps its map under v1 (re-pushed, fresh)
    kept = a.map, b.map
    out = two.tick()
    assert "version" not in out and "no instance gets a new placement" in out["message"], out["message"]
    assert (a.map, b.map) == kept and a.doc["version"] == b.doc["version"] == 1

    # b's traffic moves: b changes, a keeps its map but takes v2 (never below the live ConfigMap)
    b.hot = [5, 6, 7]
    for _ in range(3):
        out = two.tick()
        if out.get("version") == 2:
            break
    assert out.get("version") == 2 and "new placement for 1 of 2" in out["message"], out["message"]
    assert a.map == kept[0] and b.map != kept[1]
    assert a.doc["version"] == b.doc["version"] == two.live()["version"] == 2


def test_restarted_unreachable_and_rolled_back_instances(two: Loop) -> None:
    a, b = two.runtimes.values()
    two.tick()
    # b goes away: named unreachable, neither planned nor pushed; a goes on
    b.up = False
    out = two.tick()
    assert "unreachable: ds-decode-1-0" in out["message"], out["message"]
    # b comes back as a recreated pod (same name, new uid, nothing held, windows from 1): it runs
    # the live map, so it is pushed the pool's version at once, with the live ConfigMap's map
    restarted = Runtime([20, 21, 22], 3)
    restarted.silent = 1  # up, no window yet: not planned (it was quiet too long), but pushed
    two.runtimes["ds-decode-1-0"] = restarted
    two.uids["ds-decode-1-0"] = "uid-new"
    FakeClient.runtimes["10.0.0.1"] = restarted
    two.now += 2 * REFRESH  # b's last window before the restart is no longer fresh
    out = two.tick()
    live = two.live()
    assert "ds-decode-1-0:" not in out["message"], out["message"]
    assert restarted.doc is not None and restarted.doc["version"] == live["version"]
    assert restarted.map == live["physicalToLogicalMap"]
    out = two.tick()  # its first window: planned again, on its history from both pods
    keys = {w.instance for w in two.state.history.windows}
    assert {"ds-decode-1-0/uid-0", "ds-decode-1-0/uid-new"} <= keys, keys
    assert "ds-decode-1-0:" in out["message"], out["message"]
    assert [r["name"] for r in out["instances"]] == ["ds-decode-0-0", "ds-decode-1-0"]
    # a rollback (published outside the loop, paused) restores one map on every instance
    version = max(a.doc["version"], restarted.doc["version"]) + 1  # type: ignore[index]
    old = trivial_map(L, E, E + R)
    cm = two.kube.objects[LIVE]
    cm = {
        **cm,
        "data": {
            "placement.json": json.dumps(
                document.render(version, old, control_loop.datetime.fromtimestamp(two.now, control_loop.UTC))
            )
        },
    }
    cm["metadata"] = {
        **cm["metadata"],
        "annotations": {**cm["metadata"]["annotations"], K.PLACEMENT_PAUSED: "rollback of v1"},
    }
    two.kube.objects[LIVE] = cm
    out = two.tick()
    assert out["version"] == version and "paused" in out["message"], out["message"]
    for rt in (a, restarted):
        assert rt.doc is not None and rt.doc["version"] == version and rt.map == old.tolist()


@pytest.mark.parametrize("operator_restarted", [False, True])
def test_a_new_pool_shape_starts_the_placement_over_without_a_warning(
    two: Loop, operator_restarted: bool
) -> None:
    """spec.eplb.redundantExperts (or the width) changed: every map held so far has another number
    of slots. The pool plans afresh for the new shape under the next version, keeps its load
    history (it counts logical experts), and the earlier shape's live map is no fault; also when
    the operator restarted meanwhile (then the map is only read back from the live ConfigMap)."""
    a, b = two.runtimes.values()
    assert two.tick()["version"] == 1
    windows = len(two.state.history.windows)
    if operator_restarted:
        two.state, windows = PoolState(), 0
    spec = two.spec.model_dump(by_alias=True, exclude_none=True)
    spec["eplb"]["redundantExperts"] = 2 * R
    two.spec = MoEDeploymentSpec.model_validate(spec)
    shape = PoolShape(num_layers=L, num_experts=E, num_redundant=2 * R, num_gpus=G, num_nodes=1,
                      num_groups=1, dispatch="static")  # fmt: skip
    for name, i in (("ds-decode-0-0", 0), ("ds-decode-1-0", 1)):  # the groups rolled: new pods, nothing held
        fresh = Runtime(two.runtimes[name].hot, 10 + i)
        two.runtimes[name] = FakeClient.runtimes[f"10.0.0.{i}"] = fresh
        two.uids[name] = f"uid-rolled-{i}"
    global SHAPE
    old, SHAPE = SHAPE, shape
    try:
        out = two.tick()
    finally:
        SHAPE = old
    assert out.get("version") == 2, out["message"]
    assert "placement_error" not in out["message"] and "not a valid" not in out["message"], out["message"]
    live = two.live()["physicalToLogicalMap"]
    assert len(live[0]) == E + 2 * R
    for rt in two.runtimes.values():
        assert rt.doc is not None and rt.doc["version"] == 2 and len(rt.map[0]) == E + 2 * R
    assert len(two.state.history.windows) >= windows, "the load history was dropped"
    assert not [e for e in two.events if "not a valid placement" in e], two.events
    assert [e for e in two.events if "v1 was placed for another pool shape" in e], two.events
    assert a.doc is not None and b.doc is not None  # the rolled-away pods kept what they had


def test_a_new_version_of_another_shape_is_refused_not_noted(two: Loop) -> None:
    """Only a version the loop already knows passes as the earlier shape's: one written above it by
    hand, whatever its shape, is refused with a warning (and the failure metric) as before."""
    assert two.tick()["version"] == 1
    cm = two.kube.objects[LIVE]
    when = control_loop.datetime.fromtimestamp(two.now, control_loop.UTC)
    doc = document.render(99, trivial_map(L, E, E + 2 * R), when)
    two.kube.objects[LIVE] = {**cm, "data": {"placement.json": json.dumps(doc)}}
    for rt in two.runtimes.values():  # unreachable this time: only the ConfigMap is read
        rt.up = False
    two.tick()
    assert [e for e in two.events if "not a valid placement" in e], two.events
    assert not [e for e in two.events if "another pool shape" in e], two.events
