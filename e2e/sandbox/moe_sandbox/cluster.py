"""Start and stop the sandbox: etcd, kube-apiserver, controller-manager, scheduler and kwok.

Every process runs as a local child in its own session with its pid recorded under the
state directory, and every command line names that directory, so `down` can find and
stop all of them even when a pid file was lost (Ctrl-C during `up`, a crashed test run).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from moe_operator.topology import nodepools
from moe_sandbox import toolchain
from moe_sandbox.paths import state_dir
from moe_sandbox.pki import Pki, ensure_pki

Log = Callable[[str], None]

COMPONENT_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Started on demand (moe_sandbox.leaderworkerset), stopped by `down` like the rest.
ADDONS = ("lws-controller",)


@dataclass(frozen=True)
class Ports:
    """Loopback ports of the sandbox; MOE_SANDBOX_PORT_BASE shifts them all (two sandboxes side by side)."""

    base: int = 16000

    @property
    def etcd(self) -> int:
        return self.base + 379

    @property
    def etcd_peer(self) -> int:
        return self.base + 380

    @property
    def apiserver(self) -> int:
        return self.base + 443

    @property
    def controller_manager(self) -> int:
        return self.base + 257

    @property
    def scheduler(self) -> int:
        return self.base + 259

    @property
    def kwok(self) -> int:
        return self.base + 247

    @property
    def lws_webhook(self) -> int:
        return self.base + 445

    @property
    def lws_health(self) -> int:
        return self.base + 446

    def all(self) -> dict[str, int]:
        return {
            "etcd": self.etcd,
            "etcd-peer": self.etcd_peer,
            "kube-apiserver": self.apiserver,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kwok": self.kwok,
            "lws-webhook": self.lws_webhook,
            "lws-health": self.lws_health,
        }


class SandboxError(RuntimeError):
    """The sandbox could not be brought up; the message says which component and where its log is."""


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Sandbox:
    """A local control plane rooted at one state directory."""

    def __init__(self, directory: Path | None = None, ports: Ports | None = None) -> None:
        self.dir = (directory or state_dir()).resolve()
        self.ports = ports or Ports(int(os.environ.get("MOE_SANDBOX_PORT_BASE", "16000")))
        self.pki = Pki(self.dir / "pki")

    # ---- paths -------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def _pidfile(self, name: str) -> Path:
        return self.dir / "pids" / f"{name}.pid"

    def log_path(self, name: str) -> Path:
        return self.dir / "logs" / f"{name}.log"

    # ---- API access --------------------------------------------------------------------------
    def client(self, timeout: float = 10.0) -> httpx.Client:
        """An admin HTTP client for the sandbox apiserver (raw REST, no client library needed)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return httpx.Client(base_url=self.server, verify=ctx, timeout=timeout)

    @property
    def audit_log(self) -> Path:
        """Every write request the API server served, one JSON event per line (user, verb, URI)."""
        return self.dir / "logs" / "audit.log"

    def user_kubeconfig(self, user: str) -> Path:
        """A kubeconfig for a named admin user, e.g. the operator, so its writes show in the audit log."""
        from moe_sandbox.pki import issue_client_cert

        crt, key = issue_client_cert(self.pki, f"user-{user}", user)
        path = self.dir / f"kubeconfig-{user}"
        self._write_kubeconfig(path, crt, key, user)
        return path

    def _write_kubeconfig(
        self, path: Path | None = None, cert: Path | None = None, key: Path | None = None, user: str = "admin"
    ) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "moe-sandbox",
                    "cluster": {"server": self.server, "certificate-authority": str(self.pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": f"moe-sandbox-{user}",
                    "user": {
                        "client-certificate": str(cert or self.pki.admin_cert),
                        "client-key": str(key or self.pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "moe-sandbox",
                    "context": {
                        "cluster": "moe-sandbox",
                        "user": f"moe-sandbox-{user}",
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "moe-sandbox",
        }
        (path or self.kubeconfig).write_text(yaml.safe_dump(config, sort_keys=False))

    # ---- processes ---------------------------------------------------------------------------
    def pid(self, name: str) -> int | None:
        """The pid of a running component, or None."""
        try:
            pid = int(self._pidfile(name).read_text())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        # A zombie child of this process counts as gone.
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                return None
        return pid

    def start_addon(self, name: str, argv: list[str]) -> None:
        """Start an optional component (one of ADDONS) the way the control plane is started."""
        if name not in ADDONS:
            raise KeyError(f"unknown sandbox addon {name!r}; known: {', '.join(ADDONS)}")
        self._start(name, argv)

    def stop_addon(self, name: str, grace: float = 10.0) -> None:
        """Stop an optional component: SIGTERM, then SIGKILL after `grace` s."""
        pid = self.pid(name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            _kill_survivors([pid], grace)
        self._pidfile(name).unlink(missing_ok=True)

    def _start(self, name: str, argv: list[str]) -> None:
        self.log_path(name).parent.mkdir(parents=True, exist_ok=True)
        self._pidfile(name).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(name), "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,  # survives the shell that ran `up`; `down` stops it
            )
        self._pidfile(name).write_text(str(proc.pid))

    def _own_processes(self) -> Iterator[int]:
        """Every live process whose command line names this sandbox's state directory."""
        marker = str(self.dir).encode()
        binaries = {str(toolchain.binary_path(b)).encode() for b in toolchain.BINARIES}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0] in binaries and any(marker in a for a in argv[1:]):
                yield int(entry.name)

    def running(self) -> dict[str, int | None]:
        return {name: self.pid(name) for name in COMPONENT_ORDER}

    # ---- lifecycle ---------------------------------------------------------------------------
    def up(self, nodes_file: Path | None = None, log: Log = print) -> float:
        """Bring the sandbox up (idempotent); returns the seconds it took."""
        started = time.monotonic()
        toolchain.ensure_built(log)
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            if self._healthy():
                log("sandbox already running; reconciling node pools")
            else:
                self.down(log=lambda _m: None)
                self._start_control_plane(log)
            self.apply_node_pools(nodepools.load(nodes_file), log)
        except BaseException:
            log("sandbox start failed or was interrupted; stopping what was started")
            with contextlib.suppress(SandboxError):
                self.down(log=log)
            raise
        return time.monotonic() - started

    def _healthy(self) -> bool:
        if any(pid is None for pid in self.running().values()) or not self.kubeconfig.exists():
            return False
        try:
            with self.client(timeout=10) as c:
                return c.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _start_control_plane(self, log: Log) -> None:
        for name, port in self.ports.all().items():
            if _port_open(port):
                raise SandboxError(
                    f"port {port} for {name} is already in use by another program; stop it or set "
                    "MOE_SANDBOX_PORT_BASE to move every sandbox port"
                )
        ensure_pki(self.pki.dir)
        self._write_kubeconfig()
        bins = {b: str(toolchain.binary_path(b)) for b in toolchain.BINARIES}
        d, p, k = self.dir, self.ports, str(self.kubeconfig)

        log("starting etcd")
        self._start(
            "etcd",
            [
                bins["etcd"], "--name", "moe-sandbox", "--data-dir", str(d / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{p.etcd}",
                "--advertise-client-urls", f"http://127.0.0.1:{p.etcd}",
                "--listen-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
                "--initial-cluster", f"moe-sandbox=http://127.0.0.1:{p.etcd_peer}",
                "--unsafe-no-fsync=true", "--quota-backend-bytes", str(4 << 30),
            ],
        )  # fmt: skip
        self.wait_ready("etcd", lambda: _http_ok(f"http://127.0.0.1:{p.etcd}/health"), 30)

        log("starting kube-apiserver")
        self._start(
            "kube-apiserver",
            [
                bins["kube-apiserver"], f"--etcd-servers=http://127.0.0.1:{p.etcd}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none", f"--secure-port={p.apiserver}",
                f"--cert-dir={d / 'certs'}",
                f"--tls-cert-file={self.pki.serving_cert}", f"--tls-private-key-file={self.pki.serving_key}",
                f"--client-ca-file={self.pki.ca_cert}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.pki.sa_pub}",
                f"--service-account-signing-key-file={self.pki.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16", "--authorization-mode=Node,RBAC",
                "--allow-privileged=true", "--profiling=false",
                f"--audit-policy-file={self._write_audit_policy()}", f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json", "--audit-log-maxsize=100", "--audit-log-maxbackup=1",
            ],
        )  # fmt: skip
        self.wait_ready("kube-apiserver", self._apiserver_ready, 90)

        log("starting kube-controller-manager, kube-scheduler and kwok")
        self._start(
            "kube-controller-manager",
            [
                bins["kube-controller-manager"], f"--kubeconfig={k}", "--leader-elect=false",
                "--bind-address=127.0.0.1", f"--secure-port={p.controller_manager}",
                f"--cert-dir={d / 'certs'}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_cert}", "--node-monitor-grace-period=40s",
                "--use-service-account-credentials=false", "--profiling=false",
            ],
        )  # fmt: skip
        self._start(
            "kube-scheduler",
            [
                bins["kube-scheduler"], f"--kubeconfig={k}", "--leader-elect=false",
                "--bind-address=127.0.0.1", f"--secure-port={p.scheduler}",
                f"--cert-dir={d / 'certs'}", "--profiling=false",
            ],
        )  # fmt: skip
        stages = self._write_kwok_config()
        self._start(
            "kwok",
            [
                bins["kwok"], f"--kubeconfig={k}", f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={nodepools.KWOK_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40", f"--server-address=127.0.0.1:{p.kwok}",
            ],
        )  # fmt: skip
        self.wait_ready(
            "kube-controller-manager",
            lambda: _https_ok(f"https://127.0.0.1:{p.controller_manager}/healthz"),
            60,
        )
        self.wait_ready("kube-scheduler", lambda: _https_ok(f"https://127.0.0.1:{p.scheduler}/healthz"), 60)
        self.wait_ready("kwok", lambda: _port_open(p.kwok), 30)
        # Pods cannot be admitted before the controller-manager has made the default ServiceAccount.
        self.wait_ready("kube-controller-manager", self._default_service_account_exists, 60)

    def restart_apiserver(self, downtime: float = 0.0, grace: float = 5.0, log: Log = print) -> float:
        """Stop kube-apiserver alone and start it again with the very same command line (chaos
        tests: clients must re-watch); returns the seconds from the stop until it is ready again.
        SIGTERM, then SIGKILL after `grace` s: draining its watches would take it 30 s or more."""
        pid = self.pid("kube-apiserver")
        if pid is None:
            raise SandboxError("kube-apiserver is not running")
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        started = time.monotonic()
        log(f"stopping kube-apiserver (pid {pid})")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            log(f"kube-apiserver still draining after {grace:.0f}s; SIGKILL")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _reap(pid)
        while _port_open(self.ports.apiserver) and time.monotonic() < deadline:
            time.sleep(0.1)
        log(f"kube-apiserver stopped after {time.monotonic() - started:.1f}s")
        time.sleep(downtime)
        log("starting kube-apiserver")
        self._start("kube-apiserver", argv)
        self.wait_ready("kube-apiserver", self._apiserver_ready, 90)
        return time.monotonic() - started

    def _write_audit_policy(self) -> Path:
        """Audit writes only (metadata level), so tests can count what a client changed."""
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
                {"level": "None"},
            ],
        }
        path = self.dir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        return path

    def _write_kwok_config(self) -> Path:
        """kwok's upstream stages with shorter delays: simulated pods start in about a second."""
        docs: list[Any] = []
        for path in toolchain.kwok_stage_files():
            stage = yaml.safe_load(path.read_text())
            delay = stage.get("spec", {}).get("delay")
            if delay and stage["metadata"]["name"] == "pod-delete":
                # Upstream waits up to the whole grace period; simulated processes exit at once.
                delay.pop("jitterDurationFrom", None)
            if delay:
                delay["durationMilliseconds"] = min(delay.get("durationMilliseconds", 0), 200)
                if "jitterDurationMilliseconds" in delay:
                    delay["jitterDurationMilliseconds"] = min(delay["jitterDurationMilliseconds"], 500)
            docs.append(stage)
        out = self.dir / "kwok-stages.yaml"
        out.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return out

    def wait_ready(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        """Wait for a started component; its log tail is in the error when it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pid(name) is None:
                raise SandboxError(
                    f"{name} exited during start-up; see {self.log_path(name)}:\n{self._tail(name)}"
                )
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.2)
        raise SandboxError(
            f"{name} not ready after {timeout:.0f}s; see {self.log_path(name)}:\n{self._tail(name)}"
        )

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path(name).read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _apiserver_ready(self) -> bool:
        with self.client(timeout=2) as c:
            return c.get("/readyz").status_code == 200

    def _default_service_account_exists(self) -> bool:
        with self.client(timeout=2) as c:
            return c.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200

    # ---- nodes -------------------------------------------------------------------------------
    def apply_node_pools(self, spec: nodepools.NodePoolsFile, log: Log = print) -> None:
        """Create missing simulated nodes, remove sandbox nodes no longer declared, wait for Ready."""
        desired = {n["metadata"]["name"]: n for n in nodepools.render_nodes(spec)}
        with self.client() as c:
            existing = {
                n["metadata"]["name"]
                for n in c.get("/api/v1/nodes", params={"labelSelector": nodepools.POOL_LABEL}).json()[
                    "items"
                ]
            }
            for name in sorted(existing - desired.keys()):
                c.delete(f"/api/v1/nodes/{name}")
            created = 0
            for name, node in desired.items():
                if name not in existing:
                    self.create_node(node, c)
                    created += 1
            if created:
                log(f"created {created} simulated GPU nodes")
        self.wait_nodes_ready(set(desired), log)

    def create_node(self, node: dict[str, Any], c: httpx.Client) -> None:
        resp = c.post("/api/v1/nodes", json=node)
        if resp.status_code == 409:
            return
        resp.raise_for_status()
        # Some versions drop status on create; make capacity stick via the status subresource.
        name = node["metadata"]["name"]
        got = resp.json().get("status", {}).get("capacity", {})
        if got.get("nvidia.com/gpu") != node["status"]["capacity"]["nvidia.com/gpu"]:
            c.patch(
                f"/api/v1/nodes/{name}/status",
                json={"status": node["status"]},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()

    def wait_nodes_ready(self, names: set[str], log: Log = print, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while True:
                items = c.get("/api/v1/nodes").json()["items"]
                ready = {
                    n["metadata"]["name"]
                    for n in items
                    if any(
                        cond["type"] == "Ready" and cond["status"] == "True"
                        for cond in n.get("status", {}).get("conditions", [])
                    )
                }
                missing = names - ready
                if not missing:
                    return
                if time.monotonic() > deadline:
                    raise SandboxError(
                        f"{len(missing)} simulated nodes not Ready after {timeout:.0f}s "
                        f"(e.g. {sorted(missing)[:3]}); see {self.log_path('kwok')}"
                    )
                time.sleep(0.3)

    # ---- teardown ----------------------------------------------------------------------------
    def down(self, log: Log = print, purge: bool = False) -> None:
        """Stop every process of this sandbox; with purge also delete its state (etcd data, PKI)."""
        pids = {name: self.pid(name) for name in (*ADDONS, *reversed(COMPONENT_ORDER))}
        for name, pid in pids.items():
            if pid is not None:
                log(f"stopping {name} (pid {pid})")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGTERM)
        strays = [pid for pid in self._own_processes() if pid not in pids.values()]
        for pid in strays:
            log(f"stopping stray sandbox process {pid}")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        _kill_survivors([p for p in (*pids.values(), *strays) if p is not None], grace=10)
        for name in (*COMPONENT_ORDER, *ADDONS):
            self._pidfile(name).unlink(missing_ok=True)
        # etcd data is useless without its apiserver state; start fresh next time.
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
        deadline = time.monotonic() + 5
        busy = [f"{n}:{port}" for n, port in self.ports.all().items() if _port_open(port)]
        while busy and time.monotonic() < deadline:
            time.sleep(0.2)
            busy = [f"{n}:{port}" for n, port in self.ports.all().items() if _port_open(port)]
        if busy:
            raise SandboxError(f"ports still listening after down: {', '.join(busy)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return False


def _kill_survivors(pids: list[int], grace: float) -> None:
    """After a SIGTERM: wait up to `grace` s, SIGKILL whatever still runs, reap our children."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for pid in pids:
        _reap(pid)


def server_side_apply(c: httpx.Client, path: str, obj: dict[str, Any], field_manager: str) -> None:
    """Server-side apply one object as `field_manager` (force), for setting up the sandbox and tests."""
    resp = c.patch(
        path,
        params={"fieldManager": field_manager, "force": "true"},
        content=yaml.safe_dump(obj),
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    if resp.status_code not in (200, 201):
        raise SandboxError(f"applying {obj['kind']} {obj['metadata']['name']} failed: {resp.text[:500]}")


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _http_ok(url: str) -> bool:
    return httpx.get(url, timeout=1).status_code == 200


def _https_ok(url: str) -> bool:
    return httpx.get(url, timeout=1, verify=False).status_code == 200
