"""eplb mode static on the sandbox, end to end: load windows from SGLang's recorder, a better
placement published by the control loop, rolled onto the instances one at a time.

Real sandbox, real operator, and per leader pod a replay runtime (the real sidecar over the
replay engine) on the pod's IP, started with the pool's engine ConfigMap. In static mode the
engine never rebalances (no --enable-eplb), so the windows come from the sidecar's dumps of the
recorder. The test plays the kubelet for the runtimes: a pod the reconciler replaces gets a new
runtime that boots with what the pod's `placement` volume holds when it starts (the ConfigMap it
names), as the launcher's --init-expert-location does with the mounted file. Nothing is pushed
online in this mode. The runtimes' API takes the token on every route,
reads included (`--reads token`, as `launch`), so the windows reach the control loop only
through the operator's authorized collector.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_contract.auth import instance_token
from moe_operator.api.keys import BOOT_PLACEMENT
from moe_sandbox.testing import wait_for
from operator_harness import moed_path, pod_instance, runtime_credentials

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NAME = "static-eplb"
REFRESH_S = 10
INSTANCE = "moe.inference.dev/instance"


def ready(obj: dict[str, Any]) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def pods(api: httpx.Client, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(
        f"/api/v1/namespaces/{namespace}/pods",
        params={"labelSelector": f"moe.inference.dev/deployment={NAME},{INSTANCE}"},
    ).json()["items"]
    return items


def pod_ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])


def scrape(ip: str, name: str) -> float | None:
    try:
        text = httpx.get(f"http://{ip}:9402/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else None


def settled(ips: list[str]) -> list[float] | None:
    """Each runtime's balancedness once it has scored 3 recorder windows and its latest one holds
    at least 50 passes (the first dump after boot may hold only a few: a noisy measure)."""
    out = []
    for ip in ips:
        windows, passes = scrape(ip, "moe_runtime_windows_total"), scrape(ip, "moe_runtime_window_passes")
        bal = scrape(ip, "moe_runtime_balancedness")
        if windows is None or windows < 3 or passes is None or passes < 50 or bal is None:
            return None
        out.append(bal)
    return out


class Kubelet:
    """Starts a replay runtime for every leader pod and stops it when the pod goes, like a pod's
    containers; a runtime boots with what its pod's placement volume holds at start."""

    def __init__(self, api: httpx.Client, namespace: str, tmp: Path) -> None:
        self.api, self.ns, self.tmp = api, namespace, tmp
        self.running: dict[str, tuple[subprocess.Popen[bytes], str, int | None]] = {}  # uid -> proc, ip, v
        cm = api.get(f"/api/v1/namespaces/{namespace}/configmaps/{NAME}-decode-engine").json()
        (tmp / "engine.json").write_text(cm["data"]["engine.json"])
        # What every engine pod mounts (the tokens' digests) and the key the operator derives them from.
        self.token_file, self.key = runtime_credentials(api, namespace, NAME, tmp / "token")
        self.instances: dict[str, str] = {}  # pod IP -> instance

    def auth(self, ip: str) -> dict[str, str]:
        """The header the operator sends to this runtime: its instance's own token."""
        return {"Authorization": f"Bearer {instance_token(self.key, self.instances[ip])}"}

    def placement_file(self, pod: dict[str, Any]) -> tuple[Path | None, int | None]:
        """What the pod's `placement` volume holds when it starts, as the kubelet mounts it (the
        ConfigMap the volume names; optional: none yet means SGLang boots the trivial map)."""
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "placement")
        name = volume["configMap"]["name"]
        r = self.api.get(f"/api/v1/namespaces/{self.ns}/configmaps/{name}")
        if r.status_code == 404 and volume["configMap"].get("optional"):
            return None, None
        r.raise_for_status()
        text = r.json()["data"]["placement.json"]
        out = self.tmp / f"{pod['metadata']['uid']}-placement.json"
        out.write_text(text)
        return out, int(json.loads(text)["version"])

    def sync(self, leaders: list[dict[str, Any]]) -> None:
        live = {p["metadata"]["uid"]: p for p in leaders if p["status"].get("podIP")}
        for uid in [u for u in self.running if u not in live]:
            proc, _, _ = self.running.pop(uid)
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
        for uid, p in live.items():
            if uid in self.running:
                continue
            ip, pod = p["status"]["podIP"], p["metadata"]["name"]
            self.instances[ip] = pod_instance(p)
            placement, version = self.placement_file(p)
            args = [
                sys.executable, "-m", "moe_runtime.cli", "replay", "--host", ip,
                "--engine-config", str(self.tmp / "engine.json"), "--state-dir", str(self.tmp / uid),
                "--token-file", str(self.token_file), "--instance", pod_instance(p),
                "--rebalance-iterations", "100", "--pass-interval", "0.01", "--tokens-per-pass", "1024",
                "--recorder-interval", "1", "--planner", "off", "--reads", "token",  # as `launch`
                *(["--placement-file", str(placement)] if placement else []),
            ]  # fmt: skip
            with (self.tmp / f"{pod}-{uid[:8]}.log").open("ab") as log:
                proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            self.running[uid] = (proc, ip, version)

    def ips(self) -> list[str]:
        return [ip for _, ip, _ in self.running.values()]

    def stop(self) -> None:
        self.sync([])


def test_static_mode_collects_recorder_windows_and_rolls_a_better_placement_one_instance_at_a_time(
    api: httpx.Client, deployed: str, tmp_path: Path
) -> None:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "deepseek-v3-gb200.yaml").read_text())
    obj["metadata"]["name"] = NAME
    obj["spec"].pop("prefill")
    # the claim the `deployed` fixture binds (a host path is not a volume tenants may use)
    obj["spec"]["model"]["volume"] = {"persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    obj["spec"]["decode"].update({"replicas": 2, "nodesPerReplica": 2, "attentionDataParallel": 8})
    obj["spec"]["eplb"].update(
        {"mode": "static", "redundantExperts": 8, "refreshInterval": f"{REFRESH_S}s",
         "minInterval": f"{REFRESH_S}s", "history": "2m", "minImprovement": 0.02}
    )  # fmt: skip
    assert api.post(moed_path(deployed), json=obj).status_code == 201, "spec refused"
    wait_for(lambda: ready(api.get(moed_path(deployed, NAME)).json()), 120, interval=0.5, what="Ready")
    before = {p["metadata"]["uid"] for p in pods(api, deployed)}
    assert len(before) == 4 and not any(
        BOOT_PLACEMENT in (p["metadata"].get("annotations") or {}) for p in pods(api, deployed)
    )

    def leaders() -> list[dict[str, Any]]:
        return [
            p
            for p in pods(api, deployed)
            if p["metadata"]["labels"].get("apps.kubernetes.io/pod-index") == "0"
        ]

    def placement() -> dict[str, Any]:
        st = api.get(moed_path(deployed, NAME)).json().get("status") or {}
        out: dict[str, Any] = (st.get("placement") or {}).get("decode") or {}
        return out

    kubelet = Kubelet(api, deployed, tmp_path)
    timeline: list[str] = []
    start = time.monotonic()

    def note(msg: str) -> None:
        timeline.append(f"t={time.monotonic() - start:5.1f}s {msg}")

    try:
        kubelet.sync(leaders())
        first = kubelet.ips()
        assert len(first) == 2

        # 1. windows arrive in static mode, from the recorder, with no rebalance in the engine
        trivial = wait_for(lambda: settled(first), 60, interval=0.5, what="recorder windows on both runtimes")
        for ip in first:
            assert httpx.get(f"http://{ip}:9400/v1/status", timeout=5).status_code == 401
            rep = httpx.get(f"http://{ip}:9400/v1/replay", headers=kubelet.auth(ip), timeout=5).json()
            assert rep["mode"] == "static" and rep["rebalances"] == 0 and rep["recorder"]["dumps"] >= 2
            status = httpx.get(f"http://{ip}:9400/v1/status", headers=kubelet.auth(ip), timeout=5).json()
            assert status["load_source"] == "recorder" and status["plugin"] == {}
        note(f"recorder windows on both runtimes; trivial placement balancedness {trivial}")

        # 2. the control loop publishes a placement from those windows, and 3. rolls it
        originals: dict[str, set[str]] = {}
        for p in pods(api, deployed):
            originals.setdefault(p["metadata"]["labels"][INSTANCE], set()).add(p["metadata"]["uid"])
        down_at: dict[str, float] = {}  # instance -> first poll that missed one of its old pods
        back_at: dict[str, float] = {}  # instance -> first poll with all its pods new, on the version, Ready
        serving_min, deadline, rolled_to = 2, time.monotonic() + 240, None
        while time.monotonic() < deadline:
            current = pods(api, deployed)
            polled = time.monotonic()
            kubelet.sync(
                [p for p in current if p["metadata"]["labels"].get("apps.kubernetes.io/pod-index") == "0"]
            )
            by_instance: dict[str, list[dict[str, Any]]] = {}
            for p in current:
                by_instance.setdefault(p["metadata"]["labels"][INSTANCE], []).append(p)
            serving = sum(1 for g in by_instance.values() if len(g) == 2 and all(pod_ready(p) for p in g))
            serving_min = min(serving_min, serving)
            version = int(placement().get("version") or 0)
            for inst, uids in originals.items():
                group = by_instance.get(inst, [])
                if inst not in down_at and not uids <= {p["metadata"]["uid"] for p in group}:
                    down_at[inst] = polled
                if inst in down_at and inst not in back_at and len(group) == 2 and version >= 1 and all(
                    pod_ready(p) and p["metadata"]["uid"] not in uids
                    and (p["metadata"].get("annotations") or {}).get(BOOT_PLACEMENT) == str(version)
                    for p in group
                ):  # fmt: skip
                    back_at[inst] = polled
            booted = sorted(
                (p["metadata"].get("annotations") or {}).get(BOOT_PLACEMENT) or "-" for p in current
            )
            line = f"status v{version}, pods boot {booted}, {serving} instance(s) serving"
            if not timeline or not timeline[-1].endswith(line):
                note(line)
            rolled = (
                version >= 1 and len(current) == 4 and booted == [str(version)] * 4
                and not {p["metadata"]["uid"] for p in current} & before
                and ready(api.get(moed_path(deployed, NAME)).json())
            )  # fmt: skip
            if rolled:
                rolled_to = version
                break
            time.sleep(0.2)
        assert rolled_to is not None, "the pods did not roll onto a published placement in 240s"
        assert serving_min >= 1, "both instances restarted at once"
        # one at a time: the second instance lost a pod only after the first was back, new and Ready
        first_down, second_down = sorted(down_at, key=down_at.__getitem__)
        assert down_at[second_down] >= back_at[first_down], (down_at, back_at)
        note(
            f"{first_down} down +{down_at[first_down] - start:.1f}s, back +{back_at[first_down] - start:.1f}s; "
            f"{second_down} down +{down_at[second_down] - start:.1f}s, back +{back_at[second_down] - start:.1f}s"
        )
        # published because it is better: the control loop's event for the version says by how much
        events = api.get(
            f"/api/v1/namespaces/{deployed}/events",
            params={"fieldSelector": f"involvedObject.name={NAME},reason=PlacementPublished"},
        ).json()["items"]
        published = [e["message"] for e in events if e["message"].startswith(f"decode v{rolled_to}:")]
        assert published, [e["message"] for e in events]
        m = re.search(r"measured ([0-9.]+), predicted ([0-9.]+) \(gain \+([0-9.]+)\)", published[0])
        assert m and float(m.group(2)) > float(m.group(1)) and float(m.group(3)) >= 0.02, published[0]
        assert "applied when groups restart" in published[0], published[0]
        note(f"event: {published[0]}")
        cm = api.get(f"/api/v1/namespaces/{deployed}/configmaps/{NAME}-decode-placement-v{rolled_to}")
        assert (
            cm.status_code == 200 and json.loads(cm.json()["data"]["placement.json"])["version"] == rolled_to
        )
        p = placement()
        assert p.get("predictedBalancedness") and p.get("measuredBalancedness") is not None, p
        assert "push" not in p.get("message", "").lower(), p  # static: delivered by rolling, not pushed

        # 4. the new runtimes boot with it and measure it better than the trivial one
        new = kubelet.ips()
        assert len(new) == 2
        assert [v for _, _, v in kubelet.running.values()] == [rolled_to] * 2, kubelet.running

        after = wait_for(lambda: settled(new), 60, interval=0.5, what="balancedness from the rolled runtimes")
        note(
            f"rolled to v{rolled_to}; balancedness {trivial} -> {after}; operator predicted {p['predictedBalancedness']}"
        )
        for ip in new:
            st = httpx.get(f"http://{ip}:9400/v1/status", headers=kubelet.auth(ip), timeout=5).json()
            assert st["placement"]["applied"]["source"] == "init", st["placement"]
            assert st["placement"]["applied"]["version"] == rolled_to, st["placement"]
            assert scrape(ip, 'moe_runtime_placement_pushes_total{result="accepted"}') in (None, 0.0)
        assert min(after) > max(trivial) + 0.03, (trivial, after)
    finally:
        kubelet.stop()
        print("\nstatic-mode timeline:\n" + "\n".join(timeline))
        print(json.dumps(placement(), indent=1)[:2000])
