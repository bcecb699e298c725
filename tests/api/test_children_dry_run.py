"""Whatever admission accepts must reconcile: every child the operator would create for an accepted
spec passes the real kube-apiserver's own validation (server-side dry run, nothing is created).

A property over seeded specs, not only the examples (tests/api/spec_generator.py): the examples,
COUNT generated mutations of them within the schema (names, namespaces, label keys and values,
quantities at their limits...), and one spec per edge case (a value the schema lets through whose
Kubernetes validity is the question). For each spec ``validate`` admits under the platform grants
the session's operator runs with (EXAMPLE_GRANTS):

1. the apiserver admits it too (CRD schema, CEL rules, the operator's webhook; dry run), under a
   plain name as well (a refusal for the name alone means it is never created: no children);
2. every child rendered for it (StatefulSet and LeaderWorkerSet group backends, as its
   spec.topology.groupBackend allows; PodMonitor and PrometheusRule; ComputeDomains where the
   hardware needs them; the runtime Secret and the control loop's placement ConfigMaps) is accepted
   by a dry-run create with strict field validation, in the namespace it would live in, and comes
   back owned by the MoEDeployment;
3. the pods the StatefulSet (and LeaderWorkerSet) controllers would make of each group, named and
   labelled as those controllers name and label them, are accepted too.

Instances are planned on the sandbox's default node pools (as `moe-operator render` does), with the
spec's own nodeSelector, rack and NVLink-domain label keys put on those nodes (a cluster labelled
for the spec). An instance that waits for capacity is rendered on made-up nodes of the domain it
needs: it is what the operator creates once capacity comes. Of each pool the lowest and highest
instance index and one instance per kind of domain are sent (instances differ only in index and
nodes). What the apiserver accepts with a warning (a duplicate port...) is printed, not failed.

The LeaderWorkerSet controller (with its webhooks), the Prometheus Operator's CRDs and the
ComputeDomain CRD are installed for this module and removed afterwards; the session's operator
restarts then (a deleted CRD it watches can stop it; docs/operator.md, Optional APIs).
"""

from __future__ import annotations

import argparse
import copy
import inspect
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import httpx
import pytest

from moe_operator.api import MoEDeploymentSpec
from moe_operator.api import keys as K
from moe_operator.control.publish import configmaps, history_configmap
from moe_operator.hardware import lookup_profile
from moe_operator.render.children import render_children
from moe_operator.render.group import GroupBackend, Owner, RuntimeSettings
from moe_operator.render.shared import token_secret
from moe_operator.topology import nodepools
from moe_operator.topology.planner import InstanceSite, TopologyPlan, plan_topology
from moe_operator.topology.requests import pool_requests, topology_policy
from moe_operator.topology.snapshot import NodeInfo, node_from_object
from moe_operator.validation import PlatformPolicy, validate
from moe_operator.validation.platform import add_flags
from moe_sandbox import leaderworkerset as lws
from moe_sandbox import prometheus_operator
from moe_sandbox.cluster import Sandbox
from operator_harness import EXAMPLE_GRANTS, OperatorProcess, install_crd, moed_path

from .spec_generator import Generated, generate

compute_domain: ModuleType | None
try:  # the fake NVIDIA DRA driver (ComputeDomain CRD), where this checkout has it
    from moe_sandbox import compute_domain
except ImportError:  # pragma: no cover - older sandbox package
    compute_domain = None

pytestmark = pytest.mark.cluster

SEED = 1
COUNT = 40
MIN_ACCEPTED = 30
"""Of the COUNT generated specs at least this many must be admitted by ``validate`` (the edge cases
may rightly be refused): otherwise the property holds of too little."""
WORKERS = 8  # concurrent dry-run requests (one client; the apiserver shares the machine's cores)
DRY_RUN = {"dryRun": "All", "fieldValidation": "Strict"}
SETTINGS = RuntimeSettings()
MONITORING = ("PodMonitor", "PrometheusRule")
REVISION_HASH = "9" * 10
"""The longest controller-revision-hash suffix the StatefulSet controller appends (a uint32 in decimal,
rand.SafeEncodeString): the pods' ``controller-revision-hash`` label is ``<statefulset>-<hash>``."""
PENDING = "pending-"
"""Names of the made-up nodes and domains of instances that wait for capacity."""


def example_policy() -> PlatformPolicy:
    """The platform policy of the session's operator (its --host-path-prefixes ... flags)."""
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return PlatformPolicy.from_args(parser.parse_args(list(EXAMPLE_GRANTS)))


# --------------------------------------------------------------------------- the sandbox


@dataclass
class World:
    """The sandbox as this module uses it: one client, its namespaces, what it serves."""

    api: httpx.Client
    namespaces: tuple[str, ...]
    compute_domains: bool
    paths: dict[tuple[str, str], str | None] = field(default_factory=dict)
    warnings: dict[str, list[str]] = field(default_factory=dict)
    """Warnings the apiserver answered dry runs with (accepted all the same), by reason: which
    children (or pods) got each."""

    def collection(self, api_version: str, kind: str, namespace: str) -> str | None:
        """The REST path to create ``kind`` in ``namespace``, from discovery; None if not served."""
        key = (api_version, kind)
        if key not in self.paths:
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            resp = self.api.get(prefix)
            resources = resp.json().get("resources", []) if resp.status_code == 200 else []
            plural = next((r["name"] for r in resources if r["kind"] == kind and "/" not in r["name"]), None)
            self.paths[key] = f"{prefix}/namespaces/{{ns}}/{plural}" if plural else None
        path = self.paths[key]
        return None if path is None else path.format(ns=namespace)


def _namespaces() -> tuple[str, ...]:
    """A short namespace, one of 40 characters and one at the 63-character limit; all t-* (the
    session operator grants host networking there)."""
    tag = uuid.uuid4().hex[:8]
    return tuple((f"t-{tag}-" + "n" * 63)[:length].rstrip("-") for length in (10, 40, 63))


@pytest.fixture(scope="module")
def world(sandbox: Sandbox, moe_operator: OperatorProcess) -> Iterator[World]:
    started = time.monotonic()
    install_crd(sandbox)
    lws.install(sandbox, log=lambda _m: None)
    prometheus_operator.install(sandbox, log=lambda _m: None)
    if compute_domain is not None:
        compute_domain.install(sandbox, log=lambda _m: None)
    namespaces = _namespaces()
    try:
        with sandbox.client(timeout=60) as api:
            for ns in namespaces:
                api.post("/api/v1/namespaces", json={"metadata": {"name": ns}}).raise_for_status()
            print(
                f"\n[children dry run] optional APIs and namespaces ready in {time.monotonic() - started:.1f}s"
            )
            yield World(api, namespaces, compute_domain is not None)
            for ns in namespaces:
                api.delete(f"/api/v1/namespaces/{ns}")
    finally:
        stopping = time.monotonic()
        lws.uninstall(sandbox, log=lambda _m: None)
        prometheus_operator.uninstall(sandbox)
        if compute_domain is not None:
            compute_domain.uninstall(sandbox, log=lambda _m: None)
        removed = time.monotonic()
        moe_operator.restart()
        print(
            f"\n[children dry run] optional APIs removed in {removed - stopping:.1f}s, "
            f"operator restarted in {time.monotonic() - removed:.1f}s"
        )


# --------------------------------------------------------------------------- rendering


def _base_nodes() -> list[dict[str, Any]]:
    objects = nodepools.render_nodes(nodepools.load())
    for o in objects:
        o["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return objects


BASE_NODES = _base_nodes()
BASE_LABELS = {k for o in BASE_NODES for k in o["metadata"]["labels"]}


def nodes_for(spec: MoEDeploymentSpec) -> list[NodeInfo]:
    """The sandbox's node pools, labelled for ``spec``: its nodeSelector keys the pools lack on every
    node, its rack and NVLink-domain label keys beside the pools' own."""
    topo = spec.topology
    extra = {k: v for k, v in topo.node_selector.items() if k not in BASE_LABELS}
    out = []
    for o in BASE_NODES:
        node = copy.deepcopy(o)
        labels = node["metadata"]["labels"]
        labels.update(extra)
        for label, same_as in (
            (topo.rack_label, "topology.kubernetes.io/zone"),
            (topo.nvlink_domain_label, nodepools.CLIQUE_LABEL),
        ):
            if same_as in labels:
                labels.setdefault(label, labels[same_as])
        out.append(node_from_object(node))
    return out


def sites_to_send(spec: MoEDeploymentSpec, plan: TopologyPlan) -> tuple[InstanceSite, ...]:
    """Per pool: the lowest and highest instance index and one instance of each kind of domain;
    instances that wait are placed on made-up nodes of the domain they need."""
    requests = {r.pool: r for r in pool_requests(spec)}
    topo = spec.topology
    sites = list(plan.sites)
    for w in plan.waiting:
        req = requests[w.pool]
        stem = f"{PENDING}{w.pool}-{w.index}"
        if req.nodes_per_instance == 1 and not req.needs_multi_node_nvlink:
            sites.append(InstanceSite(w.pool, w.index, "node", "kubernetes.io/hostname", stem, (stem,)))
            continue
        nodes = tuple(f"{stem}-{r}" for r in range(req.nodes_per_instance))
        if req.needs_multi_node_nvlink:
            sites.append(
                InstanceSite(w.pool, w.index, "nvlink", topo.nvlink_domain_label, f"{PENDING}nvl.0", nodes)
            )
        else:
            sites.append(InstanceSite(w.pool, w.index, "rack", topo.rack_label, f"{PENDING}rack-0", nodes))
    chosen: dict[tuple[str, int], InstanceSite] = {}
    for pool in requests:
        mine = sorted((s for s in sites if s.pool == pool), key=lambda s: s.index)
        if not mine:
            continue
        picks = [mine[0], mine[-1], *({s.kind: s for s in reversed(mine)}.values())]
        chosen.update((s.key, s) for s in picks)
    return tuple(sorted(chosen.values(), key=lambda s: s.key))


def backends(spec: MoEDeploymentSpec) -> tuple[GroupBackend, ...]:
    """The group backends the operator may use for ``spec`` (auto: either, by what is served)."""
    wanted = spec.topology.group_backend
    return ("StatefulSet", "LeaderWorkerSet") if wanted == "auto" else (wanted,)


_RENDER_TAKES_COMPUTE_DOMAIN = "compute_domain" in inspect.signature(render_children).parameters


@dataclass(frozen=True)
class Child:
    case: Generated
    backend: str
    """The group backends whose render holds this object (StatefulSet+LeaderWorkerSet: both)."""
    obj: dict[str, Any]

    @property
    def title(self) -> str:
        meta = self.obj["metadata"]
        pending = PENDING in meta.get("annotations", {}).get(K.INSTANCE_NODES, "")
        where = " (an instance waiting for capacity, on made-up nodes)" if pending else ""
        return f"[{self.backend}] {self.obj['kind']} {meta['namespace']}/{meta['name']}{where}"


def render(case: Generated, world: World) -> list[Child]:
    """Every child the operator would create for ``case``, once per (kind, name, content)."""
    spec = MoEDeploymentSpec.model_validate(case.spec)
    owner = Owner(
        case.name, case.namespace, str(uuid.uuid5(uuid.NAMESPACE_URL, f"{case.namespace}/{case.name}"))
    )
    plan = plan_topology(pool_requests(spec), nodes_for(spec), topology_policy(spec))
    plan = TopologyPlan(sites_to_send(spec, plan), ())
    extra: dict[str, Any] = {}
    if _RENDER_TAKES_COMPUTE_DOMAIN:
        hardware = spec.topology.hardware
        extra["compute_domain"] = world.compute_domains and bool(
            hardware and lookup_profile(hardware).compute_domain
        )
    rendered: dict[tuple[str, str, str], tuple[dict[str, Any], list[str]]] = {}
    for backend in backends(spec):
        objects = render_children(
            spec, owner, plan, SETTINGS, None, backend=backend, monitoring=MONITORING, **extra
        )
        for obj in objects:
            key = (obj["kind"], obj["metadata"]["name"], obj["metadata"]["annotations"][K.SPEC_HASH])
            rendered.setdefault(key, (obj, []))[1].append(backend)
    out = [Child(case, "+".join(with_backends), obj) for obj, with_backends in rendered.values()]
    # Created outside render_children: the runtime Secret (once), the control loop's ConfigMaps.
    later = [token_secret(owner, bytes(range(32)))]
    for pool in ("prefill", "decode") if spec.prefill is not None else ("decode",):
        later += configmaps(owner, pool, {"version": 7}, {"reason": "generated"})
        later.append(history_configmap(owner, pool, "{}"))
    return [*out, *(Child(case, "control loop", o) for o in later)]


GROUP_KINDS = ("StatefulSet", "LeaderWorkerSet")


# --------------------------------------------------------------------------- the cases


@dataclass
class Cases:
    generated: list[Generated]
    refused_by_validate: dict[int, list[str]]
    disagreements: dict[int, str]
    """Admitted by ``validate`` but refused by the apiserver for the spec (the same spec under a
    plain name is refused too): the CRD's rules and ``validate`` should be the same rules."""
    refused_for_metadata: dict[int, str]
    """Refused by the apiserver for the MoEDeployment's name alone: never created, no children."""
    checked: list[Generated]
    """Whose children are checked: admitted by ``validate`` and not refused for their name."""
    children: list[Child]
    seconds: dict[str, float]


def _admit(world: World, case: Generated, name: str | None = None) -> str | None:
    """None if the apiserver admits the MoEDeployment (dry run: schema, CEL, the operator's webhook),
    else its answer; ``name`` replaces the case's own."""
    obj = case.obj if name is None else {**case.obj, "metadata": {"name": name}}
    resp = world.api.post(moed_path(case.namespace), json=obj, params=DRY_RUN)
    return None if resp.status_code in (200, 201) else f"{resp.status_code} {_message(resp)}"


def _dry_run(world: World, path: str, obj: dict[str, Any], child: Child) -> httpx.Response:
    """POST ``obj`` as a dry run; its warnings are kept in ``world.warnings``."""
    resp = world.api.post(path, json=obj, params=DRY_RUN)
    for warning in resp.headers.get_list("warning"):
        text = warning.removeprefix('299 - "').removesuffix('"')
        where = f"spec #{child.case.index} {obj['kind']} {obj['metadata']['name']}"
        world.warnings.setdefault(_reason(text), []).append(where)
    return resp


def _print_warnings(world: World) -> None:
    """What the apiserver accepted but warned about (duplicate ports, deprecated fields...)."""
    for reason, where in sorted(world.warnings.items()):
        print(f"[children dry run] warning x{len(where)}: {reason} (first: {where[0]})")
    world.warnings.clear()


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json().get("message", resp.text))
    except ValueError:
        return resp.text


@pytest.fixture(scope="module")
def cases(world: World) -> Cases:
    started = time.monotonic()
    policy = example_policy()
    generated = generate(SEED, COUNT, world.namespaces)
    refused: dict[int, list[str]] = {}
    accepted = []
    for case in generated:
        problems = validate(case.spec, policy=policy, namespace=case.namespace)
        if problems:
            refused[case.index] = [str(p) for p in problems]
        else:
            accepted.append(case)
    validated = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        as_named = list(pool.map(lambda c: _admit(world, c), accepted))
        plainly_named = list(pool.map(lambda c: _admit(world, c, f"plain-{c.index}"), accepted))
    disagreements: dict[int, str] = {}
    for_metadata: dict[int, str] = {}
    for case, named, plain in zip(accepted, as_named, plainly_named, strict=True):
        if plain is not None:
            disagreements[case.index] = plain
        elif named is not None:
            for_metadata[case.index] = named
    checked = [c for c in accepted if c.index not in for_metadata]
    admission_done = time.monotonic()
    children = [child for case in checked for child in render(case, world)]
    rendered = time.monotonic()
    seconds = {
        "generate+validate": validated - started,
        "admission dry runs": admission_done - validated,
        "render": rendered - admission_done,
    }
    return Cases(generated, refused, disagreements, for_metadata, checked, children, seconds)


def _report(failures: list[tuple[Child | Generated, str]], what: str, total: int) -> str:
    """Failures grouped by spec (its mutations once), with a tally by kind and reason first."""
    reasons = Counter(
        (item.obj["kind"] if isinstance(item, Child) else "MoEDeployment", _reason(msg))
        for item, msg in failures
    )
    lines = [f"{len(failures)} of {total} {what}; by kind and reason:"]
    lines += [f"  {n} x {kind}: {reason}" for (kind, reason), n in reasons.most_common()]
    by_case: dict[int, list[str]] = {}
    described: dict[int, str] = {}
    for item, msg in failures:
        case = item.case if isinstance(item, Child) else item
        described[case.index] = case.describe()
        title = item.title if isinstance(item, Child) else f"MoEDeployment {case.namespace}/{case.name}"
        by_case.setdefault(case.index, []).append(f"  {title}:\n      {msg}")
    for index in sorted(by_case):
        lines += ["", described[index], *by_case[index]]
    return "\n".join(lines)


def _reason(message: str) -> str:
    """A message without its object names and values, to count alike refusals together."""
    text = message.split(" is invalid: ", 1)[-1]
    text = re.sub(r'"[^"]*"', '"…"', text)
    return re.sub(r"\b[0-9]+\b", "N", text)[:300]


# --------------------------------------------------------------------------- the properties


def test_generated_specs_are_admitted(cases: Cases) -> None:
    """The generator is not vacuous, and what ``validate`` admits the apiserver admits too (the CRD's
    schema and CEL rules, and the operator's webhook, are meant to be the same rules)."""
    refused = "\n".join(
        f"  #{i}: {problems[0][:200]}" for i, problems in sorted(cases.refused_by_validate.items())
    )
    kinds = Counter(c.kind for c in cases.generated)
    admitted = Counter(c.kind for c in cases.generated if c.index not in cases.refused_by_validate)
    print(
        f"\n[children dry run] {len(cases.generated)} specs ("
        + ", ".join(f"{n} {k}" for k, n in kinds.items())
        + f"; seed {SEED}); admitted by validate: "
        + ", ".join(f"{admitted[k]} {k}" for k in kinds)
        + f"; refused by the apiserver: {len(cases.disagreements)} for the spec, "
        f"{len(cases.refused_for_metadata)} for the name; "
        f"children of {len(cases.checked)} specs checked: {len(cases.children)}; "
        + ", ".join(f"{k} {v:.1f}s" for k, v in cases.seconds.items())
        + (f"\n  refused by validate:\n{refused}" if refused else "")
    )
    assert admitted["example"] == kinds["example"], refused
    assert admitted["generated"] >= MIN_ACCEPTED, (
        f"only {admitted['generated']} of {kinds['generated']} generated specs admitted:\n{refused}"
    )
    by_index = {c.index: c for c in cases.generated}
    failures: list[tuple[Child | Generated, str]] = [
        (by_index[i], msg) for i, msg in sorted(cases.disagreements.items())
    ]
    if failures:
        what = "specs admitted by validate() refused by the apiserver (under a plain name too)"
        pytest.fail(_report(failures, what, len(cases.generated) - len(cases.refused_by_validate)), False)


def test_every_child_passes_the_apiservers_validation(world: World, cases: Cases) -> None:
    """Each child, created with dryRun=All and strict field validation in its namespace, is accepted
    and comes back owned by its MoEDeployment (the only controller reference)."""
    started = time.monotonic()
    unserved = sorted(
        {
            (c.obj["apiVersion"], c.obj["kind"])
            for c in cases.children
            if world.collection(c.obj["apiVersion"], c.obj["kind"], c.case.namespace) is None
        }
    )
    assert not unserved, f"the sandbox serves no {unserved}: install its CRD in the world fixture"
    kinds = Counter(c.obj["kind"] for c in cases.children)
    assert {"StatefulSet", "LeaderWorkerSet", "PodMonitor", "PrometheusRule"} <= set(kinds), kinds

    def dry_run(child: Child) -> str | None:
        obj = child.obj
        path = world.collection(obj["apiVersion"], obj["kind"], child.case.namespace)
        assert path is not None
        resp = _dry_run(world, path, obj, child)
        if resp.status_code not in (200, 201):
            return f"{resp.status_code} {_message(resp)}"
        meta = resp.json()["metadata"]
        want = obj["metadata"]["ownerReferences"]
        if meta.get("ownerReferences") != want or len(want) != 1:
            return f"owner references {meta.get('ownerReferences')} instead of {want}"
        owner = want[0]
        if (owner["kind"], owner["name"], owner.get("controller")) != (
            "MoEDeployment",
            child.case.name,
            True,
        ):
            return f"owned by {owner}, not controlled by MoEDeployment {child.case.name}"
        if meta.get("namespace") != child.case.namespace:
            return f"in namespace {meta.get('namespace')}, not {child.case.namespace}"
        return None

    with ThreadPoolExecutor(WORKERS) as pool:
        answers = list(pool.map(dry_run, cases.children))
    print(
        f"\n[children dry run] {len(cases.children)} children of {len(cases.checked)} specs sent in "
        f"{time.monotonic() - started:.1f}s: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    )
    _print_warnings(world)
    failures: list[tuple[Child | Generated, str]] = [
        (c, a) for c, a in zip(cases.children, answers, strict=True) if a is not None
    ]
    if failures:
        pytest.fail(
            _report(failures, "children refused by the apiserver (dry run)", len(cases.children)), False
        )


def group_pods(child: Child) -> list[dict[str, Any]]:
    """The pods the controllers make of one group object, with the names and labels they give them.

    StatefulSet: pod ``<sts>-<ordinal>`` (the last ordinal), labels ``controller-revision-hash:
    <sts>-<hash>``, ``statefulset.kubernetes.io/pod-name`` and ``apps.kubernetes.io/pod-index``,
    hostname and subdomain. LeaderWorkerSet (one group, index 0): its leader StatefulSet ``<lws>``
    makes pod ``<lws>-0``; the worker StatefulSet, named after the leader pod ``<lws>-0``, makes
    ``<lws>-0-<worker>``. Each with the longest revision hash. The LeaderWorkerSet controller's own
    labels (bounded hashes) are left out, so its pod webhooks are not asked about pods it never saw.
    """
    obj = child.obj
    if obj["kind"] == "StatefulSet":
        spec = obj["spec"]
        return [
            _pod(obj["metadata"]["name"], spec["replicas"] - 1, spec["template"], spec["serviceName"], child)
        ]
    lwt = obj["spec"]["leaderWorkerTemplate"]
    name = obj["metadata"]["name"]
    template = lwt.get("leaderTemplate") or lwt["workerTemplate"]
    pods = [_pod(name, 0, template, name, child)]
    if lwt["size"] > 1:
        pods.append(_pod(f"{name}-0", lwt["size"] - 1, lwt["workerTemplate"], name, child))
    return pods


def _pod(sts: str, ordinal: int, template: dict[str, Any], subdomain: str, child: Child) -> dict[str, Any]:
    name = f"{sts}-{ordinal}"
    meta = template.get("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": child.case.namespace,
            "labels": {
                **meta.get("labels", {}),
                "controller-revision-hash": f"{sts}-{REVISION_HASH}",
                "statefulset.kubernetes.io/pod-name": name,
                K.POD_INDEX: str(ordinal),
            },
            "annotations": dict(meta.get("annotations", {})),
        },
        "spec": {**copy.deepcopy(template["spec"]), "hostname": name, "subdomain": subdomain},
    }


def test_pods_of_every_group_pass_the_apiservers_validation(world: World, cases: Cases) -> None:
    """The pods the group controllers create: their names and controller labels must fit too.

    Pod admission needs the pod's ServiceAccount to exist: the runtime ServiceAccounts are created
    for real (without owner), the pods are a dry run."""
    groups = [c for c in cases.children if c.obj["kind"] in GROUP_KINDS]
    created: set[tuple[str, str]] = set()
    pods: list[tuple[Child, dict[str, Any]]] = [(c, p) for c in groups for p in group_pods(c)]
    for child, pod in pods:
        key = (child.case.namespace, pod["spec"]["serviceAccountName"])
        if key not in created:
            created.add(key)
            account = {"metadata": {"name": key[1]}, "automountServiceAccountToken": False}
            resp = world.api.post(f"/api/v1/namespaces/{key[0]}/serviceaccounts", json=account)
            assert resp.status_code in (201, 409), resp.text

    def dry_run(item: tuple[Child, dict[str, Any]]) -> str | None:
        child, pod = item
        resp = _dry_run(world, f"/api/v1/namespaces/{child.case.namespace}/pods", pod, child)
        return (
            None
            if resp.status_code in (200, 201)
            else f"pod {pod['metadata']['name']}: {resp.status_code} {_message(resp)}"
        )

    started = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        answers = list(pool.map(dry_run, pods))
    print(
        f"\n[children dry run] {len(pods)} pods of {len(groups)} groups sent in {time.monotonic() - started:.1f}s"
    )
    _print_warnings(world)
    failures: list[tuple[Child | Generated, str]] = [
        (child, a) for (child, _), a in zip(pods, answers, strict=True) if a is not None
    ]
    if failures:
        pytest.fail(_report(failures, "group pods refused by the apiserver (dry run)", len(pods)), False)
