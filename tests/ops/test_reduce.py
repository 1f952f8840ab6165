"""Reductions: forward vs PyTorch, kernel dtypes, gradient rules (including ties), attrs and type errors."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.ir.errors import AttrError, TypeInferenceError
from pullback.testing import check_grad

from opgrad import case, check_ad, check_rule, check_second, dtype_check, forward, rule_vjp, torch_check

RNG = np.random.default_rng(7)


def _dims(axis, ndim):
    return tuple(range(ndim)) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))


def T(name, axis, keepdims, **k):
    """torch.<name> over ``axis`` (all dims when None)."""

    def f(x):
        import torch

        return getattr(torch, name)(x, dim=_dims(axis, x.ndim), keepdim=keepdims, **k)

    return f


def T_single(name, axis, keepdims):  # prod and argmax take one dim
    def f(x):
        import torch

        if axis is None:
            out = getattr(torch, name)(x.reshape(-1), 0)
            return out.reshape((1,) * x.ndim) if keepdims else out
        return getattr(torch, name)(x, axis, keepdim=keepdims)

    return f


# (axis, keepdims, exclude, equivalent torch dims)
AXES = [(None, False, False, None), (1, False, False, 1), ((0, 2), True, False, (0, 2)), (-1, True, False, -1),
        ((1,), False, True, (0, 2))]
X = RNG.standard_normal((2, 3, 4))
SCALAR = np.array(1.5)
REDUCE = [("sum", "sum", {}), ("mean", "mean", {}), ("max", "amax", {}), ("min", "amin", {}),
          ("logsumexp", "logsumexp", {}), ("variance", "var", {"unbiased": False}),
          ("variance", "var", {"unbiased": True}), ("std", "std", {"unbiased": False}), ("std", "std", {"unbiased": True})]


def _torch_kw(name, kw):
    return {"correction": int(kw["unbiased"])} if "unbiased" in kw else {}


CASES = (
    [case(n, X, attrs=dict(axis=ax, keepdims=kd, exclude=ex, **kw),
          torch=T(tn, tdims, kd, **_torch_kw(n, kw)), id=f"{n}{kw or ''}-{ax}-{kd}-{ex}")
     for n, tn, kw in REDUCE for ax, kd, ex, tdims in AXES]
    + [case(n, SCALAR, attrs=dict(kw), torch=T(tn, (), False, **_torch_kw(n, kw)), id=f"{n}-rank0")
       for n, tn, kw in REDUCE if "unbiased" not in kw]
    + [case("prod", RNG.uniform(0.5, 2, (2, 3)) * RNG.choice([-1, 1], (2, 3)), attrs=dict(axis=ax, keepdims=kd),
            torch=T_single("prod", ax, kd), id=f"prod-{ax}-{kd}") for ax, kd in [(None, False), (1, True), (0, False)]]
    + [case("max", np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]), attrs=dict(axis=1), torch=T("amax", 1, False), id="max-ties", fd=False),
       case("min", np.array([[1.0, 1.0], [0.0, 2.0]]), torch=T("amin", None, False), id="min-ties-all", fd=False),
       case("mean", RNG.standard_normal((1, 3, 1)), attrs=dict(axis=(0, 2)), torch=T("mean", (0, 2), False), id="mean-size1")]
)
ARG_CASES = [case(n, X, attrs=dict(axis=ax, keepdims=kd), torch=T_single(n, ax, kd), id=f"{n}-{ax}-{kd}")
             for n in ("argmax", "argmin") for ax, kd in [(None, False), (1, False), (2, True), (None, True)]]
ALL = CASES + ARG_CASES


@pytest.mark.parametrize("c", ALL, ids=repr)
def test_forward_and_vjp_match_torch(c):
    pytest.importorskip("torch")
    if c.op in ("argmax", "argmin"):  # torch returns int64; compare values
        got, _ = forward(c)
        np.testing.assert_array_equal(got, c.torch(__import__("torch").tensor(c.inputs[0])).numpy())
        return
    torch_check(c)


@pytest.mark.parametrize("c", [c for c in CASES if c.fd], ids=repr)
def test_gradient_rule_matches_finite_differences(c):
    check_rule(c)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("c", ALL, ids=repr)
def test_kernel_returns_inferred_dtype(c, dtype):
    dtype_check(c, dtype)


def test_ties_share_the_gradient_evenly():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    (gx,) = rule_vjp(case("max", x, attrs=dict(axis=1)), np.array([1.0, 3.0]))
    np.testing.assert_allclose(gx, [[0, 0.5, 0.5], [1, 1, 1]])
    (gx,) = rule_vjp(case("min", x), np.array(6.0))
    np.testing.assert_allclose(gx, [[6, 0, 0], [0, 0, 0]])


def test_argmax_multi_axis_select_last_and_int_dtype():
    x = np.array([[[1, 5], [5, 0]], [[2, 2], [1, 0]]], dtype="int64")
    got, e = forward(case("argmax", x, attrs=dict(axis=(1, 2))))
    assert e.checked_type.dtype == "int32"
    np.testing.assert_array_equal(got, [1, 0])  # flat index over the reduced axes
    got, _ = forward(case("argmax", x, attrs=dict(axis=(1, 2), select_last_index=True)))
    np.testing.assert_array_equal(got, [2, 1])
    got, _ = forward(case("argmin", np.array([3.0, 1.0, 1.0]), attrs=dict(select_last_index=True)))
    assert got == 2


def test_int_reductions_keep_dtype():
    x = np.arange(6, dtype="int32").reshape(2, 3)
    for name, want in [("sum", [3, 12]), ("max", [2, 5]), ("prod", [0, 60])]:
        got, _ = forward(case(name, x, attrs=dict(axis=1)))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_any_dims_and_dynamic_count():
    x = pullback.var("x", shape=(pullback.Any, 3))
    e = op.mean(x, axis=0, keepdims=True)
    assert pullback.analysis.infer_expr(e).shape == (1, 3)
    (g,) = e.op.grad(e, pullback.var("g", shape=(1, 3)))
    assert pullback.analysis.infer_expr(g).shape == (pullback.Any, 3)


def test_attr_and_type_errors():
    x = pullback.var("x", shape=(2, 3))
    with pytest.raises(AttrError, match="sum.*axis"):
        op.sum(x, axis="a")
    with pytest.raises(AttrError, match="variance.*unbiased"):
        op.variance(x, unbiased="yes")
    with pytest.raises(AttrError, match="max.*keepdims"):
        op.max(x, keepdims=2)
    with pytest.raises(TypeInferenceError, match="mean.*axis 2 is out of range"):
        pullback.analysis.infer_expr(op.mean(x, axis=2))
    with pytest.raises(TypeInferenceError, match="argmax.*repeated axis"):
        pullback.analysis.infer_expr(op.argmax(x, axis=(1, -1)))


def test_flops_is_input_size():
    x = pullback.var("x", shape=(4, 5))
    e = op.logsumexp(x, axis=1)
    pullback.analysis.infer_expr(e)
    assert e.op.flops([x.checked_type], e.checked_type, e.attrs) == 20


@pytest.mark.parametrize("c", [c for c in CASES if c.fd], ids=repr)
def test_ad_pass_gradient(c):
    check_ad(c)


@pytest.mark.parametrize("c", [c for c in CASES if c.op in ("max", "logsumexp", "variance", "std", "mean", "prod")
                               and c.inputs[0].ndim == 3 and c.fd][::2], ids=repr)
def test_second_order(c):
    check_second(c)


@pytest.mark.parametrize("values", [[1.5, 0.0, 2.0, -1.0], [0.0, 0.0, 3.0, 1.0], [0.0, 2.0, 0.0, 0.0]])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_prod_gradient_is_exact_with_zeros(values, axis):
    """The product of the other elements (like torch.prod), not g * prod / x (NaN at zeros)."""
    torch = pytest.importorskip("torch")
    a = np.array(values).reshape(2, 2)
    x = pullback.var("x", shape=(2, 2), dtype="float64")
    f = pullback.Function([x], op.prod(x, axis=axis))
    grad = pullback.build(pullback.transform.gradient(f))["main"](a)[1][0]
    t = torch.tensor(a, requires_grad=True)
    (t.prod() if axis is None else t.prod(dim=axis)).sum().backward()
    np.testing.assert_allclose(grad, t.grad.numpy(), rtol=1e-12, atol=0)
    check_grad(f, [a])


def _no_warning():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("name", ["variance", "std"])
@pytest.mark.parametrize("unbiased", [False, True])
def test_variance_of_a_scalar_is_numpys_on_every_target(name, unbiased):
    """A 0-d input (no axis reduced): 0 for a finite value, NaN for NaN and inf and with unbiased=True (NumPy's
    ``var``); array-api-compat's torch ``var`` returns zeros there, NaN or not."""
    values = [np.nan, np.inf, -3.0, 2.5]
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning) if unbiased else _no_warning():
        var = [np.var(v, ddof=int(unbiased)) for v in values]
    want = np.sqrt(var) if name == "std" else np.array(var)
    for target in ("numpy", "jax", "torch"):
        pytest.importorskip({"numpy": "numpy", "jax": "jax", "torch": "torch"}[target])
        x = pullback.var("x", shape=(), dtype="float64")
        exe = pullback.build(pullback.IRModule.from_expr(pullback.Function([x], getattr(op, name)(x, unbiased=unbiased))),
                             target=target)
        with np.errstate(all="ignore"):
            got = [float(np.asarray(exe["main"](np.array(v)))) for v in values]
        np.testing.assert_equal(got, want, err_msg=f"{target} {name}(unbiased={unbiased})")
