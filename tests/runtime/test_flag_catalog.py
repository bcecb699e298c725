"""The committed flag catalogs against the real sglang 0.5.23 and sglang-router 0.3.2 parsers.

The operator never imports sglang: it checks extraArgs from the catalogs in moe_contract with
moe_contract.flags.resolve. These tests fail when a catalog drifts from the installed wheels
(regenerate with `.venv-runtime/bin/python tools/flag_catalog.py`), when a converter disagrees with
SGLang's own type functions, or when resolve reads an argument list differently from the real
argparse (randomised argument lists, a fixed seed per case).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import random
import sys
import types
from typing import Any

import pytest
from rt_helpers import REPO, require_sglang

from moe_contract import flags as F

sys.path.insert(0, str(REPO / "tools"))
import flag_catalog

pytestmark = pytest.mark.runtime


class Refused(Exception):
    """argparse's error(): the command line would make the program exit."""


def strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    def error(self: argparse.ArgumentParser, message: str) -> Any:
        raise Refused(message)

    parser.error = types.MethodType(error, parser)  # type: ignore[method-assign]
    parser.exit_on_error = False
    return parser


@pytest.fixture(scope="module")
def engine_parser() -> argparse.ArgumentParser:
    require_sglang()
    return strict(flag_catalog.engine_parser())


@pytest.fixture(scope="module")
def router_parser() -> argparse.ArgumentParser:
    require_sglang()
    return strict(flag_catalog.router_parser())


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, Any]]:
    require_sglang()
    return {flag_catalog.file_name(doc): doc for doc in flag_catalog.generate()}


# --------------------------------------------------------------------------- drift


def test_committed_catalogs_are_the_installed_wheels(generated: dict[str, dict[str, Any]]) -> None:
    for name, doc in generated.items():
        path = flag_catalog.CATALOG_DIR / name
        assert path.exists(), f"{path} missing: run tools/flag_catalog.py in .venv-runtime"
        committed = path.read_text()
        assert committed == flag_catalog.dumps(doc), (
            f"{path} drifted from the installed {doc['distribution']} {doc['version']}: run "
            "`.venv-runtime/bin/python tools/flag_catalog.py`, review the diff, then the admission rules"
        )


def test_the_operator_targets_the_installed_versions() -> None:
    require_sglang()
    assert F.engine_catalog().version == md.version("sglang")
    assert F.router_catalog().version == md.version("sglang-router")


def test_every_option_string_of_the_real_parsers_is_in_the_catalogs(
    engine_parser: argparse.ArgumentParser, router_parser: argparse.ArgumentParser
) -> None:
    for parser, catalog in ((engine_parser, F.engine_catalog()), (router_parser, F.router_catalog())):
        real = {o: a.dest for o, a in parser._option_string_actions.items()}
        ours = {o: f.dest for o, f in catalog.by_option.items()}
        assert real == ours


def test_eplb_algorithm_names_are_what_sglang_accepts() -> None:
    require_sglang()
    from sglang.srt.eplb.eplb_algorithms import compute_algorithm

    names = F.engine_catalog().checked_later["eplb_algorithm"]
    for name in names:
        compute_algorithm(raw_algorithm=name, num_groups=8, num_nodes=1)
    with pytest.raises(KeyError):
        compute_algorithm(raw_algorithm="deepsek", num_groups=8, num_nodes=1)


# --------------------------------------------------------------------------- converters

SAMPLES: dict[str, list[str]] = {
    "str": ["", "x", "a b", "-1"],
    "int": ["8", "-3", "+5", " 7 ", "1_000", "0x10", "1.5", "", "abc", "1e3", "٣"],
    "float": ["0.5", "-0.5", "1e-3", "inf", "1_0.5", "abc", "", "1,5", " 2 "],
    "json.loads": ['{"a": 1}', "[1, 2]", "x", "", "NaN", "1", '"s"', "{'a': 1}"],
    "sglang.srt.utils.common.human_readable_int": [
        "1k",
        "25.6k",
        "1Ki",
        "1.5Ki",
        "1Mi",
        "12",
        " 12 ",
        "1K",
        "abc",
        "1.5",
        "-4",
        "0.0001k",
        "3T",
        "2Ti",
    ],
    "sglang.srt.utils.common.nullable_str": ["", "None", "x", "none"],
    "sglang.srt.utils.common.json_list_type": [
        "[1, 2]",
        "[]",
        "{}",
        "[NaN]",
        "1",
        "[1,",
        '"a"',
        "[Infinity]",
    ],
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": ["full", "tc_piecewise", "x"],
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": [
        '{"decode": {"max_bs": 8}}',
        '{"prefill": {"backend": "full", "bs": [1, 2]}}',
        '{"bogus": {}}',
        "[]",
        "x",
        '{"decode": {"nope": 1}}',
        '{"decode": 3}',
        "{}",
    ],
}


def _real_type(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    if not module:
        return {"str": str, "int": int, "float": float}[name]
    return getattr(__import__(module, fromlist=[attr]), attr)


def _real_convert(fn: Any, raw: str) -> tuple[bool, Any]:
    try:
        return True, fn(raw)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False, None


def test_every_type_in_the_catalogs_has_a_converter_and_samples() -> None:
    used = {f.type for c in (F.engine_catalog(), F.router_catalog()) for f in c.flags if f.type}
    assert used <= set(F.CONVERTERS), sorted(used - set(F.CONVERTERS))
    assert used <= set(SAMPLES), sorted(used - set(SAMPLES))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_converters_agree_with_sglangs_type_functions(name: str) -> None:
    require_sglang()
    real = _real_type(name)
    flag = F.Flag(("--x",), "x", "store", None, name, None, None, None, False, None)
    for raw in SAMPLES[name]:
        ok, value = _real_convert(real, raw)
        try:
            ours, mine = True, F.convert(flag, raw)
        except ValueError:
            ours, mine = False, None
        if name in F.LENIENT:
            assert ours or not ok, f"{name}({raw!r}) accepted by SGLang, refused by moe_contract"
            continue
        assert ours == ok, (
            f"{name}({raw!r}): SGLang {'accepts' if ok else 'refuses'} it, moe_contract does not"
        )
        if ok:
            assert repr(mine) == repr(value), (name, raw, mine, value)


# --------------------------------------------------------------------------- resolution vs argparse

AMBIGUOUS_ENGINE = ["--cuda-graph-max-bs", "--cuda-graph-bs", "--mod", "--enable-hi", "--ep"]


def _shortest_prefix(catalog: F.Catalog, option: str) -> str | None:
    for end in range(3, len(option)):
        prefix = option[:end]
        if prefix in catalog.by_option:
            continue
        if [o for o in catalog.by_option if o.startswith(prefix)] == [option]:
            return prefix
    return None


def _value_for(flag: F.Flag, rng: random.Random) -> list[str]:
    """Usually valid values for the flag, sometimes wrong ones."""
    bad = rng.random() < 0.15
    if flag.choices:
        pick = str(rng.choice(flag.choices)) if not bad else "no-such-choice"
        base = [pick]
    elif flag.type in ("int", "sglang.srt.utils.common.human_readable_int"):
        base = [rng.choice(["8", "0", "-2", "4k"] if not bad else ["x", "1.5"])]
    elif flag.type == "float":
        base = [rng.choice(["0.5", "1", "-0.25", "1e-3"] if not bad else ["x", ""])]
    elif flag.type in ("json.loads", "sglang.srt.utils.common.json_list_type"):
        base = [rng.choice(['{"a": 1}', "[1, 2]"] if not bad else ["{", "x"])]
    elif flag.type == "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg":
        base = ['{"decode": {"max_bs": 8}}'] if not bad else ['{"x": {}}']
    else:
        base = [rng.choice(["value", "/tmp/a", "a,b", "None"])]
    if flag.nargs in ("+", "*") and rng.random() < 0.5:
        base = base * rng.randint(1, 3)
    if isinstance(flag.nargs, int) and flag.nargs > 1:
        base = base * flag.nargs
    return base


def _argv(catalog: F.Catalog, rng: random.Random, skip: set[str]) -> list[str]:
    usable = [f for f in catalog.flags if f.action not in ("help", "version") and f.dest not in skip]
    argv: list[str] = []
    for _ in range(rng.randint(1, 6)):
        flag = rng.choice(usable)
        option = rng.choice(flag.options)
        roll = rng.random()
        if roll < 0.15:
            option = _shortest_prefix(catalog, option) or option
        elif roll < 0.2:
            option = rng.choice([*AMBIGUOUS_ENGINE, "--no-such-flag", option.replace("-", "_", 3)])
        if not flag.takes_value:
            argv.append(option if rng.random() > 0.1 else f"{option}=1")
            if rng.random() < 0.05:
                argv.append("true")
            continue
        values = _value_for(flag, rng)
        roll = rng.random()
        if roll < 0.05:
            argv.append(option)  # missing value
        elif roll < 0.3 and len(values) == 1:
            argv.append(f"{option}={values[0]}")
        else:
            argv += [option, *values]
    return argv


def _real(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    try:
        return parser.parse_args(argv)
    except (Refused, argparse.ArgumentError):
        return None


def _compare(parser: argparse.ArgumentParser, catalog: F.Catalog, argv: list[str], head: list[str]) -> None:
    ns = _real(parser, [*head, *argv])
    res = F.resolve(catalog, argv)
    if ns is None and res.ok:
        # Allowed only where a LENIENT converter took what SGLang's own refused: without those
        # flags argparse must accept the rest.
        lenient = [o for o in res.occurrences if o.flag.type in F.LENIENT]
        assert lenient, f"{argv}: argparse refuses, resolve accepts"
        drop = {o.index + k for o in lenient for k in range(1 + (0 if o.explicit else len(o.values)))}
        rest = [a for i, a in enumerate(argv) if i not in drop]
        assert _real(parser, [*head, *rest]) is not None, f"{argv}: argparse refuses, resolve accepts"
        return
    assert (ns is not None) == res.ok, (
        f"{argv}: argparse {'accepts' if ns else 'refuses'}, resolve {res.errors}"
    )
    if ns is None:
        return
    for occ in res.occurrences:
        if occ.flag.action in ("append", "append_const", "count", "extend"):
            continue
        last = res.last(occ.flag.dest)
        assert last is not None
        assert getattr(ns, occ.flag.dest) == last.value, (argv, occ.flag.dest)


# LoRAPathAction parses JSON inside its action (an AssertionError, not an argparse error) and
# --config reads a file: both outside what a value check can mirror.
ENGINE_SKIP = {"lora_paths", "config"}


@pytest.mark.parametrize("seed", list(range(6)))
def test_resolve_reads_engine_argv_as_argparse_does(
    engine_parser: argparse.ArgumentParser, seed: int
) -> None:
    rng = random.Random(seed)
    catalog = F.engine_catalog()
    for _ in range(150):
        _compare(engine_parser, catalog, _argv(catalog, rng, ENGINE_SKIP), ["--model-path", "m"])


@pytest.mark.parametrize("seed", list(range(3)))
def test_resolve_reads_router_argv_as_argparse_does(
    router_parser: argparse.ArgumentParser, seed: int
) -> None:
    rng = random.Random(seed)
    catalog = F.router_catalog()
    for _ in range(150):
        _compare(router_parser, catalog, _argv(catalog, rng, set()), [])


@pytest.mark.parametrize(
    "argv",
    [
        ["--cuda-graph-max-bs", "128"],
        ["--cuda-graph-max-bs=128"],
        ["--cuda-graph-max-bs-decode", "128", "--enable-two-batch-overlap"],
        ["--tp", "8", "--ep=8", "--model", "x", "--attention-data-parallel-size", "8"],
        ["--enable-ep-moe"],
        ["--enable-eplb=true"],
        ["--enable-two-batch-overlap", "true"],
        ["--mem-fraction", "0.8", "--context-len=4096"],
        ["--eplb-min-rebalancing-utilization-threshold", "-0.5"],
        ["--deepep-mode", "fast"],
        ["--chunked-prefill-size"],
        ["--chunked-prefill-size", "8k"],
        ["--cuda-graph-bs-decode", "1", "2", "4", "--disable-cuda-graph"],
        ["--no-enable-dsa-fused-indexer", "--monokernel-backend", "amd"],
        ["--sampling-backend", "pytorch"],
        ["128"],
        ["--"],
    ],
)
def test_resolve_agrees_on_known_cases(engine_parser: argparse.ArgumentParser, argv: list[str]) -> None:
    _compare(engine_parser, F.engine_catalog(), argv, ["--model-path", "m"])


def test_the_flagship_regression_is_ambiguous_in_sglang(engine_parser: argparse.ArgumentParser) -> None:
    with pytest.raises(Refused, match="ambiguous option"):
        engine_parser.parse_args(["--model-path", "m", "--cuda-graph-max-bs", "128"])
    errors = F.resolve(F.engine_catalog(), ["--cuda-graph-max-bs", "128"]).errors
    assert [e.kind for e in errors] == ["ambiguous"]
    assert set(errors[0].matches) == {"--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"}
