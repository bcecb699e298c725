"""The autoscaler end to end: real sandbox, real operator, one replay engine per instance leader.

The replay engines' latency and KV use follow their offered load (moe_runtime/replay/load.py);
the test plays the router: it spreads a total request rate over the instances
status.autoscaling lists as serving, and sends nothing to the others.
- A load step breaches the ITL SLO -> a second instance is created, listed once ready, and the
  SLO holds again; the load falls -> the second instance is taken off the list, finishes what it
  runs, and only then is its group removed: not while a replaced router pod, which still lists
  it, is terminating.
- Long prompts at a fixed rate fill the KV cache of two-node decode instances (each replay holds
  the KV tokens the operator's memory model gives that width) while their ITL is inside the SLO
  -> the pool is KV-bound, and a four-node instance, which holds more KV per GPU, is recommended;
  with widthChanges Apply the autoscaler runs it -> each instance leaves the router, finishes its
  requests and rolls onto four nodes, one at a time, and the KV pressure is gone.
- A person widens a pool with room for one more instance -> a wide instance serves before the
  narrow one leaves the router.
- A person widens a pool in a cluster with no nodes to spare -> no instance the router lists is
  restarted or deleted: the one released waits for nodes (WidthRollStuck) until the width is set back.
- A person changes the decode pool's arguments -> each instance leaves the router's list and
  finishes its requests before it restarts on the new pod template.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_contract.auth import instance_token
from moe_operator.api.spec import MoEDeploymentSpec
from moe_operator.validation.memory_rules import kv_tokens_at_width
from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, moed_path, runtime_credentials, start_replay

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SLO_ITL = 0.06


@dataclass
class Router:
    """Plays the router for one pool: a replay engine on each new leader, the load spread over the
    instances status lists as serving (nothing to the others)."""

    api: httpx.Client
    namespace: str
    name: str
    pool: str
    folder: Path
    replay: dict[str, Any]  # start_replay's engine arguments
    rate: float = 0.0
    replays: dict[str, tuple[str, subprocess.Popen[bytes]]] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)  # the leader pod each replay engine plays
    lost: dict[str, int] = field(default_factory=dict)  # requests an engine still ran when its group went
    timeline: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        wait_for(
            lambda: self.api.get(f"/api/v1/namespaces/{self.namespace}/secrets/{self.name}-runtime-token")
            .status_code == 200, 60, what="the runtime token Secret",
        )  # fmt: skip
        self.token_file, self.key = runtime_credentials(
            self.api, self.namespace, self.name, self.folder / "token"
        )
        self.start = time.monotonic()

    def status(self) -> dict[str, Any]:
        st = self.api.get(moed_path(self.namespace, self.name)).json().get("status") or {}
        out: dict[str, Any] = (st.get("autoscaling") or {}).get(self.pool) or {}
        return out

    def ip(self, instance: str) -> str:
        return self.replays[instance][0]

    def replay_state(self, instance: str) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"http://{self.ip(instance)}:9400/v1/replay", timeout=5).json()[
            "load"
        ]
        return body

    def play(self) -> dict[str, Any]:
        """Start a replay engine on each new leader; offer the load to the serving instances only."""
        selector = (
            f"moe.inference.dev/deployment={self.name},moe.inference.dev/pool={self.pool},"
            "apps.kubernetes.io/pod-index=0"
        )
        pods = self.api.get(f"/api/v1/namespaces/{self.namespace}/pods", params={"labelSelector": selector})
        for pod in pods.json()["items"]:
            ip, pod_name, uid = pod["status"].get("podIP"), pod["metadata"]["name"], pod["metadata"]["uid"]
            instance = pod_name.rsplit("-", 1)[0]
            if not ip or pod["metadata"].get("deletionTimestamp") or self.uids.get(instance) == uid:
                continue
            if instance in self.replays:  # the group was recreated (a roll): its engine restarts
                try:  # what the old engine still ran is lost (-1: it could not be asked)
                    state = self.replay_state(instance)
                    self.lost[instance] = self.lost.get(instance, 0) + state["running"] + state["queued"]
                except httpx.HTTPError:
                    self.lost[instance] = -1
                self.replays.pop(instance)[1].terminate()
            log = self.folder / f"{instance}-{uid[:8]}.log"
            proc = start_replay(ip, self.token_file, log, instance=instance, request_rate=0.0, **self.replay)
            self.replays[instance], self.uids[instance] = (ip, proc), uid
            time.sleep(1.0)
        st = self.status()
        listed = [i for i in range(int(st.get("serving") or 1)) if i != st.get("rollingInstance")]
        for instance, (ip, _) in self.replays.items():
            index = int(instance.rsplit("-", 1)[1])
            rate = self.rate / len(listed) if index in listed else 0.0
            auth = {"Authorization": f"Bearer {instance_token(self.key, instance)}"}
            with contextlib.suppress(httpx.HTTPError):  # not listening yet
                httpx.post(
                    f"http://{ip}:9400/v1/replay/load", json={"requestRate": rate}, headers=auth, timeout=5
                )
        self.timeline.append(
            f"t={time.monotonic() - self.start:5.1f}s rate={self.rate} instances={st.get('instances')} "
            f"serving={st.get('serving')} off={st.get('rollingInstance')} reason={st.get('reason')} "
            f"latency={st.get('latency')} "
            f"tokenUsage={st.get('tokenUsage')} wider={st.get('recommendedNodesPerReplica')} "
            f"said={str(st.get('message'))[:200]!r}"
        )
        return st

    def events(self) -> list[str]:
        items = self.api.get(f"/api/v1/namespaces/{self.namespace}/events").json()["items"]
        return [
            f"{e['reason']}: {e.get('message', '')}"
            for e in items
            if e["involvedObject"].get("name") == self.name
        ]

    def first_seen(self) -> dict[str, str]:
        """Event reason -> when it was first posted (RFC 3339, one-second resolution)."""
        items = self.api.get(f"/api/v1/namespaces/{self.namespace}/events").json()["items"]
        out: dict[str, str] = {}
        for e in items:
            if e["involvedObject"].get("name") == self.name:
                at = e.get("firstTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"]
                out[e["reason"]] = min(out.get(e["reason"], at), at)
        return out

    def stop(self) -> None:
        for _, proc in self.replays.values():
            proc.terminate()
        for _, proc in self.replays.values():
            proc.wait(timeout=10)


@dataclass
class RouterPods:
    """The router Deployment's pods; ``held`` keeps those running now terminating once replaced."""

    api: httpx.Client
    namespace: str
    name: str
    hold: str = "moe.test/old-router"
    held_names: list[str] = field(default_factory=list)

    def pods(self) -> list[dict[str, Any]]:
        selector = f"moe.inference.dev/deployment={self.name},app.kubernetes.io/component=router"
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        items: list[dict[str, Any]] = self.api.get(path, params={"labelSelector": selector}).json()["items"]
        return items

    def rolled(self, listing: str, terminating: bool = False) -> bool:
        """The Deployment lists ``listing``, its status says rolled out, and (``terminating``) the held
        pods are terminating, or (not) no pod is."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.name}-router"
        d = self.api.get(path).json()
        st = d.get("status") or {}
        listed = (d["metadata"].get("annotations") or {}).get("moe.inference.dev/router-workers")
        done = listed == listing and st.get("replicas") == st.get("updatedReplicas") == st.get(
            "readyReplicas"
        )
        leaving = {p["metadata"]["name"] for p in self.pods() if p["metadata"].get("deletionTimestamp")}
        return done and (leaving == set(self.held_names) if terminating else not leaving)

    def _finalizers(self, pod: str, finalizers: list[str]) -> None:
        self.api.patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{pod}",
            json={"metadata": {"finalizers": finalizers}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()

    @contextlib.contextmanager
    def held(self) -> Any:
        self.held_names = [p["metadata"]["name"] for p in self.pods()]
        for pod in self.held_names:
            self._finalizers(pod, [self.hold])
        try:
            yield
        finally:  # released whatever happened: a held pod would keep the namespace terminating
            for pod in self.held_names:
                with contextlib.suppress(httpx.HTTPStatusError):
                    self._finalizers(pod, [])


@contextlib.contextmanager
def playing(router: Router, moe_operator: OperatorProcess) -> Any:
    """The router while the test runs; on failure, what it saw, the events and the operator's log."""
    try:
        yield router
    except BaseException:
        print("\n".join(router.timeline[-60:]))
        print("\n".join(router.events()))
        print(moe_operator.tail())
        raise
    finally:
        router.stop()


def test_scale_out_on_breach_then_drain_and_scale_in(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    name = obj["metadata"]["name"]
    obj["spec"]["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    obj["spec"]["monitoring"] = {"podMonitor": False, "prometheusRule": False}
    obj["spec"]["decode"]["autoscaling"] = {
        "mode": "Operator", "minReplicas": 1, "maxReplicas": 2,
        "slo": {"itl": f"{int(SLO_ITL * 1000)}ms", "percentile": 90},
        "bootTime": "30s", "scaleOutCooldown": "10s", "scaleInCooldown": "30s", "scaleInWindow": "1m",
        "drainTimeout": "5m", "burstMemory": "1m",
    }  # fmt: skip
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    engine = {"model": "qwen3-30b-a3b", "gpus": 8, "gpus_per_node": 8, "redundant": 8, "role": "standalone"}
    router = Router(api, deployed, name, "decode", tmp_path, engine, rate=3.0)
    pods_path = f"/api/v1/namespaces/{deployed}/pods"
    selector = f"moe.inference.dev/deployment={name},apps.kubernetes.io/pod-index=0"
    with playing(router, moe_operator):
        # steady: 3 requests/s on one instance is well inside the SLO
        wait_for(lambda: router.play().get("reason") in ("steady", "cooldown") and router.play().get("latency"),
                 120, interval=1, what="the autoscaler measuring one steady instance")  # fmt: skip
        assert router.status()["instances"] == 1
        # a load step past one instance's capacity at the SLO: scale out, listed once ready, SLO holds
        router.rate = 9.0
        wait_for(lambda: router.play().get("serving") == 2, 120, interval=1, what="a second instance serving")
        assert any(e.startswith("ScalingOut") for e in router.events()) and any(
            e.startswith("ScaledOut") for e in router.events()
        )

        def itl_inside() -> bool:
            latency = router.play().get("latency") or {}
            return latency.get("itl") is not None and latency["itl"] <= SLO_ITL

        wait_for(itl_inside, 60, interval=1, what="the ITL SLO holding on two instances")
        # the router pods that run the list of two are held terminating once replaced (a finalizer;
        # kwok deletes no pod that has one), as a real router pod finishing its requests is
        routers = RouterPods(api, deployed, name)
        wait_for(lambda: routers.rolled("decode=2"), 60, interval=1, what="the router listing two instances")
        with routers.held():
            # load falls: the second instance is drained (off the router), then removed. 1 request/s,
            # well inside one instance: at 2 the noisy per-interval rate (up to 2.9) kept the need at
            # two instances for 240 s in one run of five
            router.rate = 1.0
            wait_for(lambda: router.play().get("reason") == "draining", 240, interval=1, what="a drain")
            assert router.status()["instances"] == 2 and router.status()["serving"] == 1
            wait_for(lambda: routers.rolled("decode=1", terminating=True), 60, interval=1,
                     what="the router rolled onto one instance, its old pods terminating")  # fmt: skip
            # 40 s of drain past the rollout, beyond the drain's 30 s minimum (2 s ticks): the
            # instance stays while the old router pods may still send to it. A drain the decision
            # cancels (a noisy interval) counts only its draining seconds.
            draining, until = 0, time.monotonic() + 150
            while draining < 40 and time.monotonic() < until:
                st = router.play()
                assert st.get("instances") == 2, "removed while an old router pod ran"
                draining += st.get("reason") == "draining"
                time.sleep(1)
            assert draining >= 40, f"the drain ran {draining} s of the hold: the hold showed nothing"
        # 300 s: a drain the decision cancels (a noisy interval on the one instance left) starts again
        # only after another scale-in window and cooldown (a CI run saw that, and 120 s fell short)
        wait_for(
            lambda: router.play().get("instances") == 1, 300, interval=1, what="the drained instance removed"
        )
        said = router.events()
        assert any(e.startswith("ScaledIn") for e in said), said
        assert not any(e.startswith("DrainTimedOut") for e in said), said
        leaving = router.replay_state(f"{name}-decode-1")
        assert leaving["running"] == 0 and leaving["queued"] == 0  # nothing was cut off
        assert all(router.replay_state(i)["dropped"] == 0 for i in router.replays)  # no request refused
        wait_for(
            lambda: len(api.get(pods_path, params={"labelSelector": selector}).json()["items"]) == 1,
            60, what="the second instance's pods gone",
        )  # fmt: skip


def _two_node_decode(**autoscaling: Any) -> tuple[dict[str, Any], int, int]:
    """The DeepSeek-V3 P/D example with one two-node decode instance, autoscaled up to two (plus
    ``autoscaling``); and the KV tokens the operator's memory model gives two and four nodes."""
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "deepseek-v3-pd-h100.yaml").read_text())
    spec = obj["spec"]
    spec["monitoring"] = {"podMonitor": False, "prometheusRule": False}
    spec["decode"].update(nodesPerReplica=2, replicas=1)
    spec["decode"]["autoscaling"] = {
        "mode": "Operator", "minReplicas": 1, "maxReplicas": 2,
        "slo": {"itl": f"{int(SLO_ITL * 1000)}ms", "percentile": 90},
        "bootTime": "30s", "scaleOutCooldown": "10s", "scaleInCooldown": "10m", "scaleInWindow": "10m",
        **autoscaling,
    }  # fmt: skip
    checked = MoEDeploymentSpec.model_validate(spec)
    return obj, kv_tokens_at_width(checked, "decode", 2), kv_tokens_at_width(checked, "decode", 4)


def _two_node_engine(kv_tokens: int) -> dict[str, Any]:
    """start_replay's arguments for a two-node decode instance's replay engine holding ``kv_tokens``."""
    return {
        "model": "deepseek-v3", "gpus": 16, "gpus_per_node": 8, "redundant": 32, "role": "decode",
        "flags": {"kv-tokens": kv_tokens},
    }  # fmt: skip


def test_kv_pressure_at_a_fixed_rate_is_kv_bound_and_a_wider_instance_replaces_each_narrow_one(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    obj, narrow, wide = _two_node_decode(nodesPerReplicaOptions=[4], widthChanges="Apply")
    name = obj["metadata"]["name"]
    assert wide > 2 * narrow > 0  # the premise: a wider instance holds more KV per GPU
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    # prompts of 16k tokens: about 90 requests fill a two-node instance's KV (the operator's memory
    # model at that width), where a batch decodes in ~30 ms: KV binds long before compute
    engine = {
        "model": "deepseek-v3", "gpus": 16, "gpus_per_node": 8, "redundant": 32, "role": "decode",
        "flags": {"kv-tokens": narrow, "prompt-tokens": 16384, "max-running": 512, "itl-per-request": 0.0001},
    }  # fmt: skip
    router = Router(api, deployed, name, "decode", tmp_path, engine, rate=55.0)
    with playing(router, moe_operator):
        wait_for(lambda: router.play().get("serving") == 2, 180, interval=1, what="a second instance serving")
        wait_for(
            lambda: router.play().get("recommendedNodesPerReplica") == 4, 180, interval=1,
            what="the pool KV-bound with a four-node instance recommended",
        )  # fmt: skip
        # widthChanges Apply: the autoscaler runs the pool at four nodes from now (the instances are
        # replaced one by one, each drained first); engines started from now hold four nodes' KV
        router.replay.update(gpus=32, flags={**engine["flags"], "kv-tokens": wide})
        router.timeline.append(f"t={time.monotonic() - router.start:5.1f}s --- four nodes chosen ---")
        st = router.status()
        assert (st.get("nodesPerReplica"), st.get("nodesPerReplicaFrom")) == (4, 2), st
        assert st["tokenUsage"] > 0.85 and st["instances"] == 2  # maxReplicas holds it at two
        latency = st.get("latency") or {}
        assert latency.get("itl") is not None and latency["itl"] <= SLO_ITL  # compute is not what binds
        states = [router.replay_state(instance) for instance in router.replays]
        assert all(s["kv_tokens"] == narrow and s["running"] < 512 and s["too_long"] == 0 for s in states), (
            states
        )
        assert any(s["queued"] > 0 for s in states), states  # requests wait for KV, not for a batch slot
        said = router.events()
        assert any(e.startswith("WiderInstanceRecommended") and "4 node" in e for e in said), said
        assert any(e.startswith("WidthChosen") and "running 4 node(s) per instance instead of 2" in e
                   for e in said), said  # fmt: skip

        # The instances roll onto four nodes one at a time (each keeps serving at two nodes until its
        # turn, then leaves the router's list and finishes its requests before its group goes:
        # maxReplicas leaves no room for a wide one first), each new engine holding the KV the memory
        # model gives that width; the KV pressure is gone and the curve restarts at 32 GPUs. The spec
        # still says two nodes: what a GitOps tool applied is not rewritten

        def wide_everywhere() -> bool:
            router.play()
            try:
                states = [router.replay_state(i) for i in sorted(router.replays)]
            except httpx.HTTPError:  # an engine just started
                return False
            return len(states) == 2 and all(s["kv_tokens"] == wide for s in states)

        wait_for(wide_everywhere, 420, interval=1, what="both instances rolled onto four nodes")

        def relieved() -> bool:
            st = router.play()
            usage = st.get("tokenUsage")
            # under load at the new width (a fresh engine reads 0), and far from full
            return st.get("recommendedNodesPerReplica") is None and usage is not None and 0.02 < usage < 0.5

        wait_for(relieved, 180, interval=1, what="the KV pressure gone at four nodes")
        router.timeline.append(f"t={time.monotonic() - router.start:5.1f}s --- relieved ---")
        assert json.loads(router.status()["model"])["gpus"] == 32
        assert router.status().get("nodesPerReplica") == 4
        assert api.get(moed_path(deployed, name)).json()["spec"]["decode"]["nodesPerReplica"] == 2
        said = router.events()
        assert sum("rolling from 2 to 4 nodes" in e for e in said) == 2, said
        assert not [e for e in said if "decode 0/2" in e], said  # never both down at once
        # each left the router's list and finished what it ran before its group went
        assert sum(e.startswith("WidthDraining") for e in said) == 2, said
        drained = [e for e in said if e.startswith("WidthDrained")]
        assert len(drained) == 2 and all("finished its requests" in e for e in drained), said
        assert sum(e.startswith("WidthRolled") for e in said) >= 1, said
        assert len(router.lost) == 2 and sum(router.lost.values()) == 0, router.lost


def test_a_width_change_with_room_serves_at_the_new_width_before_the_narrow_instance_drains(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    """One two-node decode instance, room for two: nodesPerReplica 2 -> 4 creates a four-node
    instance first, lists it once ready, and only then takes the two-node one off the router; that
    one finishes what it runs before its group rolls onto four nodes. The router never lists fewer
    instances than before, and no request an engine ran is lost."""
    obj, narrow, wide = _two_node_decode()
    name = obj["metadata"]["name"]
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    engine = _two_node_engine(narrow)
    router = Router(api, deployed, name, "decode", tmp_path, engine, rate=3.0)
    with playing(router, moe_operator):
        wait_for(lambda: router.play().get("reason") in ("steady", "cooldown") and router.play().get("latency"),
                 120, interval=1, what="the autoscaler measuring one steady instance")  # fmt: skip
        assert router.status()["instances"] == 1 and "ScalingOut" not in router.first_seen()
        merge = {"Content-Type": "application/merge-patch+json"}
        r = api.patch(
            moed_path(deployed, name), json={"spec": {"decode": {"nodesPerReplica": 4}}}, headers=merge
        )
        assert r.status_code == 200, r.text
        router.replay.update(gpus=32, flags={"kv-tokens": wide})
        router.timeline.append(f"t={time.monotonic() - router.start:5.1f}s --- nodesPerReplica 2 -> 4 ---")
        fewest = [1]

        def both_wide() -> bool:
            st = router.play()
            listed = [i for i in range(int(st.get("serving") or 1)) if i != st.get("rollingInstance")]
            fewest.append(len(listed))
            try:
                states = [router.replay_state(i) for i in sorted(router.replays)]
            except httpx.HTTPError:  # an engine just started
                return False
            wide_now = len(states) == 2 and all(s["kv_tokens"] == wide for s in states)
            return wide_now and st.get("serving") == 2 and st.get("rollingInstance") is None

        wait_for(both_wide, 360, interval=1, what="a four-node instance first, then the two-node one rolled")
        said, seen = router.events(), router.first_seen()
        steps = ("ScalingOut", "ScaledOut", "WidthDraining", "WidthDrained", "RollingOut", "WidthRolled")
        assert all(step in seen for step in steps), said
        times = [seen[step][:19] for step in steps]  # the wide instance serves before the narrow one drains
        assert times == sorted(times), list(zip(steps, times, strict=True))
        assert any("at the new width before" in e for e in said), said
        assert any(e.startswith("WidthDrained") and "finished its requests" in e for e in said), said
        assert min(fewest) >= 1 and sum("rolling from 2 to 4 nodes" in e for e in said) == 1, said
        assert router.lost == {f"{name}-decode-0": 0}, router.lost  # nothing running or queued when it went


def test_a_width_change_in_a_full_cluster_drains_each_instance_and_deletes_none_it_lists(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    """Eight nodes for the deployment (a label only they carry): prefill takes four, two two-node
    decode instances the other four, and maxReplicas leaves no room. nodesPerReplica 2 -> 4: the
    plan puts instance 0 onto its own and instance 1's nodes and has none for instance 1. Instance 1
    keeps its group and its leader, and stays listed, while instance 0 drains, is released and waits
    for nodes (WidthRollStuck, a Warning); setting the width back rolls instance 0 back, and nothing
    an engine ran was lost."""
    label, nodes = "moe.test/full-cluster", [f"h100-{i:03d}" for i in range(24, 32)]  # one rack
    obj, narrow, _ = _two_node_decode()
    name = obj["metadata"]["name"]
    obj["spec"]["decode"]["replicas"] = 2
    obj["spec"]["topology"]["nodeSelector"] = {label: deployed}
    merge = {"Content-Type": "application/merge-patch+json"}

    def mark(value: str | None) -> None:
        for node in nodes:
            body = {"metadata": {"labels": {label: value}}}
            assert api.patch(f"/api/v1/nodes/{node}", json=body, headers=merge).status_code == 200

    def busy() -> list[str]:
        pods = api.get("/api/v1/pods", params={"fieldSelector": "status.phase!=Succeeded"}).json()["items"]
        return [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") in nodes]

    wait_for(lambda: not busy(), 120, interval=2, what="the eight nodes free of earlier tests' pods")
    mark(deployed)
    engine = _two_node_engine(narrow)
    try:
        assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
        router = Router(api, deployed, name, "decode", tmp_path, engine, rate=3.0)
        first, second = f"{name}-decode-0", f"{name}-decode-1"
        with playing(router, moe_operator):
            wait_for(lambda: router.play().get("serving") == 2 and router.play().get("latency"), 180,
                     interval=1, what="two instances serving")  # fmt: skip
            leader = router.uids[second]

            def set_width(nodes: int, was: int) -> None:
                body = {"spec": {"decode": {"nodesPerReplica": nodes}}}
                r = api.patch(moed_path(deployed, name), json=body, headers=merge)
                assert r.status_code == 200, r.text
                now = time.monotonic() - router.start
                router.timeline.append(f"t={now:5.1f}s --- nodesPerReplica {was} -> {nodes} ---")

            set_width(4, was=2)

            def serving_on() -> None:
                pod = api.get(f"/api/v1/namespaces/{deployed}/pods/{second}-0").json()
                assert pod.get("metadata", {}).get("uid") == leader, "instance 1's leader went while listed"
                assert not pod["metadata"].get("deletionTimestamp"), (
                    "instance 1's leader deleted while listed"
                )

            def stuck() -> bool:
                st = router.play()
                serving_on()
                assert st.get("rollingInstance") in (None, 0), st  # instance 1 never leaves the list
                return any(e.startswith("WidthRollStuck") for e in router.events())

            wait_for(stuck, 240, interval=1, what="instance 0 released, then reported not coming up")
            said = router.events()
            assert any(e.startswith("WidthDrained") and "finished its requests" in e for e in said), said
            assert not any(e.startswith("GroupRestarting") and "instance 1" in e for e in said), said
            warnings = api.get(
                f"/api/v1/namespaces/{deployed}/events", params={"fieldSelector": "type=Warning"}
            ).json()["items"]
            assert any(e["reason"] == "WidthRollStuck" for e in warnings), [e["reason"] for e in warnings]
            # set back: instance 0 rolls back to two nodes and serves again beside instance 1
            set_width(2, was=4)

            def both_back() -> bool:
                st = router.play()
                serving_on()
                return st.get("serving") == 2 and st.get("rollingInstance") is None and first in router.lost

            wait_for(both_back, 180, interval=1, what="instance 0 back at two nodes and listed")
            assert router.lost == {first: 0}, router.lost  # drained before it went; instance 1 never went
    finally:
        mark(None)


def test_a_spec_change_drains_each_listed_instance_before_it_rolls(
    api: httpx.Client, deployed: str, moe_operator: OperatorProcess, tmp_path: Path
) -> None:
    """Two two-node decode instances serving, no room for a third (maxReplicas 2); a spec change
    other than the width (a decode argument: a new pod template at the same width). Each instance in
    turn leaves the router's list, finishes what it runs, and only then is restarted on the new
    template; the router always lists one, and no request an engine ran is lost."""
    obj, narrow, _ = _two_node_decode(minReplicas=2)
    name = obj["metadata"]["name"]
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    engine = _two_node_engine(narrow)
    router = Router(api, deployed, name, "decode", tmp_path, engine, rate=3.0)
    with playing(router, moe_operator):
        wait_for(lambda: router.play().get("serving") == 2 and router.play().get("latency"), 180,
                 interval=1, what="two instances serving")  # fmt: skip
        before = dict(router.uids)
        merge = {"Content-Type": "application/merge-patch+json"}
        body = {"spec": {"decode": {"extraArgs": ["--cuda-graph-max-bs-decode", "64"]}}}
        r = api.patch(moed_path(deployed, name), json=body, headers=merge)
        assert r.status_code == 200, r.text
        router.timeline.append(f"t={time.monotonic() - router.start:5.1f}s --- decode extraArgs changed ---")
        fewest = [2]

        def both_rolled() -> bool:
            st = router.play()
            fewest.append(
                len([i for i in range(int(st.get("serving") or 1)) if i != st.get("rollingInstance")])
            )
            renewed = all(router.uids.get(i) not in (None, uid) for i, uid in before.items())
            return renewed and st.get("serving") == 2 and st.get("rollingInstance") is None

        wait_for(both_rolled, 300, interval=1, what="both instances drained and rolled onto the new spec")
        said = router.events()
        assert sum(e.startswith("SpecDraining") for e in said) == 2, said
        drained = [e for e in said if e.startswith("SpecDrained")]
        assert len(drained) == 2 and all("finished its requests" in e for e in drained), said
        assert sum(e.startswith("RollingOut") and "decode instance" in e for e in said) == 2, said
        assert not any(e.startswith("GroupRestarting") and "decode" in e for e in said), said
        assert min(fewest) >= 1 and router.status().get("instances") == 2
        assert router.lost == {f"{name}-decode-0": 0, f"{name}-decode-1": 0}, router.lost
