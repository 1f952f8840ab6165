"""Nodes, builders, immutability, modules and scopes."""

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.ir.scope import ScopeInfo
from pullback.ir.traversal import count_calls, free_vars, post_order, transform, use_counts


def test_var_builders():
    x = pb.var("x", shape=(2, 3))
    assert x.type_annotation == pb.TensorType((2, 3), "float32")
    y = pb.var("y", pb.TensorType((pb.Any, 4), "int32"))
    assert y.type_annotation.shape[0] is pb.Any
    assert repr(y.type_annotation) == "Tensor[(?, 4), int32]"
    with pytest.raises(pb.PullbackError, match="type or a shape"):
        pb.var("z")
    with pytest.raises(pb.PullbackError, match="unknown dtype"):
        pb.var("z", shape=(2,), dtype="float8")
    with pytest.raises(pb.PullbackError, match="negative"):
        pb.var("z", shape=(-1,))


def test_const_default_dtypes_follow_relay():
    assert pb.const(1.5).data.dtype == np.float32
    assert pb.const(3).data.dtype == np.int32
    assert pb.const(True).data.dtype == np.bool_
    assert pb.const(np.ones(2, "float64")).data.dtype == np.float64
    assert pb.const(2, "float16").data.dtype == np.float16


def test_constant_copies_and_is_read_only():
    a = np.ones(3, "float32")
    c = pb.const(a)
    a[0] = 5.0
    assert c.data[0] == 1.0
    with pytest.raises(ValueError):
        c.data[0] = 2.0


def test_arithmetic_sugar_builds_relay_ops():
    x = pb.var("x", shape=(2,))
    y = pb.var("y", shape=(2,))
    assert (x + y).op is op.add
    assert (x - y).op is op.subtract
    assert (x * y).op is op.multiply
    assert (x / y).op is op.divide
    assert (-x).op is op.negative
    # scalar operands take the dtype of the other side when it is known
    z = pb.var("z", shape=(2,), dtype="float64")
    assert (z * 2.0).args[1].data.dtype == np.float64
    assert (2 * z).args[0].data.dtype == np.float64


def test_getitem_builds_tuple_get_item_and_no_iteration():
    t = pb.Tuple([pb.var("a", shape=()), pb.var("b", shape=())])
    item = t[1]
    assert isinstance(item, pb.TupleGetItem) and item.index == 1 and item.tuple_value is t
    with pytest.raises(TypeError):
        list(t[0])
    with pytest.raises(pb.PullbackError):
        t["a"]


def test_nodes_are_immutable_and_replace_keeps_identity():
    x = pb.var("x", shape=(2,))
    c = op.exp(x)
    with pytest.raises(AttributeError):
        c.args = ()
    assert c.replace(args=c.args) is c
    assert c.replace(args=(x,)) is c
    y = pb.var("y", shape=(2,))
    c2 = c.replace(args=(y,))
    assert c2 is not c and c2.args[0] is y and c.args[0] is x


def test_attr_validation_names_op_and_attribute():
    x = pb.var("x", shape=(2, 3))
    with pytest.raises(pb.AttrError, match="reshape.*newshape"):
        op.reshape(x, (-1, -1))
    with pytest.raises(pb.AttrError, match="sum.*keepdims"):
        op.sum(x, axis=0, keepdims="yes")
    with pytest.raises(pb.AttrError, match="no attribute 'axes'"):
        op.sum(x, axes=0)
    with pytest.raises(pb.AttrError, match="zeros.*dtype"):
        op.zeros((2,), "float8")
    with pytest.raises(pb.PullbackError, match="expects 2 tensor arguments"):
        op.add(x)
    with pytest.raises(pb.PullbackError, match="expects 3 or 4 tensor arguments, got 2"):
        op.nn.attention(x, x)



def test_builders_and_call_check_their_operands():
    x = pb.var("x", shape=(2, 3))
    s = op.sum(x)  # expressions only, defaulted attributes: the builder's fast path still makes validated attrs
    assert s.attrs == op.sum.make_attrs() and s.args == (x,)
    assert op.negative(x).attrs is None
    assert op.add(x, 2).args[1].checked_type == pb.TensorType((), "float32")  # a weak scalar still converts
    with pytest.raises(pb.PullbackError, match=r"Call to add: argument 1 is not an expression: 'y'"):
        pb.Call(op.add, [x, "y"])
    with pytest.raises(pb.PullbackError, match="op must be an operator"):
        pb.Call("add", [x, x])


def test_operator_namespaces_resolve_once_and_reject_unknown_names():
    import pullback.op as op_module

    assert op.negative is pb.ops.registry.get_op("negative") and op.nn.dense is pb.ops.registry.get_op("nn.dense")
    assert "negative" in vars(op_module)  # kept after the first lookup: later ones are plain attribute reads
    with pytest.raises(AttributeError, match="pullback.op has no operator 'no_such_op'"):
        _ = op.no_such_op
    with pytest.raises(AttributeError, match="pullback.op.nn has no operator 'dense2'"):
        _ = op.nn.dense2
    assert "no_such_op" not in vars(op_module)

def test_module_updates_do_not_mutate():
    x = pb.var("x", shape=(2,))
    f = pb.Function([x], op.exp(x))
    m = pb.IRModule.from_expr(f)
    g = pb.Function([x], op.log(x))
    m2 = m.with_function("aux", g)
    assert "aux" not in m and "aux" in m2
    assert m2["main"] is f
    assert m2.get_global_var("main") is m.get_global_var("main")
    fns = m.functions
    fns.clear()
    assert len(m) == 1
    with pytest.raises(pb.PullbackError, match="no function @nope"):
        m["nope"]


def test_from_expr_wraps_free_vars():
    x = pb.var("x", shape=(2,))
    y = pb.var("y", shape=(2,))
    m = pb.IRModule.from_expr(x * y + x)
    assert m["main"].params == (x, y)


def test_traversals_are_iterative_on_deep_chains():
    x = pb.var("x", shape=(2,))
    e = x
    for _ in range(200_000):
        e = op.negative(e)
    order = post_order(e)
    assert len(order) == 200_001 and order[0] is x and order[-1] is e
    assert count_calls(e) == 200_000
    assert free_vars(e) == [x]
    # transform keeps identity when nothing changes
    assert transform(e, lambda old, new: None) is e


def test_use_counts_see_sharing():
    x = pb.var("x", shape=(2,))
    s = op.exp(x)
    out = s * s + s
    counts = use_counts(out)
    assert counts[id(s)] == 3


def test_scope_places_nodes_in_innermost_branch():
    c = pb.var("c", shape=(), dtype="bool")
    x = pb.var("x", shape=(2,))
    shared = op.exp(x)
    then_only = op.log(shared)
    else_only = op.tanh(x)
    r = pb.If(c, then_only, else_only) + shared
    info = ScopeInfo(r)
    if_node = r.args[0]
    then_s, else_s = info.branch_scopes(if_node)
    assert info.scope_of[id(shared)] is info.root
    assert info.scope_of[id(then_only)] is then_s
    assert info.scope_of[id(else_only)] is else_s
    assert then_only in then_s.nodes and else_only in else_s.nodes
