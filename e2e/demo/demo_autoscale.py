"""The demo's autoscaling step: a second deployment whose decode pool follows an ITL SLO.

Qwen3-30B-A3B (examples/qwen3-30b-a3b-single-node.yaml), one node per instance, with
`spec.decode.autoscaling.mode: Operator` between 1 and 2 instances. The demo plays the router
the way the autoscaler expects one to (the sandbox's router pods do not run): it spreads the
offered load over the instances `status.autoscaling.decode.serving` counts and sends the others
nothing, and starts a replay runtime on every new instance leader. A load step past one
instance's capacity at the SLO brings a second instance; once the load falls, the second one is
taken off the list, finishes what it runs, and only then is its group removed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import demo_procs as procs
import httpx
import yaml

from demo import REPO, SIDECAR_PORT, api, demo_dir, mark, say, trivial_doc, wait
from moe_contract.auth import DIGESTS_FILE, KEY_FIELD, instance_token

NAME = "qwen3-30b"
SLO_ITL_MS = 60
STEADY, STEP, FALL = 3.0, 8.0, 2.0  # requests/s offered to the pool (one instance saturates near 8)
SETTLE_S = 60  # how long the demo watches the SLO come back on two instances before the load falls


def spec() -> dict[str, Any]:
    """The single-node example on the demo's model volume, its decode pool scaled by the operator.

    Short boot time, cooldowns and scale-in window so the demo sees both steps in minutes (the
    defaults are minutes each; docs/autoscaling.md)."""
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    obj["spec"]["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    obj["spec"]["monitoring"] = {"podMonitor": False, "prometheusRule": False}
    obj["spec"]["decode"]["autoscaling"] = {
        "mode": "Operator", "minReplicas": 1, "maxReplicas": 2,
        "slo": {"itl": f"{SLO_ITL_MS}ms", "percentile": 90},
        "bootTime": "30s", "scaleOutCooldown": "10s", "scaleInCooldown": "30s", "scaleInWindow": "1m",
        "drainTimeout": "5m", "burstMemory": "1m",
    }  # fmt: skip
    return obj


class Router:
    """Offers ``rate`` requests/s to the serving instances; a replay runtime on each new leader."""

    def __init__(self, ns: str, folder: Path) -> None:
        self.ns, self.folder = ns, folder
        self.rate = STEADY
        self.replays: dict[str, str] = {}  # instance -> leader IP
        self.key = b""
        self.last = ""
        self.timeline: list[str] = []
        self.start = time.monotonic()

    def credentials(self, c: httpx.Client) -> None:
        """The Secret's digests for the runtimes (as a pod mounts them), its key for the load calls."""
        secret = c.get(f"/api/v1/namespaces/{self.ns}/secrets/{NAME}-runtime-token").json()
        (self.folder / "token").mkdir(parents=True, exist_ok=True)
        (self.folder / "token" / DIGESTS_FILE).write_bytes(base64.b64decode(secret["data"][DIGESTS_FILE]))
        self.key = bytes.fromhex(base64.b64decode(secret["data"][KEY_FIELD]).decode().strip())

    def status(self, c: httpx.Client) -> dict[str, Any]:
        obj = c.get(f"/apis/moe.inference.dev/v1alpha1/namespaces/{self.ns}/moedeployments/{NAME}").json()
        out: dict[str, Any] = ((obj.get("status") or {}).get("autoscaling") or {}).get("decode") or {}
        return out

    def tick(self) -> dict[str, Any]:
        with api() as c:
            sel = f"moe.inference.dev/deployment={NAME},apps.kubernetes.io/pod-index=0"
            for pod in c.get(f"/api/v1/namespaces/{self.ns}/pods", params={"labelSelector": sel}).json()[
                "items"
            ]:
                ip, instance = pod["status"].get("podIP"), pod["metadata"]["name"].rsplit("-", 1)[0]
                if ip and instance not in self.replays and not pod["metadata"].get("deletionTimestamp"):
                    self.launch(c, instance, ip)
            st = self.status(c)
        serving = int(st.get("serving") or 1)
        for instance, ip in self.replays.items():
            share = self.rate / serving if int(instance.rsplit("-", 1)[1]) < serving else 0.0
            auth = {"Authorization": f"Bearer {instance_token(self.key, instance)}"}
            with contextlib.suppress(httpx.HTTPError):  # not listening yet, or its group just went
                httpx.post(f"http://{ip}:{SIDECAR_PORT}/v1/replay/load", json={"requestRate": share},
                           headers=auth, timeout=5)  # fmt: skip
        latency = st.get("latency") or {}
        itl = f"{latency['itl'] * 1000:.0f} ms" if latency.get("itl") is not None else "-"
        line = (
            f"offered {self.rate:g} req/s; instances {st.get('instances')}, serving {st.get('serving')}, "
            f"p90 ITL {itl} (SLO {SLO_ITL_MS} ms); {st.get('reason', '-')}"
        )
        if line != self.last:
            stamped = f"t+{time.monotonic() - self.start:3.0f}s {line}"
            say(f"  {stamped}")
            self.timeline.append(stamped)
            self.last = line
        return st

    def launch(self, c: httpx.Client, instance: str, ip: str) -> None:
        cm = c.get(f"/api/v1/namespaces/{self.ns}/configmaps/{NAME}-decode-engine").json()
        cfg = json.loads(cm["data"]["engine.json"])
        rdir = self.folder / instance
        rdir.mkdir(parents=True, exist_ok=True)
        (rdir / "engine.json").write_text(json.dumps(cfg))
        (rdir / "placement-v0.json").write_text(json.dumps(trivial_doc(cfg)))
        argv = [
            sys.executable, "-m", "moe_runtime.cli", "replay", "--host", ip, "--port", str(SIDECAR_PORT),
            "--engine-config", str(rdir / "engine.json"), "--state-dir", str(rdir / "state"),
            "--token-file", str(self.folder / "token" / "token"), "--reads", "token",
            "--placement-file", str(rdir / "placement-v0.json"), "--planner", "off",
            "--instance", instance, "--request-rate", "0", "--pass-interval", "0.05", "--poll-interval", "0.5",
        ]  # fmt: skip
        pid = procs.start(f"replay-{instance}", argv, demo_dir() / "pids", rdir / "runtime.log")
        self.replays[instance] = ip
        say(f"  replay runtime for {instance} on {ip}:{SIDECAR_PORT} (pid {pid})")

    def dropped(self) -> dict[str, int]:
        """Requests each replay engine refused (queue full): the demo's count of failed requests."""
        out = {}
        for instance, ip in self.replays.items():
            auth = {"Authorization": f"Bearer {instance_token(self.key, instance)}"}
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                body = httpx.get(f"http://{ip}:{SIDECAR_PORT}/v1/replay", headers=auth, timeout=5).json()
                out[instance] = int(body["load"]["dropped"])
        return out


def events(ns: str) -> list[str]:
    with api() as c:
        items = c.get(f"/api/v1/namespaces/{ns}/events").json()["items"]
    scaling = ("ScalingOut", "ScaledOut", "ScaleOutRolledBack", "Draining", "DrainCancelled", "ScaledIn",
               "DrainTimedOut")  # fmt: skip
    mine = [e for e in items if e["involvedObject"].get("name") == NAME and e["reason"].startswith(scaling)]
    mine.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [f"{e['reason']}: {e.get('message', '')}" for e in mine]


def cmd_autoscale(args: argparse.Namespace) -> int:
    """Create the deployment, step its load up and down, and report both scaling steps."""
    folder = demo_dir() / "autoscale"
    path = f"/apis/moe.inference.dev/v1alpha1/namespaces/{args.namespace}/moedeployments"
    with api() as c:
        c.delete(f"{path}/{NAME}")  # one of an earlier run, if any
        wait("an earlier run's deployment gone", lambda: c.get(f"{path}/{NAME}").status_code == 404, 120)
        resp = c.post(path, json=spec())
        if resp.status_code != 201:
            raise SystemExit(f"demo: {NAME} refused: {resp.text}")
        secret = f"/api/v1/namespaces/{args.namespace}/secrets/{NAME}-runtime-token"
        wait("its runtime token Secret", lambda: c.get(secret).status_code == 200, 60)
        router = Router(args.namespace, folder)
        router.credentials(c)
    say(f"  {NAME}: decode between 1 and 2 instances of one node, p90 ITL SLO {SLO_ITL_MS} ms")
    mark("autoscale")

    def measured() -> bool:
        st = router.tick()
        return st.get("reason") in ("steady", "cooldown") and bool(st.get("latency"))

    wait("the autoscaler measuring one steady instance", measured, args.timeout, interval=2)
    router.rate = STEP
    say(f"  load step: {STEADY:g} -> {STEP:g} requests/s (one instance holds the SLO up to about 6)")
    wait("a second instance serving", lambda: router.tick().get("serving") == 2, args.timeout, interval=2)
    mark("scaled-out")

    def inside() -> bool:
        itl = (router.tick().get("latency") or {}).get("itl")
        return itl is not None and itl <= SLO_ITL_MS / 1000

    try:  # the step's backlog drains first, and the p90 is over the last minute or so
        wait("the ITL SLO holding on two instances", inside, SETTLE_S, interval=2)
        say("  the ITL SLO holds again on two instances")
    except SystemExit:
        say(
            f"  p90 ITL still above the SLO {SETTLE_S}s after the second instance served (a busy machine); going on"
        )
    router.rate = FALL
    say(f"  load falls: {STEP:g} -> {FALL:g} requests/s")
    wait(
        "the drained instance removed",
        lambda: router.tick().get("instances") == 1,
        2 * args.timeout,
        interval=2,
    )
    mark("scaled-in")
    said = events(args.namespace)
    for line in said:
        say(f"  event {line}")
    dropped = router.dropped()
    say(f"  requests refused by any replay engine: {sum(dropped.values())}")
    result = {"timeline": router.timeline, "events": said, "dropped": dropped}
    (demo_dir() / "autoscaling.json").write_text(json.dumps(result, indent=1))
    return 0
