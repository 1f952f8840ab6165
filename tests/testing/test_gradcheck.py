"""The gradient-check helpers: to_float64, check_grad, check_second_order."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.analysis import infer_module
from pullback.ir.expr import Call, Function, TupleGetItem
from pullback.ir.traversal import post_order
from pullback.ir.types import TensorType, TupleType
from pullback.ops.registry import OpDef
from pullback.testing import check_grad, check_second_order, to_float64

RNG = np.random.default_rng(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype("float32")


# ------------------------------------------------------------------ to_float64


def test_to_float64_rewrites_params_constants_and_dtype_attrs():
    x = pb.var("x", shape=(2, 3))
    n = pb.var("n", shape=(3,), dtype="int32")
    body = op.add(op.multiply(x, pb.const(0.5)), op.cast(n, "float32"))
    body = op.add(body, op.ones((2, 3), "float32"))
    f = Function([x, n], body)
    f64 = to_float64(f)
    assert f64.params[0].type_annotation == TensorType((2, 3), "float64")
    assert f64.params[1].type_annotation == TensorType((3,), "int32")  # ints stay
    nodes = post_order(f64.body)
    assert all(c.data.dtype == np.float64 for c in nodes if isinstance(c, pb.Constant))
    assert {c.attrs.dtype for c in nodes if isinstance(c, Call) and c.op.name in ("cast", "ones")} == {"float64"}
    pb.analysis.infer_expr(f64)
    assert f64.checked_type.ret_type == TensorType((2, 3), "float64")
    # the input is not mutated
    assert f.params[0].type_annotation == TensorType((2, 3), "float32")


def test_to_float64_module_with_calls_and_tuples():
    t = pb.Var("t", TupleType((TensorType((3,), "float32"), TensorType((3,), "float16"))))
    helper = Function([t], op.add(TupleGetItem(t, 0), op.cast(TupleGetItem(t, 1), "float32")))
    mod = pb.IRModule({"helper": helper})
    x = pb.var("x", shape=(3,))
    y = pb.var("y", shape=(3,), dtype="float16")
    mod = mod.with_function("main", Function([x, y], Call(mod.get_global_var("helper"), [pb.Tuple([x, y])])))
    infer_module(mod)
    mod64 = infer_module(to_float64(mod))
    assert isinstance(mod64, pb.IRModule)
    assert mod64["main"].checked_type.ret_type == TensorType((3,), "float64")
    assert mod64["helper"].params[0].type_annotation == TupleType((TensorType((3,), "float64"),) * 2)
    out = pb.build(mod64)["main"](np.ones(3), np.ones(3))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, 2.0)


# ------------------------------------------------------------------ check_grad


def test_check_grad_accepts_correct_gradients_and_returns_the_error():
    x, w = pb.var("x", shape=(3, 4)), pb.var("w", shape=(5, 4))
    err = check_grad(Function([x, w], op.tanh(op.nn.dense(x, w))), [randn(3, 4), randn(5, 4)])
    assert 0 <= err < 1e-6


def test_check_grad_handles_tuple_params_and_results():
    p = pb.Var("p", TupleType((TensorType((3,), "float32"), TensorType((3,), "float32"))))
    a, b = TupleGetItem(p, 0), TupleGetItem(p, 1)
    f = Function([p], pb.Tuple([op.multiply(a, b), op.exp(a)]))
    assert check_grad(f, [(randn(3), randn(3))]) < 1e-6


def _bad_square_grad(call, g):
    return [op.multiply(g, call.args[0])]  # should be 2 * x * g


BAD_SQUARE = OpDef("test.bad_square", 1, lambda ts, attrs: ts[0], lambda x, attrs=None: x * x, grad=_bad_square_grad)


def test_check_grad_reports_the_worst_entry():
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2,))
    f = Function([x, y], op.add(Call(BAD_SQUARE, [x]), op.expand_dims(y, 1)))
    with pytest.raises(AssertionError) as err:
        check_grad(f, [randn(2, 3), randn(2)])
    msg = str(err.value)
    assert "%x[" in msg and "analytic" in msg and "numeric" in msg
    # y's gradient is right: restricting wrt to it passes
    check_grad(f, [randn(2, 3), randn(2)], wrt=["y"])


def test_check_grad_samples_big_inputs():
    x = pb.var("x", shape=(50, 40))
    f = Function([x], Call(BAD_SQUARE, [x]))
    with pytest.raises(AssertionError, match="30 entries checked"):
        check_grad(f, [randn(50, 40)])


# ------------------------------------------------------------------ check_second_order


def test_check_second_order_accepts_correct_rules():
    x, w = pb.var("x", shape=(3, 4)), pb.var("w", shape=(5, 4))
    assert check_second_order(Function([x, w], op.tanh(op.nn.dense(x, w))), [randn(3, 4), randn(5, 4)]) < 1e-6


# twice(x) = 2 x with a wrong gradient (zero): first derivatives of square stay right,
# second derivatives are wrong
TWICE_BAD = OpDef("test.twice_bad", 1, lambda ts, attrs: ts[0], lambda x, attrs=None: 2 * x,
                  grad=lambda c, g: [op.zeros_like(c.args[0])])
SQUARE = OpDef("test.square", 1, lambda ts, attrs: ts[0], lambda x, attrs=None: x * x,
               grad=lambda c, g: [op.multiply(g, Call(TWICE_BAD, [c.args[0]]))])


def test_check_second_order_catches_a_rule_with_wrong_second_derivative():
    x = pb.var("x", shape=(4,))
    f = Function([x], Call(SQUARE, [x]))
    check_grad(f, [randn(4)])
    with pytest.raises(AssertionError, match="check_second_order"):
        check_second_order(f, [randn(4)])
