"""ComputeDomains for multi-node NVLink: one per NVLink domain used, each pod claims its domain's channel."""

from __future__ import annotations

from moe_operator.render.children import render_children
from moe_operator.render.group import Owner, RuntimeSettings
from render_cases import TWO_CLIQUE_PLAN, gb200_decode_spec

OWNER = Owner("ds", "ns", "uid-1")


def test_one_domain_per_clique_and_every_pod_claims_its_own() -> None:
    objects = render_children(
        gb200_decode_spec(), OWNER, TWO_CLIQUE_PLAN, RuntimeSettings(), compute_domain=True
    )
    domains = [o for o in objects if o["kind"] == "ComputeDomain"]
    assert len(domains) == 2 and {d["spec"]["numNodes"] for d in domains} == {0}  # immutable spec: never 4
    assert all(d["metadata"]["ownerReferences"][0]["uid"] == "uid-1" for d in domains)
    templates = {d["spec"]["channel"]["resourceClaimTemplate"]["name"] for d in domains}
    claimed = set()
    for sts in (o for o in objects if o["kind"] == "StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        (claim,) = pod["resourceClaims"]
        assert pod["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]
        claimed.add(claim["resourceClaimTemplateName"])
    assert claimed == templates, "each instance claims the channel of its own clique's domain"


def test_without_the_api_nothing_is_claimed() -> None:
    objects = render_children(gb200_decode_spec(), OWNER, TWO_CLIQUE_PLAN, RuntimeSettings())
    assert not [o for o in objects if o["kind"] == "ComputeDomain"]
    assert all(
        "resourceClaims" not in o["spec"]["template"]["spec"] for o in objects if o["kind"] == "StatefulSet"
    )
