"""The shells stay thin: no function in handlers/ or control/ over 60 lines, no mutable module state."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "moe_operator"
SHELLS = sorted([*(OPERATOR / "handlers").glob("*.py"), *(OPERATOR / "control").glob("*.py")])
MAX_LINES = 60


@pytest.mark.parametrize("path", SHELLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_functions_fit_on_one_screen(path: Path) -> None:
    tree = ast.parse(path.read_text())
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long, f"{path.name}: split these into named steps: {long}"


def _mutable(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp):
        return True
    return isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) in {
        "dict", "list", "set", "defaultdict", "deque", "Lock", "RLock", "Counter", "Gauge", "Histogram",
        "Wakeups", "OrderedDict",
    }  # fmt: skip


@pytest.mark.parametrize("path", sorted((OPERATOR / "handlers").glob("*.py")), ids=lambda p: p.name)
def test_no_module_level_mutable_state_in_handlers(path: Path) -> None:
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is not None and _mutable(value):
            found += [ast.unparse(t) for t in targets]
        if isinstance(node, ast.Global):
            found += node.names
    assert not found, f"{path.name}: move into OperatorState (handlers/state.py): {found}"
