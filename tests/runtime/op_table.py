"""The operator table as programs for the target tests: every Case of the op case tables
(tests/ops, ``opgrad.case_tables``), one program per test module, its body a Tuple of the cases'
expressions over their own parameters. Cases a target cannot run (``opgrad.UNSUPPORTED``) are
left out of that target's programs; ``unsupported_cases`` gives them to test the error instead.
"""

from __future__ import annotations

import pathlib
import sys

from pullback import Function, IRModule, Tuple, var
from pullback.ir.traversal import post_order

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ops"))
from opgrad import UNSUPPORTED, case_tables  # noqa: E402


def _ops(expr) -> set:
    return {n.op.name for n in post_order(expr) if hasattr(n, "op") and hasattr(n.op, "name")}


def _unsupported(case, target: str) -> list[str]:
    return [UNSUPPORTED[(o, target)] for o in sorted(_ops(case.build(*_vars(case, "u")))) if (o, target) in UNSUPPORTED]


def _vars(case, prefix: str) -> list:
    return [var(f"{prefix}_x{i}", shape=x.shape, dtype=x.dtype.name) for i, x in enumerate(case.inputs)]


def table_programs(target: str) -> list[tuple[str, IRModule, list]]:
    """``(test module, module with @main, inputs)`` per op test module, without the cases ``target`` cannot run."""
    groups: dict[str, list] = {}
    for module, case in case_tables():
        if not _unsupported(case, target):
            groups.setdefault(module, []).append(case)
    out = []
    for module, cases in groups.items():
        params, outs, inputs = [], [], []
        for k, c in enumerate(cases):
            xs = _vars(c, f"c{k}")
            outs.append(c.build(*xs))
            params += xs
            inputs += list(c.inputs)
        out.append((module, IRModule.from_expr(Function(params, Tuple(outs))), inputs))
    return out


def unsupported_cases(target: str) -> list[tuple[str, IRModule, list, str]]:
    """``(case id, module, inputs, expected error text)`` for the cases ``target`` cannot run."""
    out = []
    for _, case in case_tables():
        reasons = _unsupported(case, target)
        if reasons:
            xs = _vars(case, "c")
            out.append((case.id, IRModule.from_expr(Function(xs, case.build(*xs))), list(case.inputs), reasons[0]))
    return out


def covered_ops() -> set:
    """Every operator some program of the table calls."""
    return {o for _, c in case_tables() for o in _ops(c.build(*_vars(c, "c")))}
