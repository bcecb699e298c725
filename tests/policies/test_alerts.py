"""The alert rules parse (promtool check rules) and behave (promtool test rules).

promtool is required: e2e/setup.sh installs it (Debian package prometheus). A missing
promtool fails these tests instead of skipping them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "policies" / "prometheus" / "moe-alerts.rules.yaml"
TESTS = Path(__file__).parent / "moe-alerts.test.yaml"
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run e2e/setup.sh (installs the Debian package prometheus)"
    return path


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_test_rules() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", TESTS.name],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: str(rule["alert"]))
def test_alert_conventions(rule: dict[str, Any]) -> None:
    assert rule["alert"].startswith("MoE") and rule["alert"][3].isupper()
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule.get("for"), "every alert waits before firing"
    annotations = rule["annotations"]
    assert {"summary", "description", "runbook_url"} <= annotations.keys()
    assert annotations["runbook_url"].endswith("#" + rule["alert"].lower())


def test_every_alert_has_firing_and_silent_cases() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - fires == set(), "alerts without a firing case"
    assert names - silent == set(), "alerts without a silent case"


def test_alerts_documented() -> None:
    doc = (ROOT / "docs" / "alerts.md").read_text()
    for rule in alert_rules():
        assert f"### {rule['alert']}" in doc, f"{rule['alert']} missing from docs/alerts.md"
