"""Smoke tests of the BUILT operator image (docker/operator.Dockerfile on CI's Debian base).

The cluster test runs the image's entrypoint, `moe-operator run`, inside the image (buildah run,
chroot isolation, host network) against a sandbox of this module's own: the session's sandbox
may already have the checkout's operator watching every namespace (tests/operator_plugin.py,
session scope), and two operators would fight over the same MoEDeployment and webhook.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from image_harness import PROBE, REPO, RUNTIME_TREE, BuiltImages, Store, oci_manifest, stop

from moe_operator.cli.crds import render_crd_yaml
from moe_sandbox import testing as sandbox_testing
from moe_sandbox.cluster import Ports, Sandbox, server_side_apply
from moe_sandbox.testing import TEST_PORT_BASE, wait_for

EXAMPLE = REPO / "examples" / "qwen3-30b-a3b-single-node.yaml"
MOED = "/apis/moe.inference.dev/v1alpha1"
WEBHOOK_CONFIG = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/moe.inference.dev"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# Ports of this module: its sandbox 700 above the session's (which uses base+247..base+446; the
# demo test's sandbox sits at base+500), the operator in the image below those.
SANDBOX_PORT_BASE = TEST_PORT_BASE + 700
LIVENESS_PORT, METRICS_PORT, WEBHOOK_PORT = TEST_PORT_BASE + 480, TEST_PORT_BASE + 481, TEST_PORT_BASE + 482
KUBECONFIG_DIR = "/mnt/moe-test"
# What must not be in the operator image: compilers and build tools, installers, the runtime.
BUILD_TOOLS = ("gcc", "cc", "c++", "g++", "make", "ld", "as", "git")


def versions() -> dict[str, str]:
    lines = (REPO / "docker" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def operator_container(image_store: Store, operator_image: str) -> str:
    return image_store.container(operator_image)


def test_operator_image_metadata(built_images: BuiltImages, image_store: Store, operator_image: str) -> None:
    config = image_store.image_config(operator_image)
    assert config["Entrypoint"] == ["moe-operator", "run"]
    assert not config.get("Cmd"), "the chart passes only flags: no CMD to append"
    assert config["User"] == "10001:10001"
    assert set(config["ExposedPorts"]) == {"8080/tcp", "9100/tcp", "9443/tcp"}
    annotations = oci_manifest(built_images.archive("operator"))["annotations"]
    for source in (annotations, config["Labels"]):
        assert source["org.opencontainers.image.version"] == versions()["MOE_OPERATOR_VERSION"]
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", source["org.opencontainers.image.revision"])
        assert source["org.opencontainers.image.source"].startswith("https://")
    assert annotations["org.opencontainers.image.revision"] == built_images.env["MOE_OPERATOR_REVISION"]
    packages = built_images.packages("operator")
    venv = packages.split("# base image")[0]
    for pin in ("moe-operator==0.1.0", "moe-placement==0.1.0", "moe-contract==0.1.0"):
        assert f"\n{pin}\n" in venv
    assert re.search(r"^kopf==[0-9.]+$", venv, re.M)
    assert "moe-runtime" not in packages and "moe-sandbox" not in packages


def test_operator_image_holds_no_build_tools_nor_runtime(image_store: Store, operator_container: str) -> None:
    root = image_store.mount(operator_container)
    for folder in ("usr/bin", "usr/local/bin", "bin", "opt/moe-operator/bin"):
        for tool in BUILD_TOOLS:
            assert not (root / folder / tool).exists(), f"/{folder}/{tool} in the operator image"
    (site,) = (root / "opt/moe-operator/lib").glob("python3*/site-packages")
    present = {p.name for p in site.iterdir()}
    assert "moe_operator" in present
    for absent in ("pip", "setuptools", "moe_runtime", "moe_sandbox", "sglang", "torch"):
        assert absent not in present, f"{absent} in the operator's virtualenv"
    assert not (root / "opt/moe-operator/bin/pip").exists()
    # Dropped to keep the image small (docker/operator.Dockerfile): nothing imports them.
    assert not (site / "kubernetes" / "aio").exists()
    assert (site / "kubernetes" / "client").is_dir()
    assert not list((site / "numpy").rglob("tests")), "numpy's test suites in the operator image"
    assert not (root / "src").exists() and not (root / "wheels").exists()
    assert not (root / "root/.cache").exists(), "a build cache left in the image"
    home = root / "home/moe-operator"
    assert (home.stat().st_uid, home.stat().st_gid) == (10001, 10001)


def test_operator_image_prints_the_checkouts_crd(image_store: Store, operator_container: str) -> None:
    """The CLI runs in the image, and its CRD is this checkout's (crds/ is checked against the
    same generator by `moe-operator crds check`)."""
    res = image_store.run(operator_container, ["moe-operator", "crds", "print"])
    assert res.returncode == 0, res.stderr
    assert res.stdout == render_crd_yaml()


# ---- against the sandbox ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_sandbox() -> Iterator[Sandbox]:
    """A sandbox of this module's own, never watched by the checkout's operator."""
    box = Sandbox(Path(f"{sandbox_testing.test_sandbox_dir()}-images"), Ports(SANDBOX_PORT_BASE))

    def log(msg: str) -> None:
        print(f"[image sandbox] {msg}", file=sys.stderr, flush=True)

    try:
        box.up(log=log)
        yield box
    finally:
        box.down(log=log)


def inline_kubeconfig(box: Sandbox, user: str, path: Path) -> None:
    """The user's kubeconfig with its CA, certificate and key inlined, readable by the image's user."""
    config = yaml.safe_load(box.user_kubeconfig(user).read_text())
    for entry, fields in (
        ("clusters", ("certificate-authority",)),
        ("users", ("client-certificate", "client-key")),
    ):
        for item in config[entry]:
            body = item["cluster" if entry == "clusters" else "user"]
            for field in fields:
                body[f"{field}-data"] = base64.b64encode(Path(body.pop(field)).read_bytes()).decode()
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    path.parent.chmod(0o755)


class ImageOperator:
    """`moe-operator run` from the image's entrypoint, with the chart's kind of flags."""

    def __init__(self, store: Store, container: str, image: str, runtime_image: str, kube_dir: Path) -> None:
        entrypoint = store.image_config(image)["Entrypoint"]
        argv = [
            *entrypoint,
            f"--liveness=http://127.0.0.1:{LIVENESS_PORT}/healthz",
            f"--metrics-port={METRICS_PORT}",
            f"--webhook-port={WEBHOOK_PORT}",
            f"--runtime-image={runtime_image}",
        ]
        self.log_path = kube_dir.parent / "operator-image.log"
        env = {"KUBECONFIG": f"{KUBECONFIG_DIR}/kubeconfig"}
        volumes = [f"{kube_dir}:{KUBECONFIG_DIR}:ro"]
        self.proc = store.start(container, argv, self.log_path, volumes=volumes, env=env)

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])

    def alive(self) -> None:
        assert self.proc.poll() is None, f"operator exited ({self.proc.returncode}):\n{self.tail()}"

    def stop(self) -> int:
        """SIGTERM to the operator (image_harness.stop); its exit status."""
        return stop(self.proc)


def ready(api: httpx.Client, op: ImageOperator, namespace: str, name: str) -> dict[str, Any] | None:
    op.alive()
    got: dict[str, Any] = api.get(f"{MOED}/namespaces/{namespace}/moedeployments/{name}").json()
    conds = got.get("status", {}).get("conditions", [])
    return got if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None


@pytest.mark.cluster
def test_operator_image_reconciles_example_to_ready(
    image_sandbox: Sandbox,
    image_store: Store,
    operator_image: str,
    operator_container: str,
    runtime_image: str,
    built_images: BuiltImages,
    tmp_path: Path,
) -> None:
    from operator_harness import bind_model_volume

    api = image_sandbox.client(timeout=30)
    # The CRD as the image prints it.
    crd = yaml.safe_load(image_store.run(operator_container, ["moe-operator", "crds", "print"]).stdout)
    server_side_apply(api, f"{CRD_PATH}/{crd['metadata']['name']}", crd, "moe-image-tests")
    wait_for(lambda: api.get(f"{MOED}/moedeployments").status_code == 200, 30, what="CRD served")

    kube_dir = tmp_path / "kube"
    kube_dir.mkdir()
    inline_kubeconfig(image_sandbox, "moe-operator-image", kube_dir / "kubeconfig")
    runtime_ref = built_images.image("runtime")
    op = ImageOperator(image_store, operator_container, operator_image, runtime_ref, kube_dir)
    try:

        def live() -> bool:
            op.alive()
            try:
                return httpx.get(f"http://127.0.0.1:{LIVENESS_PORT}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(live, 90, what="liveness of the operator in the image")

        def webhook_registered() -> bool:
            r = api.get(WEBHOOK_CONFIG)
            return r.status_code == 200 and any(
                str(WEBHOOK_PORT) in w["clientConfig"].get("url", "") for w in r.json().get("webhooks", [])
            )

        wait_for(webhook_registered, 60, what="validating webhook registered by the operator in the image")

        namespace = f"img-{uuid.uuid4().hex[:6]}"
        api.post("/api/v1/namespaces", json={"metadata": {"name": namespace}}).raise_for_status()
        wait_for(
            lambda: api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default").status_code == 200, 30
        )
        bind_model_volume(api, namespace, "qwen3-30b-a3b")
        # The webhook served from the image refuses what only it checks (the model catalog).
        bad = yaml.safe_load(EXAMPLE.read_text())
        bad["metadata"]["name"] = "bad"
        bad["spec"]["model"]["name"] = "acme/MoE-9000"
        refused = api.post(f"{MOED}/namespaces/{namespace}/moedeployments", json=bad)
        assert refused.status_code == 422, refused.text
        assert "admission webhook" in refused.text and "spec.model.architecture" in refused.text

        obj = yaml.safe_load(EXAMPLE.read_text())
        name = obj["metadata"]["name"]
        resp = api.post(f"{MOED}/namespaces/{namespace}/moedeployments", json=obj)
        assert resp.status_code == 201, resp.text
        try:
            wait_for(lambda: ready(api, op, namespace, name), 120, what=f"{name} Ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\noperator log:\n{op.tail()}") from exc

        # What the operator in the image rendered for the engine pods, run through the runtime image.
        sets = api.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets").json()["items"]
        assert sets, "no StatefulSet rendered"
        pod = sets[0]["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["image"] == runtime_ref
        engine_cm = api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}-decode-engine").json()
        check_pod_with_runtime_image(image_store, runtime_image, pod, engine_cm["data"], tmp_path)
    finally:
        rc = op.stop()
    assert rc == 0, f"the operator did not stop cleanly on SIGTERM ({rc}):\n{op.tail()}"


def check_pod_with_runtime_image(
    store: Store, runtime_image: str, pod: dict[str, Any], engine_files: dict[str, str], tmp: Path
) -> None:
    """The rendered init container's command copies the tree; the engine container's command
    (as print-args) runs from the copy with the rendered env and the rendered engine config."""
    container = store.container(runtime_image)
    (init,) = pod["initContainers"]
    (mount,) = init["volumeMounts"]
    empty_dir = tmp / "emptydir"
    empty_dir.mkdir(mode=0o777)
    empty_dir.chmod(0o777)
    res = store.run(container, init["command"], volumes=[f"{empty_dir}:{mount['mountPath']}"])
    assert res.returncode == 0, res.stderr
    config_dir = tmp / "engine-config"
    config_dir.mkdir()
    for file, text in engine_files.items():
        (config_dir / file).write_text(text)
    engine = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in engine["volumeMounts"]}
    assert mounts["runtime"] == RUNTIME_TREE
    fields = {"MOE_RANK": "0", "POD_IP": "127.0.0.1", "POD_NAME": "pod-0"}
    env = {v["name"]: v.get("value", fields.get(v["name"], "")) for v in engine["env"]}
    volumes = [f"{empty_dir}:{RUNTIME_TREE}:ro", f"{config_dir}:{mounts['engine-config']}:ro"]
    probe = store.run(container, ["python3", "-c", PROBE, RUNTIME_TREE], volumes=volumes, env=env, user="0:0")
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout)["failed"] == {}
    assert engine["command"][-1] == "launch"
    argv = [*engine["command"][:-1], "print-args", "--format", "json", "--state-dir", "/tmp/moe-state"]
    res = store.run(container, argv, volumes=volumes, env=env, user="0:0")
    assert res.returncode == 0, res.stderr
    printed = json.loads(res.stdout)["argv"]
    assert printed[:3] == ["python3", "-m", "sglang.launch_server"]
    assert "--enable-eplb" in printed
