"""The pattern language: vocabulary, captures, alternatives, type constraints."""

import pytest

import pullback as pb
from pullback import op
from pullback.ir.types import Any, TensorType
from pullback.pattern import (
    has_dtype,
    is_constant,
    is_expr,
    is_if,
    is_op,
    is_tuple,
    is_tuple_get_item,
    is_var,
    match,
    match_captures,
    wildcard,
)


def _typed(e):
    pb.analysis.infer_expr(e)
    return e


def test_call_with_args_and_captures():
    x = pb.var("x", shape=(2, 3))
    y = pb.var("y", shape=(3,))
    e = op.add(x, op.zeros_like(y))
    p = is_op("add")(wildcard().named("a"), is_op("zeros_like")(wildcard(name="b")))
    assert match_captures(p, e) == {"a": x, "b": y}
    assert not match(is_op("subtract")(wildcard(), wildcard()), e)
    assert not match(is_op("add")(wildcard()), e)  # arity differs
    assert match(is_op("add"), e)  # an unapplied op pattern matches any call to it


def test_alternatives_backtrack():
    x = pb.var("x", shape=(3,))
    e = op.multiply(x, pb.const(1.0))
    one = is_constant().named("k") | is_op("ones_like")(wildcard())
    p = is_op("multiply")(is_var().named("x"), one)
    assert match_captures(p, e) == {"x": x, "k": e.args[1]}
    # left branch fails deep inside, right branch succeeds
    p2 = is_op("multiply")((is_op("add")(wildcard(), wildcard()) | is_var("x")).named("v"), wildcard())
    assert match_captures(p2, e) == {"v": x}
    assert not match(is_op("multiply")(is_var("z"), wildcard()), e)


def test_shared_pattern_node_needs_same_expr():
    x = pb.var("x", shape=(3,))
    y = pb.var("y", shape=(3,))
    w = wildcard()
    assert match(is_op("add")(w, w), op.add(x, x))
    assert not match(is_op("add")(w, w), op.add(x, y))
    # the same capture name twice must bind one node
    assert not match(is_op("add")(wildcard().named("a"), wildcard().named("a")), op.add(x, y))


def test_reused_op_pattern_matches_different_calls():
    x = pb.var("x", shape=(3,))
    add = is_op("add")
    inner = op.add(x, x)
    assert match(add(add(wildcard(), wildcard()), wildcard()), op.add(inner, x))


def test_type_constraints():
    x = pb.var("x", shape=(2, Any), dtype="int32")
    e = _typed(op.negative(x))
    assert match(wildcard().has_shape((2, Any)), e)
    assert not match(wildcard().has_shape((2, 3)), e)
    assert match(has_dtype("int32"), e)
    assert not match(wildcard().has_dtype("float32"), e)
    assert match(wildcard().has_type(TensorType((2, Any), "int32")), e)
    untyped = op.negative(pb.var("u", shape=(1,)))
    assert not match(wildcard().has_dtype("float32"), untyped)  # no type yet: no match


def test_attrs_tuples_and_if():
    x = pb.var("x", shape=(2, 3))
    s = op.sum(x, axis=1, keepdims=True)
    assert match(is_op("sum")(wildcard()).has_attr({"axis": [1], "keepdims": True}), s)
    assert not match(is_op("sum")(wildcard()).has_attr({"keepdims": False}), s)
    assert not match(is_op("sum")(wildcard()).has_attr({"nope": 1}), s)
    t = pb.Tuple([x, s])
    assert match(is_tuple_get_item(is_tuple([wildcard(), is_expr(s)]), 1), t[1])
    assert match(is_tuple_get_item(is_tuple(), None), t[0])
    assert not match(is_tuple_get_item(is_tuple(), 1), t[0])
    c = pb.var("c", shape=(), dtype="bool")
    assert match(is_if(is_var(), wildcard(), wildcard()), pb.If(c, x, x))


def test_where_predicate_and_repr():
    x = pb.var("x", shape=(3,))
    p = is_op("add")(wildcard().named("a"), is_constant().where(lambda e: float(e.data) == 0.0))
    assert match(p, op.add(x, pb.const(0.0)))
    assert not match(p, op.add(x, pb.const(2.0)))
    assert "add(" in repr(p) and "as a" in repr(p)


def test_matching_does_not_walk_deep_expressions():
    x = pb.var("x", shape=(3,))
    e = x
    for _ in range(200_000):
        e = op.negative(e)
    assert match(is_op("negative")(is_op("negative")(wildcard())), e)


def test_bad_builders_raise_pullback_errors():
    with pytest.raises(pb.PullbackError, match="unknown operator"):
        is_op("no_such_op")
    with pytest.raises(pb.PullbackError):
        is_tuple_get_item(wildcard(), -1)
    with pytest.raises(pb.PullbackError):
        wildcard().named("")
    with pytest.raises(pb.PullbackError):
        is_op("add")(3)
