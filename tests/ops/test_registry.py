"""Registry-wide checks: every operator is complete, and every operator is exercised by an op test table.

Op test modules (tests/ops/test_*.py) export module-level lists of ``opgrad.Case``
(``CASES``, ...); an operator is covered when some case calls it.
"""

from __future__ import annotations

import pytest

from pullback import op as op_builders
from pullback.ops import FusionKind, list_ops

from opgrad import case_tables

OPS = list_ops()


def covered_ops() -> dict:
    """op name -> test modules whose case tables call it."""
    out: dict = {}
    for module, c in case_tables():
        out.setdefault(c.op, set()).add(module)
    return out


@pytest.mark.parametrize("o", OPS, ids=lambda o: o.name)
def test_op_is_complete(o):
    assert callable(o.infer), f"{o.name}: no infer"
    assert callable(o.compute), f"{o.name}: no compute"
    assert isinstance(o.pattern, FusionKind), f"{o.name}: no fusion pattern"
    assert callable(o.flops), f"{o.name}: no flops estimate"
    if o.differentiable:  # a rule, or an expansion into operators AD differentiates (OpDef.expand)
        assert callable(o.grad) or callable(o.expand), f"{o.name}: no gradient rule and not marked differentiable=False"
    else:
        assert o.grad is None and o.nondiff_reason, f"{o.name}: differentiable=False needs a reason and no rule"
    if o.attrs_type is not None:
        assert o.attrs_type.__dataclass_params__.frozen, f"{o.name}: attrs dataclass must be frozen"


@pytest.mark.parametrize("o", OPS, ids=lambda o: o.name)
def test_op_has_a_builder(o):
    ns = op_builders
    for part in o.name.split("."):
        ns = getattr(ns, part)
    assert ns is o


def test_every_op_is_in_a_test_table():
    cov = covered_ops()
    missing = sorted(o.name for o in OPS if o.name not in cov)
    assert not missing, f"operators not exercised by any tests/ops case table: {missing}"


def test_tables_name_only_registered_ops():
    names = {o.name for o in OPS}
    unknown = sorted(set(covered_ops()) - names)
    assert not unknown, f"case tables name unregistered operators: {unknown}"
