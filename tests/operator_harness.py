"""Run the real operator (`moe-operator run`) as a subprocess against the test sandbox."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from moe_contract.auth import DIGESTS_FILE, KEY_FIELD, instance_token
from moe_operator.api import build_crd
from moe_operator.api import keys as K
from moe_sandbox.cluster import Sandbox, server_side_apply
from moe_sandbox.testing import wait_for

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
OPERATOR_USER = "moe-operator"
MOED = "/apis/moe.inference.dev/v1alpha1"
PEERING = "/apis/kopf.dev/v1/clusterkopfpeerings"
WEBHOOK_CONFIG = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/moe.inference.dev"
REPO = Path(__file__).resolve().parents[1]


def install_crd(box: Sandbox) -> None:
    crd = build_crd()
    with box.client() as api:
        server_side_apply(api, f"{CRD_PATH}/{crd['metadata']['name']}", crd, "moe-tests")

        def served() -> bool:
            return api.get(f"{MOED}/moedeployments").status_code == 200

        wait_for(served, 30, what="MoEDeployment CRD served")


# What the shipped examples need the platform to grant (policies/platform/examples.yaml), for the
# per-test namespaces (moe_sandbox.testing: t-*): node-local weights under /raid/models and host
# networking. The defaults refuse both; tests/api and tests/security check that.
EXAMPLE_GRANTS = ("--host-path-prefixes", "/raid/models", "--host-network-namespaces", "t-*")


class OperatorProcess:
    """One `moe-operator run` process; restartable and killable like a real pod."""

    def __init__(
        self,
        box: Sandbox,
        log_dir: Path,
        port_base: int | None = None,
        user: str = OPERATOR_USER,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if port_base is None:
            port_base = int(os.environ.get("MOE_TEST_OPERATOR_PORT_BASE", "19000"))
        self.box = box
        self.user = user
        self.extra_args = extra_args
        self.log_path = log_dir / f"{user}.log"
        self.metrics_port = port_base + 100
        self.liveness_port = port_base + 80
        self.webhook_port = port_base + 443
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Its own user, so the API server's audit log attributes every write (kopf's too) to it.
        kubeconfig = self.box.user_kubeconfig(self.user)
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
        env.setdefault("MOE_AUTOSCALE_INTERVAL_S", "2")  # the autoscaler's tick (30s in production)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "moe_operator.cli", "run",
                "--liveness", f"http://127.0.0.1:{self.liveness_port}/healthz",
                "--metrics-port", str(self.metrics_port),
                "--webhook-port", str(self.webhook_port),
                "--runtime-image", "moe-runtime:test", *self.extra_args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

        def live() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.tail()
            try:
                return (
                    httpx.get(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1).status_code == 200
                )
            except httpx.HTTPError:
                return False

        try:
            wait_for(live, 60, what="operator liveness")
            if "--no-webhook" not in self.extra_args:
                wait_for(self.webhook_refusing, 60, what="the validating webhook called by the apiserver")
        except BaseException:
            self.stop(signal.SIGKILL)  # a start that failed leaves no process holding the ports
            raise

    def webhook_refusing(self) -> bool:
        """The apiserver calls this process's webhook: it refuses a dry-run spec only it refuses.

        Registered is not enough: kopf creates the configuration before it fills in the webhook,
        a stopped operator leaves it empty, and failurePolicy Ignore admits everything meanwhile.
        """
        with self.box.client() as api:
            config = api.get(WEBHOOK_CONFIG)
            hooks = (config.json().get("webhooks") or []) if config.status_code == 200 else []
            if not any(f":{self.webhook_port}/" in (h["clientConfig"].get("url") or "") for h in hooks):
                return False
            probe = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
            probe["metadata"] = {"name": "webhook-probe"}
            probe["spec"]["decode"]["extraArgs"] = ["--cuda-graph-max-bs", "128"]  # ambiguous: webhook only
            resp = api.post(moed_path("default"), json=probe, params={"dryRun": "All"})
            message = resp.json().get("message", "") if resp.status_code == 422 else ""
            return 'admission webhook "validate.moe.inference.dev"' in message

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def api_requests(self) -> dict[str, float]:
        """The operator's own count of API requests by verb (from its /metrics)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        out: dict[str, float] = {}
        for m in re.finditer(r'^moe_operator_api_requests_total\{verb="(\w+)"\} ([0-9.e+]+)$', text, re.M):
            out[m.group(1)] = float(m.group(2))
        return out

    def writes(self) -> float:
        """Writes counted by the operator's own client (kopf's own patches and events not included)."""
        return sum(v for verb, v in self.api_requests().items() if verb != "get")

    def audited_writes(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Every write the API server served to the operator's user since ``since`` (epoch seconds),
        from its audit log: the rotated file too when it was written after ``since`` (the log
        rotates at 100 MB and outlives a test session on a reused machine)."""
        logs = sorted(
            (p for p in self.box.audit_log.parent.glob("audit*.log") if p.stat().st_mtime >= since),
            key=lambda p: p.stat().st_mtime,
        )
        events = []
        for path in logs:
            with open(path) as log:
                for line in log:
                    if OPERATOR_USER not in line:  # cheap pre-filter: the file holds every user's writes
                        continue
                    event = json.loads(line)
                    if (
                        event.get("stage") == "ResponseComplete"
                        and event["user"]["username"] == OPERATOR_USER
                        and datetime.fromisoformat(event["stageTimestamp"]).timestamp() >= since
                    ):
                        events.append(event)
        return events

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def bind_model_volume(api: httpx.Client, namespace: str, claim: str) -> None:
    """A statically bound PV + PVC, so pods that mount model weights can be scheduled."""
    pv_name = f"{namespace}-{claim}"
    pv: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "2Ti"},
            "accessModes": ["ReadOnlyMany", "ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": "/tmp/moe-models"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    api.post("/api/v1/persistentvolumes", json=pv)
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Ti"}},
        },
    }
    api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", json=pvc)
    wait_for(
        lambda: (
            api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
            .json()["status"]
            .get("phase")
            == "Bound"
        ),
        30,
        what=f"PVC {claim} bound",
    )


def remove_peering(api: httpx.Client) -> None:
    """Delete kopf's peering CRDs (and the object): the session operator runs without peering, and
    with the CRD served but no object it patches the missing record every few seconds (404
    writes the idle-operator test counts). Helm and the RBAC manifests install them; neither
    uninstall removes CRDs. Only while no operator runs: kopf stops when a CRD it watches goes."""
    api.delete(f"{PEERING}/moe-operator")
    for crd in yaml.safe_load_all((REPO / "crds" / "kopf.dev-peerings.yaml").read_text()):
        api.delete(f"{CRD_PATH}/{crd['metadata']['name']}")
    wait_for(lambda: api.get(PEERING).status_code == 404, 60, what="peering CRD gone")


def moed_path(namespace: str, name: str = "") -> str:
    """REST path of a namespace's MoEDeployments, or of one."""
    return f"{MOED}/namespaces/{namespace}/moedeployments" + (f"/{name}" if name else "")


def replace_fresh(
    api: httpx.Client,
    path: str,
    mutate: Callable[[dict[str, Any]], None],
    params: dict[str, str] | None = None,
    tries: int = 10,
) -> httpx.Response:
    """GET, mutate, PUT; again on 409: the operator writes finalizers and status between a test's
    read and its write, and a lost race is not the answer the test is asking about."""
    for _ in range(tries):
        current = api.get(path).json()
        mutate(current)
        resp = api.put(path, json=current, params=params)
        if resp.status_code != 409 or "the object has been modified" not in resp.text:
            return resp
    return resp


def runtime_credentials(api: httpx.Client, namespace: str, name: str, dest: Path) -> tuple[Path, bytes]:
    """What an engine pod mounts from the deployment's runtime Secret (dest/digests.json only) and
    the key the operator derives instance tokens from. Returns the token file path a runtime is
    given (it does not exist: the runtime checks tokens against the digests beside it) and the key."""
    secret = api.get(f"/api/v1/namespaces/{namespace}/secrets/{name}-runtime-token").json()
    dest.mkdir(parents=True, exist_ok=True)
    (dest / DIGESTS_FILE).write_bytes(base64.b64decode(secret["data"][DIGESTS_FILE]))
    key = bytes.fromhex(base64.b64decode(secret["data"][KEY_FIELD]).decode())
    return dest / "token", key


def pod_instance(pod: dict[str, Any]) -> str:
    """The instance an engine pod belongs to (its MOE_INSTANCE), from its labels."""
    labels = pod["metadata"]["labels"]
    return f"{labels[K.DEPLOYMENT]}-{labels[K.POOL]}-{labels[K.INSTANCE]}"


def auth_for(key: bytes, pod: dict[str, Any]) -> dict[str, str]:
    """The Authorization header the operator sends to this pod's runtime."""
    return {"Authorization": f"Bearer {instance_token(key, pod_instance(pod))}"}


def start_replay(
    ip: str,
    token_file: Path,
    log: Path,
    *,
    instance: str,
    model: str,
    gpus: int,
    gpus_per_node: int,
    redundant: int,
    role: str = "decode",
    request_rate: float = 2.0,
    flags: dict[str, int] | None = None,
) -> subprocess.Popen[bytes]:
    """A replay runtime (the real sidecar API over a simulated engine) on a leader pod's IP, port 9400,
    checking tokens as the pod of ``instance`` does; SGLang's /metrics on the engine port (30000).
    ``flags``: more replay flags, e.g. {"kv-tokens": 3440528, "prompt-tokens": 98304}."""
    args = [
        sys.executable, "-m", "moe_runtime.cli", "replay", "--host", ip, "--port", "9400",
        "--model", model, "--gpus", str(gpus), "--gpus-per-node", str(gpus_per_node),
        "--redundant", str(redundant), "--rebalance-iterations", "40", "--pass-interval", "0.01",
        "--tokens-per-pass", "1024", "--planner", "off", "--token-file", str(token_file), "--role", role,
        "--instance", instance, "--request-rate", str(request_rate),
    ]  # fmt: skip
    for flag, value in (flags or {}).items():
        args += [f"--{flag}", str(value)]
    return subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT)
