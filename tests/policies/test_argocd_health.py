"""The Argo CD health check (health.lua) gives each testdata object the status in health_test.yaml.

Runs health.lua in a real Lua 5.1 interpreter (`lua5.1`, Debian package lua5.1, installed by
e2e/setup.sh; Argo CD runs gopher-lua, which has Lua 5.1 semantics). Python turns each YAML
object into a Lua table literal bound to the global `obj`, as Argo CD does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from moe_operator.api.status import MoEDeploymentStatus

ROOT = Path(__file__).resolve().parents[2]
CHECK_DIR = ROOT / "policies" / "argocd" / "moe.inference.dev" / "MoEDeployment"
HEALTH_LUA = CHECK_DIR / "health.lua"
CASES: list[dict[str, Any]] = yaml.safe_load((CHECK_DIR / "health_test.yaml").read_text())["tests"]


def lua_literal(value: Any) -> str:
    """A Lua expression for a YAML value: maps and lists become tables (lists 1-indexed)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = "".join(
            ch if 32 <= b < 127 and ch not in '"\\' else f"\\{b:03d}"
            for ch, b in ((chr(b), b) for b in value.encode())
        )
        return f'"{escaped}"'
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        items = (f"[{lua_literal(str(k))}] = {lua_literal(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"no Lua literal for {type(value).__name__}")


def run_health(obj: dict[str, Any]) -> tuple[str, str]:
    lua = shutil.which("lua5.1")
    assert lua, "lua5.1 is missing: run e2e/setup.sh (installs the Debian package lua5.1)"
    script = (
        f"obj = {lua_literal(obj)}\n"
        f"local function health()\n{HEALTH_LUA.read_text()}\nend\n"
        "local hs = health()\n"
        'io.write(tostring(hs.status), "\\n", tostring(hs.message), "\\n")\n'
    )
    result = subprocess.run([lua, "-"], input=script, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    status, message = result.stdout.rstrip("\n").split("\n", 1)
    return status, message


def test_lua_literal_round_trip_escapes() -> None:
    text = 'quote " backslash \\ newline \n ünïcode'
    status, message = run_health_literal(text)
    assert (status, message) == ("string", text)


def run_health_literal(text: str) -> tuple[str, str]:
    lua = shutil.which("lua5.1")
    assert lua, "lua5.1 is missing: run e2e/setup.sh"
    script = f"local s = {lua_literal(text)}\nio.write(type(s), '|', s)"
    out = subprocess.run([lua, "-"], input=script.encode(), capture_output=True, check=False).stdout.decode()
    kind, _, value = out.partition("|")
    return kind, value


@pytest.mark.parametrize("case", CASES, ids=lambda case: Path(case["inputPath"]).stem)
def test_health(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECK_DIR / case["inputPath"]).read_text())
    assert run_health(obj) == (case["healthStatus"]["status"], case["healthStatus"]["message"])


@pytest.mark.parametrize("case", CASES, ids=lambda case: Path(case["inputPath"]).stem)
def test_testdata_status_matches_the_api(case: dict[str, Any]) -> None:
    """Fixtures use the operator's real status shape, so the check reads fields that exist."""
    obj = yaml.safe_load((CHECK_DIR / case["inputPath"]).read_text())
    assert obj["apiVersion"] == "moe.inference.dev/v1alpha1" and obj["kind"] == "MoEDeployment"
    if "status" in obj:
        status = MoEDeploymentStatus.model_validate(obj["status"])
        assert status.observed_generation == obj["status"]["observedGeneration"]


def test_every_status_is_covered() -> None:
    assert {case["healthStatus"]["status"] for case in CASES} == {
        "Healthy",
        "Progressing",
        "Degraded",
        "Suspended",
    }


def test_docs_inline_the_same_lua() -> None:
    doc = (ROOT / "docs" / "argocd.md").read_text()
    indented = "\n".join(("    " + line).rstrip() for line in HEALTH_LUA.read_text().splitlines())
    assert indented in doc, "docs/argocd.md must inline health.lua verbatim (indented 4 spaces in argocd-cm)"
