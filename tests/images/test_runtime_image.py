"""Smoke tests of the BUILT runtime image (docker/runtime.Dockerfile on CI's stand-in engine base).

An engine pod uses the image in two steps, and so do these tests: the init container's command
(rendered by the operator's own pod template) copies /opt/moe-runtime into an emptyDir; the
engine container mounts that copy read-only at /opt/moe-runtime with the rendered environment.
In CI the engine is a stand-in for the SGLang image holding only the packages the runtime
needs from it (docker/ci-engine.Dockerfile: numpy, pydantic, aiohttp, prometheus-client), and
the runtime image is built FROM it, so the engine container runs in the runtime image with the
copy mounted over its own tree: only the copy and the engine's own packages are importable.

The image also pins sglang-router (docker/versions.env), so it can serve as spec.router.image:
the rendered router pod's version check and router command run in it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from image_harness import PROBE, REPO, RUNTIME_TREE, BuiltImages, Store, oci_manifest, stop

from moe_contract.flags import router_catalog
from moe_operator.api import MoEDeploymentSpec
from moe_operator.render.engine import engine_config
from moe_operator.render.group import Owner, RuntimeSettings, pod_template
from moe_operator.render.shared import router_objects
from moe_operator.topology.planner import InstanceSite
from moe_placement.maps import trivial_map
from moe_sandbox.testing import TEST_PORT_BASE, wait_for

EXAMPLE = REPO / "examples" / "qwen3-30b-a3b-single-node.yaml"
GOLDEN = REPO / "tests" / "runtime" / "golden"
DISTRIBUTIONS = {"moe_runtime": "runtime", "moe_placement": "placement", "moe_contract": "contract"}
# What fieldRef env vars resolve to in a pod (kubelet fills them; here they are fixed).
FIELD_VALUES = {"MOE_RANK": "0", "POD_IP": "127.0.0.1", "POD_NAME": "qwen3-30b-decode-0-0"}
# The router's listen ports, moved off the rendered 8000/29000 (next to the operator image test's).
ROUTER_PORT, ROUTER_METRICS_PORT = TEST_PORT_BASE + 483, TEST_PORT_BASE + 484
OWNER_UID = "00000000-0000-0000-0000-000000000000"


def rendered_pod(runtime_image: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The operator's pod spec and engine config for the one-node example (its pure renderers)."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    spec = MoEDeploymentSpec.model_validate(obj["spec"])
    owner = Owner(obj["metadata"]["name"], "default", OWNER_UID)
    site = InstanceSite("decode", 0, "node", "kubernetes.io/hostname", "h100-0", ("h100-0",))
    pod = pod_template(spec, owner, "decode", site, RuntimeSettings(runtime_image=runtime_image))
    return pod, engine_config(spec, "decode")


def rendered_router_pod(runtime_image: str) -> dict[str, Any]:
    """The router Deployment's pod spec for the example with the runtime image as spec.router.image."""
    obj = yaml.safe_load(EXAMPLE.read_text())
    obj["spec"].setdefault("router", {})["image"] = runtime_image
    spec = MoEDeploymentSpec.model_validate(obj["spec"])
    owner = Owner(obj["metadata"]["name"], "default", OWNER_UID)
    (deployment,) = [o for o in router_objects(spec, owner) if o["kind"] == "Deployment"]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def pod_env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for var in container["env"]:
        env[var["name"]] = var["value"] if "value" in var else FIELD_VALUES[var["name"]]
    return env


def files(root: Path) -> dict[str, str]:
    """relative path -> sha256 of every regular file under root."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def runtime_container(image_store: Store, runtime_image: str) -> str:
    return image_store.container(runtime_image)


@pytest.fixture(scope="module")
def init_copy(
    image_store: Store,
    runtime_container: str,
    built_images: BuiltImages,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The emptyDir after the init container ran: its rendered command, in the runtime image, as
    the image's own user (an emptyDir is world-writable)."""
    pod, _ = rendered_pod(built_images.image("runtime"))
    (init,) = pod["initContainers"]
    assert init["image"] == built_images.image("runtime")
    (mount,) = init["volumeMounts"]
    empty_dir = tmp_path_factory.mktemp("emptydir")
    empty_dir.chmod(0o777)
    res = image_store.run(runtime_container, init["command"], volumes=[f"{empty_dir}:{mount['mountPath']}"])
    assert res.returncode == 0, res.stderr
    return empty_dir


def engine_run(
    store: Store, container: str, copy: Path, argv: list[str], env: dict[str, str], extra: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """argv in the engine container: the copy read-only at /opt/moe-runtime, as root (SGLang's user)."""
    return store.run(container, argv, volumes=[f"{copy}:{RUNTIME_TREE}:ro", *extra], env=env, user="0:0")


def test_runtime_image_metadata(built_images: BuiltImages, image_store: Store, runtime_image: str) -> None:
    config = image_store.image_config(runtime_image)
    assert config["User"] == "10001:10001"  # the init container only copies files
    assert f"PYTHONPATH={RUNTIME_TREE}" in config["Env"]
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "docker" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    annotations = oci_manifest(built_images.archive("runtime"))["annotations"]
    for source in (annotations, config["Labels"]):
        assert source["org.opencontainers.image.version"] == versions["MOE_OPERATOR_VERSION"]
        assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", source["org.opencontainers.image.revision"])
        assert source["org.opencontainers.image.source"].startswith("https://")
    packages = built_images.packages("runtime")
    tree = packages.split("# base image")[0]
    assert sorted(re.findall(r"^(moe-[a-z]+)==", tree, re.M)) == [
        "moe-contract",
        "moe-placement",
        "moe-runtime",
    ]


def test_init_container_copies_exactly_the_runtime_tree(
    image_store: Store, runtime_container: str, init_copy: Path
) -> None:
    image_tree = image_store.mount(runtime_container) / RUNTIME_TREE.lstrip("/")
    copied = files(init_copy)
    assert copied == files(image_tree)
    top = {p.name for p in init_copy.iterdir()}
    assert top == {*DISTRIBUTIONS, *(f"{d}-0.1.0.dist-info" for d in DISTRIBUTIONS)}, top
    for package, folder in DISTRIBUTIONS.items():
        source = REPO / folder / package
        checkout = {
            rel: digest
            for rel, digest in files(source).items()
            if "__pycache__" not in rel and not rel.endswith(".pyc")
        }
        shipped = {
            rel: digest for rel, digest in files(init_copy / package).items() if "__pycache__" not in rel
        }
        assert {r for r in checkout if r.endswith(".py")} <= set(shipped), f"{package}: modules missing"
        assert {r: checkout.get(r) for r in shipped} == shipped, f"{package}: differs from the checkout"
    entry_points = (init_copy / "moe_runtime-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert "[sglang.srt.plugins]" in entry_points
    assert not any(p.name in ("moe_operator", "kopf", "kubernetes", "bin") for p in init_copy.rglob("*"))


def test_copied_tree_imports_with_only_the_engine_packages(
    image_store: Store, runtime_container: str, init_copy: Path, built_images: BuiltImages
) -> None:
    pod, _ = rendered_pod(built_images.image("runtime"))
    engine = pod["containers"][0]
    res = engine_run(
        image_store, runtime_container, init_copy, ["python3", "-c", PROBE, RUNTIME_TREE], pod_env(engine)
    )
    assert res.returncode == 0, res.stderr
    probe = json.loads(res.stdout)
    assert probe["failed"] == {}
    assert probe["outside"] == []
    assert probe["modules"] > 20
    assert probe["importable"] == {
        "kopf": False, "kubernetes": False, "moe_operator": False, "moe_sandbox": False,
        "httpx": False, "sglang": False,
    }  # fmt: skip
    assert probe["plugins"] == {"moe_operator_eplb": ["moe_runtime.sglang_plugin:register", RUNTIME_TREE]}
    assert probe["dists"] == ["moe-contract==0.1.0", "moe-placement==0.1.0", "moe-runtime==0.1.0"]


def test_print_args_from_the_copy_matches_the_checkout(
    image_store: Store,
    runtime_container: str,
    init_copy: Path,
    built_images: BuiltImages,
    tmp_path: Path,
) -> None:
    """The engine container's command, as `print-args`, on the config the operator renders."""
    pod, config = rendered_pod(built_images.image("runtime"))
    engine = pod["containers"][0]
    assert engine["command"] == ["python3", "-m", "moe_runtime.cli", "launch"]
    env = pod_env(engine)
    config_dir = tmp_path / "engine"
    config_dir.mkdir()
    (config_dir / "engine.json").write_text(json.dumps(config))
    config_path = env["MOE_ENGINE_CONFIG"]
    argv = [*engine["command"][:-1], "print-args", "--format", "json", "--state-dir", "/tmp/moe-state"]
    res = engine_run(
        image_store, runtime_container, init_copy, argv, env, [f"{config_dir}:{Path(config_path).parent}:ro"]
    )
    assert res.returncode == 0, res.stderr
    in_image = json.loads(res.stdout)["argv"]
    host_env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_", "POD_"))}
    host_env.update({**env, "MOE_ENGINE_CONFIG": str(config_dir / "engine.json")})
    host_env.pop("PYTHONPATH")  # the checkout's runtime, as installed in this venv
    state = tmp_path / "state"
    host = subprocess.run(
        [sys.executable, "-m", "moe_runtime.cli", *argv[3:-1], str(state)],
        capture_output=True, text=True, env=host_env,
    )  # fmt: skip
    assert host.returncode == 0, host.stderr
    expected = [a.replace(str(state), "/tmp/moe-state") for a in json.loads(host.stdout)["argv"]]
    assert in_image == expected
    assert in_image[:3] == ["python3", "-m", "sglang.launch_server"]


def test_runtime_image_passes_the_router_version_check(
    image_store: Store, runtime_container: str, built_images: BuiltImages
) -> None:
    """The router pod's init container, as rendered, in the runtime image: the pinned router is
    the one the operator checks flags for; the same check refuses another version."""
    pins = (REPO / "docker" / "versions.env").read_text()
    assert f"\nSGLANG_ROUTER_VERSION={router_catalog().version}\n" in f"\n{pins}\n"
    pod = rendered_router_pod(built_images.image("runtime"))
    (check,) = pod["initContainers"]
    assert check["image"] == built_images.image("runtime")
    res = image_store.run(runtime_container, check["command"])
    assert res.returncode == 0, res.stderr
    res = image_store.run(runtime_container, [*check["command"][:-1], "0.0.1"])
    assert res.returncode == 1 and "spec.router.image" in res.stderr, res.stderr
    packages = built_images.packages("runtime").split("# base image")[1]
    assert re.search(rf"^sglang-router=={re.escape(router_catalog().version)}$", packages, re.M), packages


def test_router_serves_from_the_runtime_image(
    image_store: Store, runtime_container: str, built_images: BuiltImages, tmp_path: Path
) -> None:
    """The rendered router command in the runtime image (listen ports moved to loopback ports of
    this test, its volumes as fresh directories, the pod's user): /liveness answers 200 and
    /readiness 503 while no worker is up."""
    pod = rendered_router_pod(built_images.image("runtime"))
    (router,) = pod["containers"]
    assert router["image"] == built_images.image("runtime")
    argv = list(router["command"])
    moved = {"--host": "127.0.0.1", "--port": str(ROUTER_PORT), "--prometheus-port": str(ROUTER_METRICS_PORT)}
    argv = [moved.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    volumes = []
    for mount in router.get("volumeMounts", []):
        host = tmp_path / mount["name"]
        host.mkdir(mode=0o777)
        host.chmod(0o777)
        volumes.append(f"{host}:{mount['mountPath']}")
    security = pod.get("securityContext", {})
    user = f"{security['runAsUser']}:{security['runAsGroup']}" if "runAsUser" in security else None
    log = tmp_path / "router.log"
    proc = image_store.start(runtime_container, argv, log, volumes=volumes, user=user)
    base = f"http://127.0.0.1:{ROUTER_PORT}"

    def live() -> bool:
        assert proc.poll() is None, f"router exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        try:
            return httpx.get(f"{base}/liveness", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(live, 90, what="router /liveness in the runtime image")
        assert httpx.get(f"{base}/readiness", timeout=2).status_code == 503
    finally:
        stop(proc)


CASES = sorted(p.stem for p in GOLDEN.glob("*.json") if not p.name.endswith(".args.json"))


@pytest.mark.parametrize("name", CASES)
def test_print_args_from_the_copy_matches_the_goldens(
    name: str, image_store: Store, runtime_container: str, init_copy: Path, tmp_path: Path
) -> None:
    """The launcher goldens (tests/runtime/golden), computed by the image's tree."""
    case = json.loads((GOLDEN / f"{name}.json").read_text())
    inside = "/case"
    spec = case.get("placement")
    if spec:  # the same placement the golden test mounts (tests/runtime/test_launcher_golden.py)
        rng = np.random.default_rng(0)
        m = trivial_map(spec["layers"], spec["experts"], spec["slots"])
        m = np.stack([rng.permutation(row) for row in m])
        doc = {
            "version": spec["version"],
            "generatedAt": "2026-01-01T00:00:00Z",
            "physicalToLogicalMap": m.tolist(),
        }
        (tmp_path / "placement.json").write_text(json.dumps(doc))
    engine = json.loads(json.dumps(case["engine"]).replace("$PLACEMENT", f"{inside}/placement.json"))
    (tmp_path / "engine.json").write_text(json.dumps(engine))
    (tmp_path / "state").mkdir()
    argv = [
        "python3", "-m", "moe_runtime.cli", "print-args", "--format", "json",
        "--config", f"{inside}/engine.json", "--state-dir", f"{inside}/state",
    ]  # fmt: skip
    res = engine_run(image_store, runtime_container, init_copy, argv, case["env"], [f"{tmp_path}:{inside}"])
    assert res.returncode == 0, res.stderr
    got = [
        a.replace(f"{inside}/state", "$STATE_DIR").replace(f"{inside}/placement.json", "$PLACEMENT")
        for a in json.loads(res.stdout)["argv"]
    ]
    assert got == json.loads((GOLDEN / f"{name}.args.json").read_text())
