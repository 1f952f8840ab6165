"""A module function with a ``custom_vjp`` attribute: AD uses the named function for its vector-Jacobian product
(inlined) instead of differentiating its body; the passes keep the pair's signatures."""

import numpy as np
import pytest

import pullback as pb
from pullback import transform as T
from pullback.testing.gradcheck import check_grad

TEXT = """
def @main(%x: Tensor[(3,), float32], %w: Tensor[(3,), float32]) {
  %0 = multiply(%x, %w);
  %1 = @f(%0, %w);
  sum(multiply(%1, %1), axis=None, keepdims=False, exclude=False)
}

def @f [custom_vjp="f_vjp"] (%a: Tensor[(3,), float32], %b: Tensor[(3,), float32]) {
  round(%a)
}

def @f_vjp(%a: Tensor[(3,), float32], %b: Tensor[(3,), float32], %g: Tensor[(3,), float32]) {
  (multiply(%g, const(0.5, float32)), %g)
}
"""


def _expected(x, w):
    """d/dx and d/dw of sum(f(x w, w)^2) with f's vjp (g / 2, g): g = 2 round(x w)."""
    g = 2 * np.round(x * w)
    return g * 0.5 * w, g * 0.5 * x + g


def test_ad_calls_the_custom_vjp_instead_of_differentiating_the_body():
    mod = pb.parse(TEXT)
    assert mod["f"].custom_vjp == "f_vjp"
    grad = T.FirstOrderGradient()(mod)
    x, w = np.array([0.3, -1.7, 2.4], np.float32), np.array([1.5, 0.8, -2.0], np.float32)
    value, (dx, dw) = pb.build(grad)["main_grad"](x, w)
    np.testing.assert_allclose(value, np.sum(np.round(x * w) ** 2), rtol=1e-6)
    ex, ew = _expected(x, w)
    np.testing.assert_allclose(dx, ex, rtol=1e-6)
    np.testing.assert_allclose(dw, ew, rtol=1e-6)
    calls = pb.astext(grad["main_grad"])
    assert "@f(" in calls and "@f_vjp" not in calls  # the vjp's body is inlined into the backward
    assert pb.astext(T.standard_cleanup()(grad))  # the clean-up runs over the pair


def test_without_the_attribute_the_body_is_differentiated():
    """The same module without ``custom_vjp``: round's gradient is zero, so only ``w``'s direct use remains."""
    mod = pb.parse(TEXT.replace(' [custom_vjp="f_vjp"]', ""))
    _, (dx, dw) = pb.build(T.FirstOrderGradient()(mod))["main_grad"](np.ones(3, np.float32), np.ones(3, np.float32))
    np.testing.assert_array_equal(dx, 0)
    np.testing.assert_array_equal(dw, 0)


def test_a_custom_vjp_of_a_smooth_function_passes_the_gradient_check():
    """A vjp equal to the derivative (of sin) passes the float64 finite-difference check, differentiated twice."""
    text = """
def @main(%x: Tensor[(4,), float64]) { sum(multiply(@s(%x), %x), axis=None, keepdims=False, exclude=False) }
def @s [custom_vjp="s_vjp"] (%a: Tensor[(4,), float64]) { sin(%a) }
def @s_vjp(%a: Tensor[(4,), float64], %g: Tensor[(4,), float64]) { (multiply(%g, cos(%a)),) }
"""
    mod, x = pb.parse(text), [np.array([0.1, -0.4, 1.3, 2.2])]
    check_grad(mod, x)
    check_grad(T.FirstOrderGradient()(mod), x, func="main_grad")  # its gradient, through the inlined vjp


def test_a_missing_or_ill_shaped_vjp_is_reported():
    with pytest.raises(pb.DiagnosticError, match=r"@f's custom_vjp @nowhere is not a function of the module"):
        T.FirstOrderGradient()(pb.parse(TEXT.replace('custom_vjp="f_vjp"', 'custom_vjp="nowhere"')))
    short = TEXT.replace("%b: Tensor[(3,), float32], %g", "%g")
    with pytest.raises(pb.PullbackError, match=r"@f's custom_vjp @f_vjp must take its 2 arguments and 1 cotangent"):
        T.FirstOrderGradient()(pb.parse(short))
    for wrong in ("(%g,)", "%g", "(%g, sum(%g, axis=None, keepdims=False, exclude=False))"):
        bad = TEXT.replace("(multiply(%g, const(0.5, float32)), %g)", wrong)
        with pytest.raises(pb.PullbackError, match=r"@f's custom_vjp @f_vjp must return one gradient per argument, "
                                                   r"of the argument's type \(\(Tensor\[\(3,\), float32\]"):
            T.FirstOrderGradient()(pb.parse(bad))


def test_the_passes_keep_the_pair():
    """RemoveUnusedParameters keeps both signatures (f ignores %b, f_vjp ignores %a); DCE keeps the vjp while
    @f is reachable; the gradient after both is unchanged."""
    mod = pb.parse(TEXT)
    kept = T.DeadCodeElimination()(T.RemoveUnusedParameters()(mod))
    assert [p.name_hint for p in kept["f"].params] == ["a", "b"]
    assert [p.name_hint for p in kept["f_vjp"].params] == ["a", "b", "g"]
    x, w = np.array([0.3, -1.7, 2.4], np.float32), np.array([1.5, 0.8, -2.0], np.float32)
    _, (dx, dw) = pb.build(T.FirstOrderGradient()(kept))["main_grad"](x, w)
    ex, ew = _expected(x, w)
    np.testing.assert_allclose(dx, ex, rtol=1e-6)
    np.testing.assert_allclose(dw, ew, rtol=1e-6)
