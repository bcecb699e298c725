"""extraArgs admission: refused as SGLang 0.5.23's parser (and the operator) would refuse them, with
the field, the flag and the fix; the same rule set in validate(), `crds validate` and the launcher.

The real parsers are exercised in tests/runtime/test_flag_catalog.py (resolve against argparse)
and tests/api/test_api_extra_args_apiserver.py (the operator's webhook on a real apiserver).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from moe_contract import engine as contract
from moe_contract.engine import EngineConfig
from moe_contract.flags import ENGINE_CATALOG, ROUTER_CATALOG, engine_catalog, resolve, router_catalog
from moe_operator.api import MoEDeploymentSpec
from moe_operator.api.derived import pools
from moe_operator.cli.crds import register
from moe_operator.render.engine import engine_config
from moe_operator.validation import validate
from moe_operator.validation.flags import (
    CONTEXT_LENGTH_FLAG,
    ENGINE_LIFTED,
    ENGINE_OWNED,
    MEM_FRACTION_FLAG,
    PLACEMENT_BYPASS,
    REMOVED_ENGINE_FLAGS,
    ROUTER_OWNED,
    flag_value,
)

from .extra_args_cases import ACCEPTED, REFUSED, ArgCase, spec_with

ROOT = Path(__file__).resolve().parents[2]


def _messages(case: ArgCase) -> list[str]:
    return [str(p) for p in validate(spec_with(case))]


def test_enough_distinct_refusals() -> None:
    assert len({c.name for c in REFUSED}) == len(REFUSED) >= 15


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.name)
def test_refused_with_field_flag_and_fix(case: ArgCase) -> None:
    messages = _messages(case)
    assert len(messages) == 1, messages
    message = messages[0]
    assert message.startswith(case.field + ":"), message
    for text in case.texts:
        assert text in message, (text, message)


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.name)
def test_accepted(case: ArgCase) -> None:
    assert _messages(case) == []


def test_every_refusal_also_fails_in_engine_wide_and_pool_lists() -> None:
    """The same list is refused wherever an engine list is (engine, prefill, decode)."""
    for case in REFUSED:
        if case.where == "router":
            continue
        for where in ("engine", "prefill", "decode"):
            moved = ArgCase(case.name, where, case.args)
            fields = {p.field for p in validate(spec_with(moved))}
            assert fields == {case.field.replace(f"spec.{case.where}.", f"spec.{where}.")}, (case.name, where)


def test_crds_validate_refuses_each_case_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = [
        {"apiVersion": "moe.inference.dev/v1alpha1", "kind": "MoEDeployment", "metadata": {"name": c.name},
         "spec": spec_with(c)}
        for c in [*REFUSED, *ACCEPTED]
    ]  # fmt: skip
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["crds", "validate", str(path)])
    assert args.func(args) == 1
    out = capsys.readouterr().out
    blocks = {line.split(": ")[1]: line for line in out.splitlines() if not line.startswith("  ")}
    details = out.split("\n")
    for case in REFUSED:
        assert blocks[case.name].endswith("1 problem(s)"), blocks[case.name]
        at = details.index(blocks[case.name])
        assert details[at + 1].strip().startswith(case.field) and case.texts[0] in details[at + 1]
    for case in ACCEPTED:
        assert blocks[case.name].endswith(": ok"), blocks[case.name]


def test_examples_are_accepted_and_use_no_refused_flag() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        # policy=None: what the platform grants (hostNetwork, hostPath) is not this test's subject
        assert validate(yaml.safe_load(path.read_text())["spec"], policy=None) == [], path.name


# --------------------------------------------------------------------------- the tables and the catalog


def test_tables_name_real_dests() -> None:
    engine, router = engine_catalog(), router_catalog()
    assert set(ENGINE_OWNED) | ENGINE_LIFTED | set(PLACEMENT_BYPASS) <= engine.dests()
    assert set(ROUTER_OWNED) <= router.dests()
    for flag in REMOVED_ENGINE_FLAGS:
        assert [e.kind for e in resolve(engine, [flag]).errors] == ["unknown"], flag


def test_catalogs_are_the_targeted_versions() -> None:
    assert engine_catalog().version == ENGINE_CATALOG.removeprefix("sglang-")
    assert router_catalog().version == ROUTER_CATALOG.removeprefix("sglang-router-")
    pins = dict(
        line.split("=", 1)
        for line in (ROOT / "docker" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pins["SGLANG_IMAGE"].endswith(":v" + engine_catalog().version)
    assert pins["SGLANG_ROUTER_VERSION"] == router_catalog().version
    setup = (ROOT / "runtime" / "scripts" / "setup-test-env.sh").read_text()
    assert f'SGLANG_VERSION="{engine_catalog().version}"' in setup
    assert f'SGLANG_ROUTER_VERSION="{router_catalog().version}"' in setup


def test_launcher_and_admission_own_the_same_flags() -> None:
    """What the runtime's launcher refuses in extraArgs is what admission refuses (or lifts)."""
    engine = engine_catalog()
    managed = {engine.flag(f).dest for f in contract.MANAGED_FLAGS}
    assert managed == set(ENGINE_OWNED) | ENGINE_LIFTED
    for dest in sorted(managed):
        for option in engine.options_of([dest]):
            args = [option] if not engine.flag(option).takes_value else [option, "1"]
            assert contract.managed_flags_in(args), option
            if dest not in ENGINE_LIFTED:
                problems = validate(spec_with(ArgCase("x", "decode", tuple(args))))
                assert [p.field for p in problems] == ["spec.decode.extraArgs[0]"], (option, problems)


def test_launcher_refuses_aliases_and_prefixes() -> None:
    assert contract.managed_flags_in(["--tp", "8", "--ep=8", "--enable-two-batch-overlap"]) == {
        "--tp (--tp-size)",
        "--ep (--ep-size)",
    }
    assert (
        contract.managed_flags_in(["--cuda-graph-max-bs-decode", "128", "--eplb-algorithm", "deepseek"])
        == set()
    )


def test_capacity_check_reads_values_as_sglang_does() -> None:
    assert flag_value(["--mem-fraction", "0.5"], MEM_FRACTION_FLAG) == "0.5"
    assert flag_value(["--mem-fraction-static=0.5", "--mem-fraction-s", "0.7"], MEM_FRACTION_FLAG) == "0.7"
    assert flag_value(["--context-len=8192"], CONTEXT_LENGTH_FLAG) == "8192"
    assert flag_value(["--context-length", "32k"], CONTEXT_LENGTH_FLAG) == "32000"
    assert flag_value(["--chunked-prefill-size", "0.5"], MEM_FRACTION_FLAG) is None
    tight = spec_with(ArgCase("x", "engine", ("--mem-fraction", "0.3")))
    assert any(p.field == "spec.decode.nodesPerReplica" for p in validate(tight))


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.name)
def test_what_admission_accepts_the_launcher_accepts(case: ArgCase) -> None:
    """Every accepted list renders: the engine config (the runtime's own model) takes it too."""
    spec = MoEDeploymentSpec.model_validate(spec_with(case))
    for pool in pools(spec):
        config = EngineConfig.model_validate(engine_config(spec, pool))
        assert not contract.managed_flags_in(config.extra_args), config.extra_args
