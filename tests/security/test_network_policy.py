"""The engine pods' NetworkPolicy on the sandbox apiserver (issue 15, item 4): created with the
deployment by the real operator, owned by it, pruned when the platform turns it off
(--no-network-policy), and valid for the apiserver in every variant the flags allow. Which peers
it admits on which ports is judged in tests/render/test_render_network.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml
from rendered import EXAMPLES, example_spec
from test_hostile_pods import REPO

from moe_operator.render.group import Owner
from moe_operator.render.network import NetworkSettings, Peer, network_policy
from moe_sandbox.testing import wait_for
from operator_harness import OperatorProcess, moed_path

pytestmark = pytest.mark.cluster

NETPOL = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"


def _spec(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((REPO / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    obj["metadata"]["name"] = name
    return obj


def test_operator_creates_owns_and_prunes_the_policy(
    api: httpx.Client, namespace: str, moe_operator: OperatorProcess
) -> None:
    assert api.post(moed_path(namespace), json=_spec("np")).status_code == 201
    moed = api.get(moed_path(namespace, "np")).json()
    path = NETPOL.format(ns=namespace) + "/np-engines"
    got = wait_for(
        lambda: api.get(path).status_code == 200 and api.get(path).json(), 60, what="NetworkPolicy"
    )
    (owner,) = got["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "MoEDeployment", "np", moed["metadata"]["uid"], True,
    )  # fmt: skip
    # What the apiserver stored is what the renderer made (defaults included: nothing dropped).
    # (the operator writes the policy before the StatefulSet: wait for that one too)
    (sts,) = wait_for(
        lambda: api.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets").json()["items"],
        60,
        what="the engines' StatefulSet",
    )
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert got["spec"]["podSelector"]["matchLabels"].items() <= labels.items(), "selects the engine pods"
    assert got["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["port"] for rule in got["spec"]["ingress"] for p in rule.get("ports", [])}
    assert ports == {30000, 9400, 9402}

    # The platform turns it off: the operator deletes the one it rendered, and nothing else.
    saved = moe_operator.extra_args  # the session's grants stay: later tests rely on them
    moe_operator.extra_args = (*saved, "--no-network-policy")
    try:
        moe_operator.restart()
        wait_for(lambda: api.get(path).status_code == 404, 60, what="NetworkPolicy pruned")
        assert api.get(f"/apis/apps/v1/namespaces/{namespace}/statefulsets").json()["items"], "engines stay"
    finally:
        moe_operator.extra_args = saved
        moe_operator.restart()
    # ... and back on: rendered again.
    wait_for(lambda: api.get(path).status_code == 200, 60, what="NetworkPolicy rendered again")


@pytest.mark.parametrize(
    "net",
    [
        NetworkSettings(),
        NetworkSettings(prometheus=Peer({}, {})),  # Prometheus anywhere
        NetworkSettings(operator=Peer({"kubernetes.io/metadata.name": "ops"}, {"a.example.com/b": "c"})),
    ],
    ids=["defaults", "any-prometheus", "custom-operator"],
)
def test_every_rendered_policy_passes_the_apiservers_validation(
    api: httpx.Client, namespace: str, net: NetworkSettings
) -> None:
    """Server-side dry run of each example's policy as the flags may shape it."""
    for example in EXAMPLES:
        policy = network_policy(example_spec(example), Owner("np", namespace, "uid-1"), net)
        del policy["metadata"]["ownerReferences"]  # no such owner here; the operator's own test has one
        resp = api.post(NETPOL.format(ns=namespace), params={"dryRun": "All"}, json=policy)
        assert resp.status_code == 201, f"{example}: {resp.text}"
        assert resp.json()["spec"]["ingress"] == policy["spec"]["ingress"], (
            "nothing dropped or defaulted away"
        )
