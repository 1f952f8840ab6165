"""Invariants of the fast paths in the cleanup passes: the compiled matcher agrees with the
backtracking one, FoldConstant's one-walk folding equals its rule run by the rewrite driver,
rebuilt nodes carry correct types, and the incremental WellFormedCheck still catches a
cached type changed after it was verified."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback import transform as T
from pullback.analysis.type_infer import infer_module
from pullback.analysis.well_formed import VerifiedNodes, _check_well_formed
from pullback.ir.errors import WellFormedError
from pullback.ir.traversal import post_order
from pullback.pattern import is_constant, is_op, is_tuple, is_tuple_get_item, rewrite, wildcard
from pullback.pattern.matcher import compile_pattern, match_pattern
from pullback.transform.fold_constant import fold_expr, fold_rules


def _program():
    x = pb.var("x", shape=(2, 3))
    c = pb.const(np.ones((2, 3), "float32"))
    a = op.add(x, op.zeros((2, 3), "float32"))
    b = op.multiply(op.negative(op.negative(c)), a)
    t = pb.Tuple([b, op.exp(c)])
    return x, op.add(pb.TupleGetItem(t, 0), op.negative(op.ones((2, 3), "float32")))


PATTERNS = [
    lambda: is_op("add")(wildcard().named("x"), wildcard().where(lambda e: isinstance(e, pb.Call)).named("k")),
    lambda: is_op("multiply")(is_op("negative")(wildcard()), wildcard()).named("m"),
    lambda: is_tuple_get_item(is_tuple().named("tup"), 0),
    lambda: is_op("negative")(is_constant()),
    lambda: wildcard().has_shape((2, 3)).has_dtype("float32"),
]


@pytest.mark.parametrize("make", PATTERNS)
def test_compiled_matcher_binds_like_the_backtracking_matcher(make):
    _, body = _program()
    infer_module(pb.IRModule.from_expr(body))
    pattern = make()
    compiled = compile_pattern(pattern)
    hits = 0
    for node in post_order(body):
        want, got = match_pattern(pattern, node), compiled(node)
        assert (want is None) == (got is None)
        if want is not None:
            hits += 1
            assert list(want.items()) == list(got.items())
    assert hits > 0


def test_fold_in_one_walk_equals_the_rule_driver():
    x, body = _program()
    mod = pb.IRModule.from_expr(pb.Function([x], body))
    infer_module(mod)
    by_rules = rewrite(fold_rules(), mod["main"].body, mod)
    by_walk = fold_expr(mod["main"].body)
    pb.assert_structural_equal(by_walk, by_rules)
    assert by_walk is not body
    assert all(n._checked_type is not None for n in post_order(by_walk))


def test_cleanup_output_is_fully_typed_with_the_inferred_types():
    x, body = _program()
    mod = T.FirstOrderGradient()(pb.IRModule.from_expr(pb.Function([x], op.sum(body))))
    out = T.standard_cleanup()(mod)
    cached = {id(n): n._checked_type for _, fn in out.items() for n in post_order(fn.body)}
    assert all(t is not None for t in cached.values())
    fresh = pb.parse(pb.astext(out)) if hasattr(pb, "parse") else None
    if fresh is not None:
        infer_module(fresh)
        for (_, a), (_, b) in zip(out.items(), fresh.items()):
            assert [n._checked_type for n in post_order(a.body)] == [n._checked_type for n in post_order(b.body)]


def test_incremental_well_formed_check_still_sees_a_changed_cached_type():
    x, body = _program()
    mod = pb.IRModule.from_expr(pb.Function([x], body))
    infer_module(mod)
    verified = VerifiedNodes()
    _check_well_formed(mod, None, verified)  # everything verified once
    _check_well_formed(mod, None, verified)  # unchanged: skipped, still fine
    victim = next(n for n in post_order(mod["main"].body) if isinstance(n, pb.Call) and n.op.name == "exp")
    victim._checked_type = pb.TensorType((3, 2), "float32")  # a wrong cached type, set after verification
    with pytest.raises(WellFormedError, match="cached type"):
        _check_well_formed(mod, None, verified)


def test_rewrite_shares_work_between_functions_and_keeps_identity_when_nothing_fires():
    x = pb.var("x", shape=(2,))
    shared = op.negative(op.add(x, op.zeros((2,), "float32")))
    mod = pb.IRModule({"main": pb.Function([x], shared), "other": pb.Function([x], op.exp(shared))})
    out = T.SimplifyExpr()(mod)
    assert out["other"].body.args[0] is out["main"].body  # the shared node was rewritten once
    assert T.SimplifyExpr()(out) is out
