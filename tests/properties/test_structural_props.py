"""Text round trip, structural hash consistency and idempotent clean-up on generated programs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

import pullback as pb
from pullback import transform as T
from pullback.ir.expr import Var
from pullback.ir.traversal import transform
from pullback.testing.programs import programs
from test_pass_semantics import gradient_module

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
PROGRAMS = programs(max_nodes=12, dtypes=("float32", "float64", "int32"))


def _renamed(mod: pb.IRModule) -> pb.IRModule:
    """The same module with every variable replaced by a fresh Var of another name."""
    out = mod
    for name, fn in mod.items():
        fresh = transform(fn, lambda old, new: Var("r_" + new.name_hint, new.type_annotation) if isinstance(new, Var) else None,
                          into_functions=True)
        out = out.with_function(name, fresh)
    return out


@SETTINGS
@given(mod=PROGRAMS)
def test_parse_of_astext_is_structurally_equal(mod):
    text = pb.astext(mod)
    back = pb.parse(text)
    pb.assert_structural_equal(back, mod)
    assert pb.astext(back) == text


@SETTINGS
@given(mod=PROGRAMS)
def test_untyped_round_trip(mod):
    back = pb.parse(pb.astext(mod))  # a fresh, untyped copy
    again = pb.parse(pb.astext(back))
    pb.assert_structural_equal(again, back)


@SETTINGS
@given(a=PROGRAMS, b=PROGRAMS)
def test_structural_equal_implies_equal_hash(a, b):
    renamed = _renamed(a)
    assert pb.structural_equal(a, renamed)
    assert pb.structural_hash(a) == pb.structural_hash(renamed)
    if pb.structural_equal(a, b):
        assert pb.structural_hash(a) == pb.structural_hash(b)
    if pb.structural_hash(a) != pb.structural_hash(b):
        assert not pb.structural_equal(a, b)


def _idempotent(make_pass, mod):
    once = make_pass()(mod)
    twice = make_pass()(once)
    pb.assert_structural_equal(twice, once)


@SETTINGS
@given(mod=PROGRAMS)
def test_simplify_expr_is_idempotent(mod):
    _idempotent(T.SimplifyExpr, mod)
    _idempotent(T.SimplifyExpr, _gradient(mod))


@SETTINGS
@given(mod=PROGRAMS)
def test_standard_cleanup_is_idempotent(mod):
    _idempotent(T.standard_cleanup, mod)
    _idempotent(T.standard_cleanup, _gradient(mod))


def _gradient(mod):
    return gradient_module(mod) or mod
