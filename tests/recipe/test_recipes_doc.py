"""docs/recipes.md holds the operator's render of each shipped example beside the public reference
deployments, row by row. This test renders the examples (`moe-operator render`, as a user would)
and fails when a row's "operator" column no longer says what the render does, or when the recipe
derives a setting the table does not list."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_operator.api import MoEDeploymentSpec
from moe_operator.recipe import derive_pool

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "recipes.md"
ABSENT = "—"


@cache
def rendered(example: str) -> tuple[dict[str, Any], ...]:
    res = subprocess.run(
        [sys.executable, "-m", "moe_operator.cli", "render", "-f", str(REPO / "examples" / example),
         "--policy", str(REPO / "policies" / "platform" / "examples.yaml")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return tuple(d for d in yaml.safe_load_all(res.stdout) if d)


def _pod(objects: tuple[dict[str, Any], ...], pool: str) -> dict[str, Any]:
    return next(
        o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] == "StatefulSet" and o["metadata"]["labels"]["moe.inference.dev/pool"] == pool
    )


def _engine_json(objects: tuple[dict[str, Any], ...], pool: str) -> dict[str, Any]:
    cm = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith(f"-{pool}-engine")
    )
    return dict(json.loads(cm["data"]["engine.json"]))


def _router_args(objects: tuple[dict[str, Any], ...]) -> list[str]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["command"][3:])


def _flag(args: list[str], flag: str) -> str:
    for i, arg in enumerate(args):
        if arg == flag:
            nxt = args[i + 1] if i + 1 < len(args) else ""
            return "on" if nxt.startswith("--") or not nxt else nxt
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return ABSENT


def operator_value(example: str, pool: str, setting: str) -> str:
    """What the render of ``example`` says for one row (the vocabulary of docs/recipes.md)."""
    objects = rendered(example)
    if setting.startswith("router "):
        return _flag(_router_args(objects), "--" + setting.removeprefix("router "))
    cfg, pod = _engine_json(objects, pool), _pod(objects, pool)
    engine = pod["containers"][0]
    par = cfg["parallel"]
    if setting.startswith("--"):
        return _flag(cfg["extraArgs"], setting)
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", setting):
        env = {e["name"]: e.get("value", "(from a reference)") for e in engine["env"]}
        return str(env.get(setting, ABSENT))
    world = par["nnodes"] * par["gpusPerNode"]
    simple = {
        "nodes x GPUs": f"{par['nnodes']} x {par['gpusPerNode']}",
        "tp-size": str(world),
        "attn-dp-size": str(par["attnDp"]),
        "ep-size": str(world) if par.get("a2aBackend") == "deepep" else "1",
        "deepep-mode": str(par.get("deepepMode", ABSENT)),
        "start-up allowance": f"{engine['startupProbe']['periodSeconds'] * engine['startupProbe']['failureThreshold']}s",
        "termination grace": f"{pod['terminationGracePeriodSeconds']}s",
        "launcher SIGTERM grace": f"{cfg['graceSeconds']:g}s",
        "IMEX channel": "ComputeDomain claim" if pod.get("resourceClaims") else ABSENT,
        "RDMA device": ", ".join(
            f"{k}: {v}" for k, v in engine["resources"]["limits"].items() if k.startswith("rdma/")
        )
        or ABSENT,
        "capability IPC_LOCK": "on"
        if "IPC_LOCK" in engine["securityContext"]["capabilities"].get("add", [])
        else ABSENT,
        "hostNetwork": "on" if pod.get("hostNetwork") else ABSENT,
        "/dev/shm": next(v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if v["name"] == "dshm"),
        "KV transfer": cfg["disaggregation"]["transferBackend"],
    }
    assert setting in simple, f"docs/recipes.md: unknown setting {setting!r}"
    return simple[setting]


def doc_rows() -> list[tuple[str, str, str, str]]:
    """(example, pool, setting, operator column) of every table row under a '### examples/X' heading."""
    rows, example = [], None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"^### examples/(\S+\.yaml)", line)
        if heading:
            example = heading.group(1)
            continue
        if example and line.startswith("| ") and not line.startswith(("| pool", "|---", "| ---")):
            cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            rows.append((example, cells[0], cells[1], cells[2]))
    return rows


ROWS = doc_rows()


def test_the_doc_covers_every_shipped_wide_ep_example() -> None:
    covered = {r[0] for r in ROWS}
    assert {
        "deepseek-v3-pd-h100.yaml",
        "deepseek-v3-gb200.yaml",
        "qwen3-235b-fp8-pd-h200-roce.yaml",
    } <= covered
    assert len(ROWS) > 60


@pytest.mark.parametrize(("example", "pool", "setting", "written"), ROWS, ids=lambda v: str(v))
def test_each_row_says_what_the_render_does(example: str, pool: str, setting: str, written: str) -> None:
    pools = ("prefill", "decode") if pool == "both" else (pool,)
    for p in pools:
        assert operator_value(example, p, setting) == written, (
            f"{example} {p} {setting}: docs/recipes.md is stale"
        )


@pytest.mark.parametrize("example", sorted({r[0] for r in ROWS}))
def test_every_derived_setting_has_a_row(example: str) -> None:
    spec = MoEDeploymentSpec.model_validate(yaml.safe_load((REPO / "examples" / example).read_text())["spec"])
    listed = {
        (p, s)
        for e, pool, s, _ in ROWS
        if e == example
        for p in (("prefill", "decode") if pool == "both" else (pool,))
    }
    for pool in ("prefill", "decode"):
        for setting in derive_pool(spec, pool):
            assert (pool, setting.name) in listed, (
                f"{example}: docs/recipes.md has no row for {pool} {setting.name}"
            )
