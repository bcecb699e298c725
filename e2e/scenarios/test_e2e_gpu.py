"""Real engines on a real GPU node pool: Qwen3-30B-A3B with the SGLang image, requests through the
router, per-expert load in the runtime's metrics, and a placement version published and pushed.

Runs only against a cluster (E2E_KUBECONFIG or --kubeconfig) whose GPU nodes are real; it skips,
saying why, on the sandbox and wherever every GPU node is simulated (kwok) or there is none.
See docs/e2e.md for the knobs (E2E_GPU_*, E2E_MODEL_*, E2E_NAMESPACE, E2E_READY_TIMEOUT).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2e_moe import REPO, Recovery, engine_pods, get_moed, metric, moed_path, qwen3, wait_ready
from e2e_target import Target

from moe_operator.topology.nodepools import KWOK_ANNOTATION
from moe_sandbox.testing import wait_for

pytestmark = pytest.mark.cluster

GPU = os.environ.get("E2E_GPU_RESOURCE", "nvidia.com/gpu")
METRICS = 9402  # the runtime's metrics listener (no token); its API on 9400 takes the instance's token
REFRESH_S = 60


def sglang_image() -> str:
    """The pinned SGLang image (docker/versions.env), the one the runtime image is built on."""
    for line in (REPO / "docker" / "versions.env").read_text().splitlines():
        if line.startswith("SGLANG_IMAGE="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("SGLANG_IMAGE missing from docker/versions.env")


def real_gpu_nodes(api: httpx.Client) -> list[dict[str, Any]]:
    """Nodes with allocatable GPUs that are not kwok simulations; skips (with the reason) if none."""
    nodes = api.get("/api/v1/nodes").raise_for_status().json()["items"]
    gpu = [n for n in nodes if int((n.get("status") or {}).get("allocatable", {}).get(GPU, "0")) > 0]
    real = [n for n in gpu if (n["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) != "fake"]
    if not gpu:
        pytest.skip(f"no node of this cluster has allocatable {GPU}: nothing to run SGLang on")
    if not real:
        pytest.skip(
            f"all {len(gpu)} GPU nodes are simulated ({KWOK_ANNOTATION}=fake): no real GPU to run SGLang on; "
            "point E2E_KUBECONFIG at a cluster with a GPU node pool"
        )
    return real


def gpu_spec(node: dict[str, Any], name: str) -> dict[str, Any]:
    """The Qwen3-30B-A3B example shaped to the pool's nodes, with a short placement refresh."""
    gpus = int(os.environ.get("E2E_GPUS_PER_NODE") or node["status"]["allocatable"][GPU])
    mib = node["metadata"]["labels"].get("nvidia.com/gpu.memory")  # GPU feature discovery
    obj = qwen3(
        1,
        name=name,
        refreshInterval=f"{REFRESH_S}s",
        minInterval=f"{REFRESH_S}s",
        history="10m",
        minImprovement=0.0,
    )
    spec = obj["spec"]
    spec["engine"] = {"image": os.environ.get("E2E_SGLANG_IMAGE", sglang_image())}
    spec["topology"] = {
        "gpusPerNode": gpus,
        "gpuMemory": os.environ.get("E2E_GPU_MEMORY") or (f"{mib}Mi" if mib else "80Gi"),
        "gpuResourceName": GPU,
    }
    if os.environ.get("E2E_GPU_NODE_SELECTOR"):  # k=v,k2=v2
        spec["topology"]["nodeSelector"] = dict(
            kv.split("=", 1) for kv in os.environ["E2E_GPU_NODE_SELECTOR"].split(",")
        )
    spec["decode"]["attentionDataParallel"] = gpus
    model = spec["model"]
    if os.environ.get("E2E_MODEL_PVC"):
        model["volume"] = {
            "persistentVolumeClaim": {"claimName": os.environ["E2E_MODEL_PVC"], "readOnly": True}
        }
        model["path"] = os.environ.get("E2E_MODEL_PATH", "/models/qwen3-30b-a3b")
    elif os.environ.get("E2E_MODEL_HOSTPATH"):
        model["volume"] = {"hostPath": {"path": os.environ["E2E_MODEL_HOSTPATH"], "type": "Directory"}}
        model["path"] = os.environ.get("E2E_MODEL_PATH", "/models/qwen3-30b-a3b")
    else:  # every engine pod downloads Qwen/Qwen3-30B-A3B from Hugging Face
        model.pop("volume", None)
        model.pop("path", None)
    return obj


@pytest.fixture()
def gpu_namespace(api: httpx.Client, target: Target) -> Iterator[str]:
    """E2E_NAMESPACE (kept; e.g. where the weights' PVC is) or a fresh namespace (deleted)."""
    if target.sandbox is not None:
        pytest.skip("the sandbox's GPUs are simulated by kwok; run with E2E_KUBECONFIG on a GPU node pool")
    real_gpu_nodes(api)
    if os.environ.get("E2E_NAMESPACE"):
        yield os.environ["E2E_NAMESPACE"]
        return
    name = f"e2e-gpu-{uuid.uuid4().hex[:6]}"
    api.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
    try:
        yield name
    finally:
        api.delete(f"/api/v1/namespaces/{name}")


def _proxy(namespace: str, kind: str, name: str, port: str | int, path: str) -> str:
    """The API server's proxy to a Service or pod port: no port-forward, no in-cluster Job."""
    return f"/api/v1/namespaces/{namespace}/{kind}/{name}:{port}/proxy{path}"


class Traffic:
    """Chat completions through the router from a background thread, counting the answers."""

    PROMPTS = (
        "Write a haiku about {n} mountains.",
        "Explain in two sentences why the sky is blue, for reader number {n}.",
        "Translate 'good morning number {n}' into French, German and Japanese.",
        "List {n} prime numbers and say why each is prime.",
        "Write a Python function that returns the {n}th Fibonacci number.",
    )

    def __init__(self, api: httpx.Client, url: str, model: str) -> None:
        self.api, self.url, self.model = api, url, model
        self.ok, self.failed, self.completion_tokens = 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def send(self, n: int) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.PROMPTS[n % len(self.PROMPTS)].format(n=n)}],
            "max_tokens": 64,
            "temperature": 0,
        }
        resp = self.api.post(self.url, json=body, timeout=300)
        if resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"]:
            self.ok += 1
            self.completion_tokens += int(resp.json().get("usage", {}).get("completion_tokens", 0))
        else:
            self.failed += 1

    def _run(self) -> None:
        n = 1000
        while not self._stop.is_set():
            n += 1
            try:
                self.send(n)
            except httpx.HTTPError:
                self.failed += 1

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(330)


def test_qwen3_on_gpus_serves_and_rebalances(
    api: httpx.Client, gpu_namespace: str, recovery: Recovery
) -> None:
    ns = gpu_namespace
    node = real_gpu_nodes(api)[0]
    obj = gpu_spec(node, f"e2e-qwen3-{uuid.uuid4().hex[:4]}")
    name = obj["metadata"]["name"]
    resp = api.post(moed_path(ns), json=obj)
    assert resp.status_code == 201, resp.text
    started = time.monotonic()
    try:
        wait_ready(api, ns, name, timeout=float(os.environ.get("E2E_READY_TIMEOUT", "2400")))
        recovery.record("created -> Ready (pull, weights, CUDA graphs)", time.monotonic() - started)
        router = f"{name}-router"
        models = api.get(_proxy(ns, "services", router, "http", "/v1/models"))
        assert models.status_code == 200, models.text
        model_id = models.json()["data"][0]["id"]
        traffic = Traffic(api, _proxy(ns, "services", router, "http", "/v1/chat/completions"), model_id)
        for n in range(8):  # first answers synchronously: a broken path fails here, clearly
            traffic.send(n)
        assert traffic.ok == 8, f"{traffic.failed} of 8 chat completions failed"
        assert traffic.completion_tokens > 0

        leader = next(
            p["metadata"]["name"]
            for p in engine_pods(api, ns, name)
            if p["metadata"]["labels"].get("apps.kubernetes.io/pod-index") == "0"
        )

        def runtime_metrics() -> str:
            return api.get(_proxy(ns, "pods", leader, METRICS, "/metrics")).text

        traffic.start()
        try:
            # Per-expert load reached the runtime: windows with routed tokens, a balancedness score.
            def expert_load() -> str | None:
                text = runtime_metrics()
                return text if metric(text, "moe_runtime_routed_assignments_total") > 0 else None

            text = wait_for(
                expert_load, 300, interval=5, what="routed expert assignments in moe_runtime metrics"
            )
            assert metric(text, "moe_runtime_windows_total") >= 1
            assert 0 < metric(text, "moe_runtime_balancedness") <= 1

            # The operator planned from that load and published (and pushed) a placement version.
            def published() -> dict[str, Any] | None:
                p = ((get_moed(api, ns, name).get("status") or {}).get("placement") or {}).get("decode") or {}
                return p if int(p.get("version") or 0) >= 1 else None

            placement = wait_for(published, 4 * REFRESH_S + 300, interval=5, what="a published placement")
            recovery.record("Ready -> first placement version", time.monotonic() - started)
            cm = api.get(f"/api/v1/namespaces/{ns}/configmaps/{name}-decode-placement").json()
            assert int(cm["metadata"]["annotations"]["moe.inference.dev/placement-version"]) >= 1

            # The runtime API takes only its instance's token, which the apiserver's proxy cannot carry
            # (Authorization is the proxy's own credential): the operator records what each runtime
            # accepted (status.placement.decode.instances), and the runtime counts the pushes it took.
            def accepted() -> bool:
                p = ((get_moed(api, ns, name).get("status") or {}).get("placement") or {}).get("decode") or {}
                ok = metric(runtime_metrics(), "moe_runtime_placement_pushes_total", result="accepted") >= 1
                return ok and any(int(i.get("version") or 0) >= 1 for i in p.get("instances") or [])

            held = wait_for(
                accepted, 2 * REFRESH_S, interval=5, what="the leader's runtime holding the pushed placement"
            )
            assert held
            print(
                f"\nplacement v{placement['version']}: measured {placement.get('measuredBalancedness')}, "
                f"predicted {placement.get('predictedBalancedness')}; {traffic.ok} answers, {traffic.failed} failed"
            )
        finally:
            traffic.stop()
        assert traffic.failed == 0, f"{traffic.failed} requests failed while the placement changed"
    finally:
        api.delete(moed_path(ns, name))
