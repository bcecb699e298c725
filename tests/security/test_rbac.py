"""The operator ServiceAccount's effective permissions on a real API server equal the committed
allowlist (rbac-allowlist.yaml), with and without operator.watchNamespaces: the chart's RBAC is
applied (`helm template | kubectl apply`) and listed with `kubectl auth can-i --list` as that
ServiceAccount in the release namespace, watched namespaces and an unwatched one. With
watchNamespaces the real operator, run with that ServiceAccount's token as the chart runs it (elected
through the chart's KopfPeerings, its webhook certificate kept in the chart's Secret), reconciles a
deployment in a watched namespace and never touches one elsewhere (the cluster-wide case runs in
tests/charts' helm install test)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from moe_sandbox.cluster import Sandbox
from moe_sandbox.testing import wait_for
from moe_sandbox.toolchain import binary_path
from sa_operator import WEBHOOK_CONFIG, ServiceAccountOperator, shared_operator_paused  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "moe-operator"
ALLOWLIST = Path(__file__).resolve().parent / "rbac-allowlist.yaml"
MOED = "/apis/moe.inference.dev/v1alpha1"

Rule = tuple[str, tuple[str, ...], tuple[str, ...]]  # (resource, resource names, non-resource URLs)
_ROW = re.compile(r"^(\S*)\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$")


def kubectl(box: Sandbox, *args: str, stdin: str | None = None) -> str:
    exe = binary_path("kubectl")
    assert exe.exists(), f"{exe} missing: build it with `moe-sandbox build` (e2e/setup.sh does)"
    proc = subprocess.run(
        [str(exe), "--kubeconfig", str(box.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def effective_permissions(box: Sandbox, user: str, namespace: str) -> dict[Rule, set[str]]:
    """`kubectl auth can-i --list` as ``user`` in ``namespace``: rule -> verbs (rows merged)."""
    out = kubectl(box, "auth", "can-i", "--list", "--as", user, "--namespace", namespace)
    lines = out.splitlines()
    assert lines[0].split() == ["Resources", "Non-Resource", "URLs", "Resource", "Names", "Verbs"], lines[0]
    rules: dict[Rule, set[str]] = {}
    for line in lines[1:]:
        m = _ROW.match(line)
        assert m, f"unexpected can-i row: {line!r}"
        resource, urls, names, verbs = m.groups()
        key = (resource, tuple(sorted(names.split())), tuple(sorted(urls.split())))
        rules.setdefault(key, set()).update(verbs.split())
    return rules


def allowlist(*sections: str, fullname: str = "FULLNAME") -> dict[Rule, set[str]]:
    """The sections' rules; ``<fullname>`` in a resource name is the release's full name."""
    doc = yaml.safe_load(ALLOWLIST.read_text())
    out: dict[Rule, set[str]] = {}
    for section in sections:
        for entry in doc[section]:
            assert set(entry) <= {"resource", "names", "urls", "verbs"}, entry
            key = (
                entry.get("resource", ""),
                tuple(sorted(n.replace("<fullname>", fullname) for n in entry.get("names", []))),
                tuple(sorted(entry.get("urls", []))),
            )
            out.setdefault(key, set()).update(entry["verbs"])
    return out


def diff(got: dict[Rule, set[str]], want: dict[Rule, set[str]]) -> str:
    lines = []
    for key in sorted(set(got) | set(want)):
        g, w = got.get(key, set()), want.get(key, set())
        if g != w:
            lines.append(f"{key}: granted {sorted(g)}, allowlisted {sorted(w)}")
    return "\n".join(lines)


@pytest.fixture()
def namespaces(api: httpx.Client) -> Iterator[dict[str, str]]:
    """The operator's own namespace, two it may watch and one it never watches."""
    suffix = uuid.uuid4().hex[:6]
    names = {role: f"rbac-{suffix}-{role}" for role in ("op", "a", "b", "x")}
    for name in names.values():
        api.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
    for name in names.values():
        wait_for(
            lambda n=name: api.get(f"/api/v1/namespaces/{n}/serviceaccounts/default").status_code == 200,
            30,
            what=f"{name} default ServiceAccount",
        )
    yield names
    for name in names.values():
        api.delete(f"/api/v1/namespaces/{name}")


def install_rbac(box: Sandbox, release: str, namespace: str, sets: list[str]) -> str:
    """`helm template` of the ServiceAccount, the RBAC and the peering objects (after the chart's
    peering CRDs), applied server-side; returns the manifest."""
    crds = CHART / "crds" / "kopf.dev-peerings.yaml"
    kubectl(box, "apply", "--server-side", "--field-manager", "moe-tests", "-f", str(crds))
    kubectl(box, "wait", "--for", "condition=established", "--timeout", "60s", "-f", str(crds))
    helm = binary_path("helm")
    args = [str(helm), "template", release, str(CHART), "--namespace", namespace]
    for t in ("serviceaccount.yaml", "rbac.yaml", "peering.yaml"):
        args += ["--show-only", f"templates/{t}"]
    for s in sets:
        args += ["--set", s]
    env = {
        "HELM_CACHE_HOME": "/tmp/moe-helm/cache",
        "HELM_CONFIG_HOME": "/tmp/moe-helm/config",
        "HOME": "/tmp",
    }
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    kubectl(box, "apply", "--server-side", "--field-manager", "moe-tests", "-f", "-", stdin=proc.stdout)
    return proc.stdout


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["cluster-wide", "watch-namespaces"])
def test_service_account_permissions_equal_the_allowlist(
    sandbox: Sandbox, namespaces: dict[str, str], mode: str
) -> None:
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    watched = [namespaces["a"], namespaces["b"]]
    sets = [f"operator.watchNamespaces={{{','.join(watched)}}}"] if mode == "watch-namespaces" else []
    manifest = install_rbac(sandbox, release, namespaces["op"], sets)
    fullname = f"{release}-moe-operator"
    user = f"system:serviceaccount:{namespaces['op']}:{fullname}"
    try:
        if mode == "watch-namespaces":
            base = ("kubernetes", "cluster")
            in_watched = allowlist(*base, "watched", "peering-watched", fullname=fullname)
            cases = {
                name: (in_watched if name in watched else allowlist(*base)) for name in namespaces.values()
            }
        else:
            base = ("kubernetes", "cluster", "peering-cluster-wide", "watched")
            cases = {name: allowlist(*base, fullname=fullname) for name in namespaces.values()}
        # The release namespace also holds the webhook certificate Secret.
        cases[namespaces["op"]] = allowlist(*base, "release-namespace", fullname=fullname)
        for ns, want in cases.items():
            got = effective_permissions(sandbox, user, ns)
            assert got == want, f"{mode}, namespace {ns}:\n{diff(got, want)}"
    finally:
        kubectl(sandbox, "delete", "--ignore-not-found", "-f", "-", stdin=manifest)
        # The peering CRDs stay: the session operator may be running, and kopf 1.x stops when a
        # CRD it watches is deleted under it (shared_operator_paused removes them with it stopped).


def test_allowlist_grants_no_rbac_writes_and_no_secret_reads_beyond_get() -> None:
    """The allowlist itself stays least privilege (a reviewer reads this, not a diff of YAML)."""
    granted = allowlist("cluster", "watched", "peering-cluster-wide", "peering-watched", "release-namespace")
    for (resource, names, _urls), verbs in granted.items():
        assert "*" not in verbs and "*" not in resource
        if resource.endswith(".rbac.authorization.k8s.io"):
            assert verbs <= {"get", "list", "watch"}, (resource, verbs)
        if resource == "secrets":
            assert verbs == ({"get", "update"} if names == ("FULLNAME-webhook-certs",) else {"get", "create"})
        if resource.endswith("kopfpeerings.kopf.dev"):
            assert verbs == ({"get", "patch"} if names == ("FULLNAME",) else {"list", "watch"})
        if resource.endswith("webhookconfigurations.admissionregistration.k8s.io"):
            assert verbs == ({"patch"} if names == ("moe.inference.dev",) else {"create"}), (resource, names)
    cluster_resources = {r for r, _n, _u in allowlist("cluster")}
    assert cluster_resources == {
        "nodes",
        "customresourcedefinitions.apiextensions.k8s.io",
        "validatingwebhookconfigurations.admissionregistration.k8s.io",
        "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    }


@pytest.mark.cluster
@pytest.mark.usefixtures("shared_operator_paused")
def test_operator_reconciles_in_watched_namespaces_with_exactly_these_permissions(
    sandbox: Sandbox, api: httpx.Client, namespaces: dict[str, str], tmp_path: Path
) -> None:
    from operator_harness import bind_model_volume, install_crd

    install_crd(sandbox)
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    watched, elsewhere = namespaces["a"], namespaces["x"]
    manifest = install_rbac(
        sandbox, release, namespaces["op"], [f"operator.watchNamespaces={{{watched},{namespaces['b']}}}"]
    )
    sa = f"{release}-moe-operator"
    obj = yaml.safe_load((ROOT / "examples" / "qwen3-30b-a3b-single-node.yaml").read_text())
    name = obj["metadata"]["name"]
    # As the chart runs it (deployment.yaml): elected through the chart's KopfPeerings, the
    # generated webhook certificate kept in the chart's Secret in the release namespace.
    args = (
        "--namespace", watched, "--namespace", namespaces["b"],
        "--peering", sa, "--peering-required",
        "--webhook-cert-secret", f"{sa}-webhook-certs", "--webhook-cert-namespace", namespaces["op"],
    )  # fmt: skip
    try:
        with ServiceAccountOperator(sandbox, api, namespaces["op"], sa, tmp_path, args) as op:
            wait_for(lambda: api.get(WEBHOOK_CONFIG).status_code == 200, 60, what="webhook registered")
            for ns in (watched, elsewhere):
                bind_model_volume(api, ns, "qwen3-30b-a3b")
                resp = api.post(f"{MOED}/namespaces/{ns}/moedeployments", json=obj)
                assert resp.status_code == 201, resp.text

            def ready() -> dict[str, Any] | None:
                op.assert_running()
                got: dict[str, Any] = api.get(f"{MOED}/namespaces/{watched}/moedeployments/{name}").json()
                conds = got.get("status", {}).get("conditions", [])
                return got if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None

            try:
                wait_for(ready, 120, interval=0.5, what=f"{name} Ready in {watched}")
            except AssertionError:
                got = api.get(f"{MOED}/namespaces/{watched}/moedeployments/{name}").json()
                raise AssertionError(f"not Ready: {json.dumps(got.get('status'))}\n{op.tail()}") from None
            api.delete(f"{MOED}/namespaces/{watched}/moedeployments/{name}")
            wait_for(
                lambda: api.get(f"{MOED}/namespaces/{watched}/moedeployments/{name}").status_code == 404,
                60,
                what=f"{name} deleted",
            )
            audit = op.audit()
        # Nothing was forbidden but kopf's namespace discovery, which falls back to the exact names
        # given (listing namespaces is not granted: it is not needed).
        forbidden = [
            (e["verb"], e["requestURI"]) for e in audit if e.get("responseStatus", {}).get("code") == 403
        ]
        assert all(uri.startswith("/api/v1/namespaces?") for _verb, uri in forbidden), forbidden
        # The deployment in the unwatched namespace was never read or written by the operator.
        touched = [e["requestURI"] for e in audit if (e.get("objectRef") or {}).get("namespace") == elsewhere]
        assert not touched, touched
        untouched = api.get(f"{MOED}/namespaces/{elsewhere}/moedeployments/{name}").json()
        assert not untouched["metadata"].get("finalizers") and not untouched.get("status"), untouched
        written = {
            (e["objectRef"]["resource"], e["verb"]) for e in audit if e["responseStatus"]["code"] < 300
        }
        for resource in (
            "statefulsets", "services", "configmaps", "serviceaccounts", "secrets", "events", "kopfpeerings",
        ):  # fmt: skip
            assert any(r == resource for r, _ in written), f"no write to {resource}: {sorted(written)}"
        certs = [e for e in audit if (e.get("objectRef") or {}).get("name") == f"{sa}-webhook-certs"]
        assert any(e["verb"] == "create" and e["responseStatus"]["code"] == 201 for e in certs), certs
    finally:
        api.delete(f"{MOED}/namespaces/{elsewhere}/moedeployments/{name}")
        kubectl(sandbox, "delete", "--ignore-not-found", "-f", "-", stdin=manifest)
