"""`moe-operator render`: every child object offline, as a YAML stream; and the router it renders
(probes on /liveness and /readiness, start-up budget from spec.engine.startupTimeout, the pinned
sglang-router checked before it starts). tests/runtime/test_rendered_examples.py parses the same
output with the real SGLang and router parsers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_contract.flags import resolve, router_catalog
from moe_operator.cli import main
from moe_operator.render.children import render_children
from moe_operator.render.group import Owner, RuntimeSettings
from moe_operator.render.shared import KEY_PLACEHOLDER, router_objects
from render_cases import TWO_CLIQUE_PLAN, gb200_decode_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


GRANTS = ("--policy", str(REPO / "policies" / "platform" / "examples.yaml"))  # what the examples need


def render(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> list[dict[str, Any]]:
    assert main(["render", *GRANTS, *argv]) == code
    out = capsys.readouterr().out
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_prints_every_child(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    objects = render(capsys, "-f", str(example))
    doc = yaml.safe_load(example.read_text())
    spec = doc["spec"]
    kinds = [o["kind"] for o in objects]
    pools = ["prefill", "decode"] if spec.get("prefill") else ["decode"]
    instances = sum(spec[p].get("replicas", 1) for p in pools)
    assert kinds.count("StatefulSet") == instances
    assert kinds.count("ConfigMap") == len(pools)  # one engine config per pool
    assert kinds.count("Deployment") == 1 and kinds.count("Secret") == 1
    assert {"ServiceAccount", "PodDisruptionBudget", "Service"} <= set(kinds)
    assert not {"Role", "RoleBinding"} & set(kinds)  # engine and router accounts are bound to nothing
    name = doc["metadata"]["name"]
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == "default"
        (ref,) = meta["ownerReferences"]
        assert ref["kind"] == "MoEDeployment" and ref["name"] == name
        assert "moe.inference.dev/spec-hash" in meta.get("annotations", {}) or obj["kind"] == "Secret"
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret["stringData"]["key"] == KEY_PLACEHOLDER, "a preview never holds a real key"
    for config in [o for o in objects if o["kind"] == "ConfigMap"]:
        json.loads(config["data"]["engine.json"])


def test_render_yaml_and_json_agree_and_are_stable(capsys: pytest.CaptureFixture[str]) -> None:
    """-o json is the same objects as a List; the namespace option applies to every object."""
    example = REPO / "examples" / "qwen3-30b-a3b-single-node.yaml"
    objects = render(capsys, "-f", str(example), "-n", "inference")
    assert main(["render", *GRANTS, "-f", str(example), "-n", "inference", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["kind"] == "List" and listed["items"] == objects
    assert {o["metadata"]["namespace"] for o in objects} == {"inference"}
    again = render(capsys, "-f", str(example), "-n", "inference")
    assert again == objects, "rendering is deterministic (stable owner uid, hashes)"


def test_render_group_backend_and_runtime_image(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(REPO / "examples" / "deepseek-v3-gb200.yaml")
    objects = render(capsys, "-f", example, "--group-backend", "LeaderWorkerSet", "--runtime-image", "rt:1")
    kinds = [o["kind"] for o in objects]
    assert "StatefulSet" not in kinds and kinds.count("LeaderWorkerSet") == 4
    assert "rt:1" in json.dumps(objects)


def test_render_against_a_nodes_file_reports_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = {
        "rackLabel": "topology.kubernetes.io/zone",
        "pools": [
            {"name": "h100", "count": 9, "nodesPerRack": 9, "rackPrefix": "r", "gpusPerNode": 8,
             "gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpuMemoryMiB": 81559, "cpu": "208", "memory": "1800Gi",
             "extraResources": {"rdma/ib": "1000"}}
        ],
    }  # fmt: skip
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(nodes))
    example = str(REPO / "examples" / "deepseek-v3-pd-h100.yaml")
    assert main(["render", *GRANTS, "-f", example, "--nodes", str(path)]) == 3
    captured = capsys.readouterr()
    objects = [d for d in yaml.safe_load_all(captured.out) if d]
    assert [o["kind"] for o in objects].count("StatefulSet") < 3, "no group for an instance that waits"
    assert "waits for capacity" in captured.err


def test_render_refuses_an_invalid_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load((REPO / "examples" / "deepseek-v3-pd-h100.yaml").read_text())
    doc["spec"]["decode"]["extraArgs"] = ["--cuda-graph-max-bs", "128"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", *GRANTS, "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "spec.decode.extraArgs[0]" in captured.err and "ambiguous" in captured.err


def test_render_applies_the_platform_policy(capsys: pytest.CaptureFixture[str]) -> None:
    """The same grants as the operator's: refused under the defaults (the message points at
    --policy), admitted with the examples' grants, refused again in a namespace they do not cover."""
    example = str(REPO / "examples" / "qwen3-235b-fp8-pd-h200-roce.yaml")  # hostNetwork from its profile
    assert main(["render", "-f", example]) == 1
    err = capsys.readouterr().err
    assert "spec.topology.hostNetwork" in err and "see --policy" in err
    assert main(["render", *GRANTS, "-f", example]) == 0
    capsys.readouterr()
    assert main(["render", *GRANTS, "-f", example, "-n", "web"]) == 1
    assert "platform.hostNetworkNamespaces" in capsys.readouterr().err
    assert main(["render", "--policy", "/nonexistent.yaml", "-f", example]) == 2


# --------------------------------------------------------------------------- the router


OWNER = Owner("m", "ns", "uid-1")


def _router(spec: Any) -> dict[str, Any]:
    deployment = next(o for o in router_objects(spec, OWNER) if o["kind"] == "Deployment")
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def test_router_probes_use_liveness_and_readiness() -> None:
    (container,) = _router(gb200_decode_spec())["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert container["livenessProbe"]["httpGet"]["path"] == "/liveness"


def test_router_waits_for_workers_as_long_as_the_startup_budget() -> None:
    spec = gb200_decode_spec().model_copy(deep=True)
    spec.engine.startup_timeout = "1h15m"
    spec.router.extra_args = ["--max-concurrent-requests", "64"]
    (container,) = _router(spec)["containers"]
    command = container["command"]
    args = command[3:]
    assert args[args.index("--worker-startup-timeout-secs") + 1] == "4500"
    assert args[-2:] == ["--max-concurrent-requests", "64"], "user flags come last"
    resolution = resolve(router_catalog(), args)
    assert resolution.ok, resolution.errors
    assert resolution.last("worker_startup_timeout_secs").value == 4500  # type: ignore[union-attr]


def test_a_replaced_router_finishes_its_requests_before_the_kubelet_kills_it() -> None:
    """Each worker-list change replaces the router pods. The kubelet's grace covers the pre-stop wait
    (the Service stops sending first) and sglang-router's own shutdown grace, its default or the
    user's ``--shutdown-grace-period-secs`` under any spelling the router's parser takes."""
    spec = gb200_decode_spec()
    pod = _router(spec)
    (container,) = pod["containers"]
    wait = container["lifecycle"]["preStop"]["exec"]["command"]
    assert wait[:2] == ["python3", "-c"] and "sleep(5)" in wait[2]
    default = router_catalog().flag("--shutdown-grace-period-secs").default
    assert default == 180  # sglang-router 0.3.2's own
    assert pod["terminationGracePeriodSeconds"] == 5 + default + 30
    longer = spec.model_copy(deep=True)
    longer.router.extra_args = ["--shutdown-grace-period=900"]
    assert _router(longer)["terminationGracePeriodSeconds"] == 5 + 900 + 30
    longer.router.extra_args = ["--shutdown-grace-period-secs", "60", "--shutdown-grace-period-secs", "1200"]
    assert _router(longer)["terminationGracePeriodSeconds"] == 5 + 1200 + 30  # the last one wins


def test_router_checks_the_pinned_router_version_first() -> None:
    spec = gb200_decode_spec()
    pod = _router(spec)
    (check,) = pod["initContainers"]
    assert check["image"] == pod["containers"][0]["image"]
    assert check["command"][:2] == ["python3", "-c"] and check["command"][-1] == router_catalog().version
    pins = dict(
        line.split("=", 1)
        for line in (REPO / "docker" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert check["command"][-1] == pins["SGLANG_ROUTER_VERSION"]


def test_router_is_in_the_reconcilers_children() -> None:
    objects = render_children(gb200_decode_spec(), OWNER, TWO_CLIQUE_PLAN, RuntimeSettings())
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["initContainers"][0]["name"] == "router-version"
