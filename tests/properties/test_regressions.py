"""Minimal reproducers of bugs the generated-program properties found.

Each test states the correct behaviour. A test marked ``xfail(strict=True)``
is a bug still open in another module (named in the reason); when it is fixed
the test passes, strict xfail turns that into a failure, and the mark must go.
"""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Any, op
from pullback import transform as T


def test_round_trip_of_a_typed_module():
    """printer/structural: after InferType the printer showed the inferred return type as a
    declared one, and ``parse(astext(m))`` was not structurally equal to ``m``."""
    x = pb.var("x", shape=(2,))
    mod = T.InferType()(pb.IRModule.from_expr(pb.Function([x], op.tanh(x))))
    pb.assert_structural_equal(pb.parse(pb.astext(mod)), mod)


def test_dead_code_elimination_with_a_variable_if_condition():
    """dead_code / pattern matcher (fixed): ``is_constant().where(lambda e: e.data.size == 1)`` ran
    its predicate on non-constants; any If whose condition is not a Constant crashed DCE
    (and standard_cleanup) with AttributeError."""
    c = pb.var("c", shape=(), dtype="bool")
    x = pb.var("x", shape=(2,))
    mod = pb.IRModule.from_expr(pb.Function([c, x], pb.If(c, op.tanh(x), op.exp(x))))
    out = T.DeadCodeElimination()(mod)
    pb.assert_structural_equal(out, mod)
    out = T.standard_cleanup()(mod)
    xs = (np.array(True), np.array([0.5, -1.0], "float32"))
    np.testing.assert_allclose(pb.build(out)["main"](*xs), np.tanh(xs[1]), rtol=1e-6)


def test_dense_gradient_with_dynamic_units():
    """ops/nn.py ``_dense_grad``: for data of rank 3 and a weight of type (?, k) the rule
    built ``reshape(g, (-1, ?))`` and FirstOrderGradient raised AttrError."""
    x = pb.var("x", shape=(2, 3, 2))
    w = pb.var("w", shape=(Any, 2))
    mod = pb.IRModule.from_expr(pb.Function([x, w], op.nn.dense(x, w)))
    g = T.FirstOrderGradient()(mod)
    xs = np.ones((2, 3, 2), "float32"), np.ones((4, 2), "float32")
    _, (dx, dw) = pb.build(g)["main_grad"](*xs)
    np.testing.assert_allclose(dx, np.full((2, 3, 2), 4.0), rtol=1e-6)
    np.testing.assert_allclose(dw, np.full((4, 2), 6.0), rtol=1e-6)


def test_check_grad_with_a_dynamic_result_shape():
    """testing/gradcheck.py ``_random_like``: ``int(Any)`` raised TypeError for a function whose
    result type has an ``Any`` dim."""
    x = pb.var("x", shape=(Any,))
    fn = pb.Function([x], op.tanh(x))
    from pullback.testing import check_grad

    assert check_grad(fn, [np.array([0.1, -0.3, 0.7])]) < 1e-6


def test_squeeze_all_of_a_dynamic_dim():
    """ops/shape.py squeeze: ``axis=None`` on a ``?`` dim typed the result keeping the dim while the
    kernel removed it when it was 1. The rank would depend on run-time sizes: a type error now, and
    explicit axes work."""
    x = pb.var("x", shape=(2, Any))
    with pytest.raises(pb.TypeInferenceError, match="give the axes"):
        T.InferType()(pb.IRModule.from_expr(pb.Function([x], op.squeeze(x))))
    mod = T.InferType()(pb.IRModule.from_expr(pb.Function([x], op.squeeze(x, axis=1))))
    out = pb.build(mod, check_outputs=True)["main"](np.ones((2, 1), "float32"))
    assert out.shape == (2,)


def test_gradient_of_if_joining_static_and_dynamic_dims():
    """transform/ad: the backward rebuild copied a static cached type (4, 3) onto a node whose
    operand became the If's joined type (4, ?) (WellFormedError); rebuilt nodes are re-typed now."""
    c = pb.var("c", shape=(), dtype="bool")
    x = pb.var("x", shape=(4, Any))
    y = op.add(x, pb.const(np.ones((4, 3), "float32")))
    mod = pb.IRModule.from_expr(pb.Function([c, x], pb.If(c, op.tanh(y), op.tanh(x))))
    g = T.FirstOrderGradient()(mod)  # the suite's WellFormedCheck instrument checks the result
    xs = np.array(False), np.full((4, 3), 0.5, "float32")
    _, (dx,) = pb.build(g)["main_grad"](*xs)
    np.testing.assert_allclose(dx, 1 - np.tanh(xs[1]) ** 2, rtol=1e-6)


@pytest.mark.parametrize("constant_operand", [0, 1])
def test_gradient_whose_constant_side_reads_a_value_twice(constant_operand):
    """runtime/schedule.py ``memory_order``: a value computed from constants alone that was also a hoisted last
    reader ran twice in the bookkeeping, so a reader of it was counted ready before its other operand ran: the
    plan read a value not yet computed (KeyError in buffer reuse) or freed (an add of None)."""
    c = np.array([-0.35, -0.95, -0.89, 0.98])
    p = pb.var("p", shape=(4,), dtype="float64")
    k = pb.const(c)
    inner = (p, k)[constant_operand]  # the chain of tanh and exp runs on the parameter or on the constant
    e = op.exp(op.tanh(inner))
    a = op.abs(op.atan2(k, e) if constant_operand == 0 else op.atan2(p, e))
    g = T.FirstOrderGradient()(pb.IRModule.from_expr(pb.Function([p], pb.Tuple([a, a]))))
    x = np.array([0.3, -0.2, 0.7, 1.1])

    def f(x):
        e = np.exp(np.tanh((x, c)[constant_operand]))
        return 2 * np.abs(np.arctan2(c, e) if constant_operand == 0 else np.arctan2(x, e)).sum()

    h = 1e-6
    want = [(f(x + h * d) - f(x - h * d)) / (2 * h) for d in np.eye(4)]
    (out, _), (grad,) = pb.build(g)["main_grad"](x)
    np.testing.assert_allclose(grad, want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("name", ["hardswish", "hardsigmoid"])
def test_hard_activation_gradients_are_zero_where_flat_even_for_nan_output_gradients(name):
    """ops/activation.py: the NumPy kernels wrote ``0 * g`` where the activation is flat, NaN for a NaN or
    infinite ``g``; ATen's ``hardswish_backward``/``hardsigmoid_backward`` select a zero there (found by the
    targets' agreement on edge values: a NaN met a ``where`` and then a hardsigmoid). And hardswish's at the
    kinks: ATen's is 0 at -3 and ``g`` at 3, the kernel's was ``-g / 2`` and ``3 g / 2``."""
    torch = pytest.importorskip("torch")
    x = np.array([-5.0, -3.0, -1.0, 0.0, 2.0, 3.0, 4.0, np.nan], "float32")
    g = np.array([np.nan, np.inf, -np.inf, np.nan, 1.0, np.nan, np.inf, 1.0], "float32")
    xv, gv = pb.var("x", shape=(8,)), pb.var("g", shape=(8,))
    mod = pb.IRModule.from_expr(pb.Function([gv, xv], getattr(op.nn, f"{name}_grad")(gv, xv)))
    want = getattr(torch.ops.aten, f"{name}_backward")(torch.from_numpy(g), torch.from_numpy(x)).numpy()
    for target in ("numpy", "torch"):
        np.testing.assert_array_equal(np.asarray(pb.build(mod, target=target)["main"](g, x)), want)
