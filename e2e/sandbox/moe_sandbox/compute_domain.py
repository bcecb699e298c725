"""A FAKE of NVIDIA's DRA driver for GPUs (ComputeDomains only), for the sandbox and its tests.

What is real: kube-apiserver validates ComputeDomains against a CRD whose schema follows NVIDIA's
(spec immutable, numNodes >= 0, channel.resourceClaimTemplate.name required, allocationMode
Single/All defaulted to Single, status kept as written); the scheduler's DRA plugin allocates
every pod's ResourceClaim from ResourceSlices through the driver's real DeviceClass CEL selector;
kube-controller-manager creates the pods' claims from the templates and garbage-collects.

What is faked: no IMEX daemons, no kubelet plugin (kwok nodes prepare nothing), no node labels or
DaemonSet per domain, no finalizers and no status. A thread in this process stands in for the
driver's controller: it creates the ResourceClaimTemplate each ComputeDomain names, owned by the
ComputeDomain (the real controller cleans up through its finalizer instead), and publishes the
slice each GB200 node's kubelet plugin would (channel-0 and daemon-0, pool = node name). The
daemon DeviceClass (compute-domain-daemon.nvidia.com) is left out: only the driver's own DaemonSet
claims it. The thread lives in the calling process (a test session): it ends with that process.
The status schema keeps status.status and preserves the rest (the real one types status.nodes).

Shapes checked against NVIDIA/k8s-dra-driver-gpu at 22407113785e78c7763b4637689a201eb39c6199:
  deployments/helm/dra-driver-nvidia-gpu/crds/resource.nvidia.com_computedomains.yaml (the CRD)
  deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-compute-domain-default-channel.yaml
  templates/compute-domain-workload-claim-template.tmpl.yaml (the channel template: one request
    "channel" of compute-domain-default-channel.nvidia.com, opaque ComputeDomainChannelConfig)
  cmd/compute-domain-controller/computedomain.go, resourceclaimtemplate.go (names, labels, driver)
  cmd/compute-domain-kubelet-plugin/deviceinfo.go, nvlib.go, driver.go (devices "channel-<id>"
    and "daemon-0" with attributes type and id; only channel 0 is published; one pool per node)
  api/nvidia.com/resource/v1beta1/computedomainconfig.go, api.go (the config's apiVersion/kind)
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from moe_operator.topology.nodepools import CLIQUE_LABEL
from moe_sandbox.cluster import Log, Sandbox, SandboxError, server_side_apply

DRIVER = "compute-domain.nvidia.com"
GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
CRD_NAME = f"computedomains.{GROUP}"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
CD_LABEL = "resource.nvidia.com/computeDomain"  # value: the ComputeDomain's UID (as the driver sets it)
TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"
SANDBOX_LABEL = "moe-sandbox/fake-dra-driver"  # everything this module creates (slices, templates)

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CD_API = f"/apis/{GROUP}/{VERSION}"
RESOURCE_API = "/apis/resource.k8s.io/v1"
FIELD_MANAGER = "moe-sandbox"
POLL_S = 0.5  # ComputeDomains -> templates
SLICE_POLL_S = 10.0  # nodes -> slices (nodes added to the sandbox later get theirs)


def crd() -> dict[str, Any]:
    """computedomains.resource.nvidia.com as the driver's chart ships it, without descriptions."""
    status = {"type": "string", "enum": ["Ready", "NotReady"], "default": "NotReady"}
    spec = {
        "type": "object",
        "required": ["channel"],
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
        ],
        "properties": {
            "numNodes": {"type": "integer", "minimum": 0, "default": 0},
            "channel": {
                "type": "object",
                "required": ["resourceClaimTemplate"],
                "properties": {
                    "allocationMode": {"type": "string", "enum": ["All", "Single"], "default": "Single"},
                    "resourceClaimTemplate": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string"}},
                    },
                },
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": "ComputeDomain",
                "listKind": "ComputeDomainList",
                "plural": "computedomains",
                "singular": "computedomain",
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": {
                                    "type": "object",
                                    "required": ["status"],
                                    "x-kubernetes-preserve-unknown-fields": True,
                                    "properties": {"status": status},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


def device_class() -> dict[str, Any]:
    expression = (
        f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'channel' "
        f"&& device.attributes['{DRIVER}'].id == 0"
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CHANNEL_CLASS, "labels": {SANDBOX_LABEL: "true"}},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(node: dict[str, Any]) -> dict[str, Any]:
    """What the kubelet plugin publishes on one node: channel 0 and the daemon device, owned by the Node."""
    name = node["metadata"]["name"]
    devices = [
        {"name": f"{kind}-0", "attributes": {"type": {"string": kind}, "id": {"int": 0}}}
        for kind in ("channel", "daemon")
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{name}-{DRIVER}",
            "labels": {SANDBOX_LABEL: "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def channel_template(cd: dict[str, Any]) -> dict[str, Any]:
    """The workload ResourceClaimTemplate the driver's controller creates for a ComputeDomain."""
    meta, channel = cd["metadata"], cd["spec"]["channel"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": channel["resourceClaimTemplate"]["name"],
            "namespace": meta["namespace"],
            "labels": {CD_LABEL: meta["uid"], TARGET_LABEL: "Workload", SANDBOX_LABEL: "true"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "ComputeDomain",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
                    "config": [
                        {
                            "requests": ["channel"],
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": f"{GROUP}/{VERSION}",
                                    "kind": "ComputeDomainChannelConfig",
                                    "domainID": meta["uid"],
                                    "allocationMode": channel.get("allocationMode", "Single"),
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


def sync_slices(c: httpx.Client) -> int:
    """Publish the slice of every GB200 node (label nvidia.com/gpu.clique) that has none; returns how many."""
    nodes = c.get("/api/v1/nodes", params={"labelSelector": CLIQUE_LABEL})
    slices = c.get(f"{RESOURCE_API}/resourceslices", params={"fieldSelector": f"spec.driver={DRIVER}"})
    if nodes.status_code != 200 or slices.status_code != 200:
        return 0
    have = {s["spec"].get("nodeName") for s in slices.json()["items"]}
    created = 0
    for node in nodes.json()["items"]:
        if node["metadata"]["name"] not in have and not node["metadata"].get("deletionTimestamp"):
            resp = c.post(f"{RESOURCE_API}/resourceslices", json=resource_slice(node))
            created += resp.status_code == 201
    return created


def sync_templates(c: httpx.Client) -> int:
    """Create the missing channel template of every live ComputeDomain; returns how many."""
    cds = c.get(f"{CD_API}/computedomains")
    rcts = c.get(f"{RESOURCE_API}/resourceclaimtemplates", params={"labelSelector": CD_LABEL})
    if cds.status_code != 200 or rcts.status_code != 200:
        return 0
    have = {(t["metadata"]["namespace"], t["metadata"]["name"]) for t in rcts.json()["items"]}
    created = 0
    for cd in cds.json()["items"]:
        meta = cd["metadata"]
        name = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
        if meta.get("deletionTimestamp") or (meta["namespace"], name) in have:
            continue
        path = f"{RESOURCE_API}/namespaces/{meta['namespace']}/resourceclaimtemplates"
        created += c.post(path, json=channel_template(cd)).status_code == 201  # 409/403: exists, ns ending
    return created


class _Controller(threading.Thread):
    """Polls ComputeDomains (and, less often, nodes); waits on an Event, so stop() is prompt."""

    def __init__(self, box: Sandbox) -> None:
        super().__init__(name="fake-compute-domain-controller", daemon=True)
        self.box = box
        self.halt = threading.Event()
        self.last_error = ""

    def run(self) -> None:
        next_slices = time.monotonic() + SLICE_POLL_S
        with self.box.client(timeout=5) as c:
            while not self.halt.is_set():
                try:
                    sync_templates(c)
                    if time.monotonic() >= next_slices:
                        next_slices = time.monotonic() + SLICE_POLL_S
                        sync_slices(c)
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                    self.last_error = repr(exc)  # the apiserver restarting, an object half-written
                self.halt.wait(POLL_S)

    def stop(self, timeout: float = 10) -> None:
        self.halt.set()
        self.join(timeout)


_controllers: dict[Path, _Controller] = {}
_lock = threading.Lock()


def running(box: Sandbox) -> bool:
    with _lock:
        ctl = _controllers.get(box.dir)
        return ctl is not None and ctl.is_alive()


def install(box: Sandbox, log: Log = print, timeout: float = 60) -> float:
    """CRD (waits until Established and served), DeviceClass, the GB200 nodes' slices and the
    controller thread (idempotent); returns the seconds it took."""
    started = time.monotonic()
    deadline = started + timeout
    with box.client(timeout=30) as c:
        server_side_apply(c, f"{CRD_PATH}/{CRD_NAME}", crd(), FIELD_MANAGER)
        server_side_apply(c, f"{RESOURCE_API}/deviceclasses/{CHANNEL_CLASS}", device_class(), FIELD_MANAGER)
        slices = sync_slices(c)
        while not _established(c) or c.get(f"{CD_API}/computedomains").status_code != 200:
            if time.monotonic() > deadline:
                raise SandboxError(f"the {CRD_NAME} CRD was not served within {timeout:.0f}s")
            time.sleep(0.2)
    with _lock:
        ctl = _controllers.get(box.dir)
        if ctl is None or not ctl.is_alive():
            ctl = _controllers[box.dir] = _Controller(box)
            ctl.start()
    seconds = time.monotonic() - started
    log(f"fake NVIDIA DRA driver (ComputeDomains) installed in {seconds:.1f}s ({slices} slices published)")
    return seconds


def _established(c: httpx.Client) -> bool:
    resp = c.get(f"{CRD_PATH}/{CRD_NAME}")
    if resp.status_code != 200:
        return False
    conditions = resp.json().get("status", {}).get("conditions") or []
    return any(x.get("type") == "Established" and x.get("status") == "True" for x in conditions)


def uninstall(box: Sandbox, log: Log = print, timeout: float = 60) -> bool:
    """Stop the controller; delete the CRD (and so every ComputeDomain), the DeviceClass, the slices
    and the templates, and wait until all are gone. Returns whether the CRD was there."""
    with _lock:
        ctl = _controllers.pop(box.dir, None)
    if ctl is not None:
        ctl.stop()
        if ctl.is_alive():
            raise SandboxError("the fake ComputeDomain controller thread did not stop")
    mine = {"labelSelector": SANDBOX_LABEL}
    with box.client(timeout=30) as c:
        existed = c.delete(f"{CRD_PATH}/{CRD_NAME}").status_code != 404
        c.delete(f"{RESOURCE_API}/deviceclasses/{CHANNEL_CLASS}")
        c.delete(f"{RESOURCE_API}/resourceslices", params=mine)
        for t in c.get(f"{RESOURCE_API}/resourceclaimtemplates", params=mine).json()["items"]:
            with contextlib.suppress(httpx.HTTPError):
                c.delete(
                    f"{RESOURCE_API}/namespaces/{t['metadata']['namespace']}"
                    f"/resourceclaimtemplates/{t['metadata']['name']}"
                )

        def left() -> list[str]:
            out = [CRD_NAME] if c.get(f"{CRD_PATH}/{CRD_NAME}").status_code != 404 else []
            if c.get(f"{RESOURCE_API}/deviceclasses/{CHANNEL_CLASS}").status_code != 404:
                out.append(CHANNEL_CLASS)
            for plural in ("resourceslices", "resourceclaimtemplates"):
                items = c.get(f"{RESOURCE_API}/{plural}", params=mine).json()["items"]
                out += [f"{plural}/{i['metadata']['name']}" for i in items]
            return out

        deadline = time.monotonic() + timeout
        while remaining := left():
            if time.monotonic() > deadline:
                raise SandboxError(f"fake DRA driver objects not gone after {timeout:.0f}s: {remaining[:5]}")
            time.sleep(0.3)
    if existed:
        log("fake NVIDIA DRA driver (ComputeDomains) removed")
    return existed
