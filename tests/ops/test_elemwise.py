"""Elementwise operators: forward vs NumPy/PyTorch, kernel dtypes, gradient rules vs finite differences."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.ir.errors import AttrError, TypeInferenceError
from pullback.ops import get_op

from opgrad import case, check_ad, check_rule, check_second, dtype_check, forward, rule_vjp, torch_check

RNG = np.random.default_rng(1234)


def normal(shape):
    return RNG.standard_normal(shape)


def positive(shape):
    return RNG.uniform(0.5, 2.0, shape)


def unit(shape):  # inside (-1, 1), away from tan's poles
    return RNG.uniform(-0.9, 0.9, shape)


def off_grid(shape):  # away from integers and .5, where floor/ceil/round jump
    return np.floor(RNG.uniform(-3, 3, shape)) + RNG.uniform(0.1, 0.4, shape)


def nonzero(shape):
    return RNG.uniform(0.5, 2.0, shape) * RNG.choice([-1.0, 1.0], shape)


def probability(shape):  # inside (0, 1)
    return RNG.uniform(0.05, 0.95, shape)


def wide(shape):  # both signs, the far left tail of log_ndtr
    return RNG.uniform(-9.0, 4.0, shape)


def S(name):  # torch.special function by name, resolved lazily
    return lambda x: getattr(__import__("torch").special, name)(x)


def T(name, *a, **k):  # torch function by name, resolved lazily
    def f(*xs):
        import torch

        return getattr(torch, name)(*xs, *a, **k)

    return f


UNARY = [
    ("negative", normal, T("neg")), ("abs", nonzero, T("abs")), ("sign", nonzero, T("sign")),
    ("exp", normal, T("exp")), ("log", positive, T("log")), ("log2", positive, T("log2")),
    ("log1p", positive, T("log1p")), ("sqrt", positive, T("sqrt")), ("rsqrt", positive, T("rsqrt")),
    ("square", normal, T("square")), ("reciprocal", nonzero, T("reciprocal")), ("sin", normal, T("sin")),
    ("cos", normal, T("cos")), ("tan", unit, T("tan")), ("tanh", normal, T("tanh")), ("sigmoid", normal, T("sigmoid")),
    ("erf", normal, T("erf")), ("floor", off_grid, T("floor")), ("ceil", off_grid, T("ceil")),
    ("round", off_grid, T("round")), ("copy", normal, T("clone")), ("lgamma", positive, T("lgamma")),
    ("digamma", positive, T("digamma")), ("erfc", normal, T("erfc")),
    ("erfinv", unit, T("erfinv")), ("ndtri", probability, S("ndtri")), ("log_ndtr", wide, S("log_ndtr")),
    ("i0", wide, T("i0")), ("i1", wide, S("i1")), ("i0e", wide, S("i0e")), ("i1e", wide, S("i1e")),
]
SHAPES = [(), (1,), (3,), (2, 1, 3)]
BINARY = [
    ("add", normal, normal, T("add")), ("subtract", normal, normal, T("sub")), ("multiply", normal, normal, T("mul")),
    ("divide", normal, nonzero, T("div")), ("power", positive, normal, T("pow")),
    ("maximum", normal, normal, T("maximum")), ("minimum", normal, normal, T("minimum")),
]
PAIRS = [((2, 3), (2, 3)), ((2, 3), (3,)), ((1, 3), (2, 1)), ((), (2, 3)), ((2, 1, 3), ())]

CASES = (
    [case(name, gen(s), torch=tf) for name, gen, tf in UNARY for s in SHAPES]
    + [case(name, ga(sa), gb(sb), torch=tf) for name, ga, gb, tf in BINARY for sa, sb in PAIRS]
    + [case("clip", normal((2, 3)) * 2, attrs=dict(a_min=-1.0, a_max=0.5), torch=T("clamp", -1.0, 0.5)),
       case("clip", np.array(3.0), args=(-1, 1), torch=T("clamp", -1, 1))]
    # torch's float64 polygamma(1, x) is 4e-10 relative off (test_log_gamma_family_is_accurate_on_every_target)
    + [case(name, np.array([0.0, -0.0, 1.5, -2.0]), torch=S(name), id=f"{name}-at-zero") for name in ("i1", "i1e")]
    + [case("polygamma", positive((2, 3)), attrs=dict(n=1), id="polygamma-1")]
    + [case("polygamma", positive((2, 3)), attrs=dict(n=n), torch=lambda x, n=n: __import__("torch").polygamma(n, x),
            id=f"polygamma-{n}") for n in (2, 3)]
    + [case("where", normal(sc) > 0, normal(sx), normal(sy), torch=T("where"))
       for sc, sx, sy in [((2, 3), (2, 3), (2, 3)), ((3,), (2, 1), ()), ((), (2, 2), (1, 2))]]
    # exact ties: the gradient is split evenly, as in PyTorch
    + [case("maximum", np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 3.0]), torch=T("maximum"), id="maximum-ties"),
       case("minimum", np.array([[1.0, 2.0]]), np.array([1.0]), torch=T("minimum"), id="minimum-ties")]
)

_ints = np.array([[-7, -2, 0], [3, 5, 9]])
_divisors = np.array([2, -3, 4])
_bools = (np.array([True, False, True]), np.array([[True], [False]]))
NONDIFF_CASES = (
    [case(n, normal((2, 3)), normal((3,)), torch=T(t))
     for n, t in [("equal", "eq"), ("not_equal", "ne"), ("less", "lt"), ("less_equal", "le"), ("greater", "gt"),
                  ("greater_equal", "ge")]]
    + [case("equal", _ints, np.array([3, 0, 0]), torch=T("eq"), id="equal-int")]
    + [case(n, *_bools, torch=T(n)) for n in ("logical_and", "logical_or")]
    + [case("logical_not", _bools[0], torch=T("logical_not")),
       case("isnan", np.array([0.0, np.nan, np.inf]), torch=T("isnan")),
       case("isfinite", np.array([0.0, np.nan, -np.inf]), torch=T("isfinite")),
       case("signbit", np.array([0.0, -0.0, -2.0, 3.0, -np.inf]), torch=T("signbit"))]
    + [case("divide", _ints, _divisors, torch=T("floor_divide"), id="divide-int"),  # integer division floors
       case("floor_divide", _ints, _divisors, torch=T("floor_divide"), id="floor_divide-int"),
       case("floor_divide", normal((2, 3)) * 5, nonzero((3,)), torch=T("floor_divide")),
       case("mod", _ints, _divisors, torch=T("fmod"), id="mod-int"),
       case("mod", normal((2, 3)) * 5, nonzero((3,)), torch=T("fmod"))]
    + [case(n, _ints, torch=T(t), id=f"{n}-int") for n, t in [("abs", "abs"), ("negative", "neg"), ("sign", "sign"),
                                                              ("square", "square")]]
    + [case(n, _ints, _divisors, torch=T(t), id=f"{n}-int") for n, t in [("add", "add"), ("multiply", "mul"),
                                                                         ("maximum", "maximum")]]
)
ALL = CASES + NONDIFF_CASES


@pytest.mark.parametrize("c", [c for c in ALL if c.torch is not None], ids=repr)
def test_forward_and_vjp_match_torch(c):
    pytest.importorskip("torch")
    torch_check(c)


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_gradient_rule_matches_finite_differences(c):
    check_rule(c)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("c", ALL, ids=repr)
def test_kernel_returns_inferred_dtype(c, dtype):
    dtype_check(c, dtype)


def test_integer_and_bool_arguments_get_no_gradient():
    c = case("where", np.array([True, False]), np.array([1, 2]), np.array([3, 4]))
    assert rule_vjp(c, np.ones(2, "int64")) == [None, None, None]
    c = case("multiply", np.array([1, 2]), np.array([3, 4]))
    assert rule_vjp(c, np.ones(2, "int64")) == [None, None]


def test_nondifferentiable_ops_say_why():
    for name in ("equal", "logical_not", "isnan", "floor_divide"):
        o = get_op(name)
        assert not o.differentiable and o.nondiff_reason


def test_max_tie_gradient_is_split_in_half():
    c = case("maximum", np.array([2.0, 1.0]), np.array([2.0, 3.0]))
    ga, gb = rule_vjp(c, np.array([1.0, 1.0]))
    np.testing.assert_array_equal(ga, [0.5, 0.0])
    np.testing.assert_array_equal(gb, [0.5, 1.0])


def test_power_exponent_gradient_is_zero_at_nonpositive_base():
    c = case("power", np.array([0.0, -2.0, 2.0]), np.array([2.0, 2.0, 2.0]))
    ga, gb = rule_vjp(c, np.ones(3))
    np.testing.assert_allclose(ga, [0.0, -4.0, 4.0])
    np.testing.assert_allclose(gb, [0.0, 0.0, 4.0 * np.log(2.0)])


def test_erf_is_accurate():
    x = np.linspace(-6, 6, 1001)
    y, _ = forward(case("erf", x))
    import math

    np.testing.assert_allclose(y, [math.erf(v) for v in x], rtol=1e-15, atol=0)
    y, _ = forward(case("erfc", x))  # in the tail too, where 1 - erf(x) is all rounding
    np.testing.assert_allclose(y, [math.erfc(v) for v in x], rtol=1e-14, atol=0)


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
def test_log_gamma_family_is_accurate_on_every_target(target):
    """lgamma, digamma and polygamma against mpmath in float64, on both sides of the recurrence's shift point."""
    pytest.importorskip(target) if target != "numpy" else None
    mpmath = pytest.importorskip("mpmath")
    xs = np.array([0.05, 0.7, 1.0, 1.3, 2.5, 11.9, 12.5, 40.0, 300.0])
    x = pullback.var("x", shape=xs.shape, dtype="float64")
    for name, attrs, ref in [("lgamma", {}, mpmath.loggamma), ("digamma", {}, mpmath.digamma)] + [
            ("polygamma", {"n": n}, lambda v, n=n: mpmath.polygamma(n, v)) for n in (1, 2, 3, 5)]:
        mod = pullback.IRModule.from_expr(pullback.Function([x], get_op(name)(x, **attrs)))
        got = np.asarray(pullback.build(mod, target=target)["main"](xs))
        want = np.array([float(ref(v)) for v in xs])
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15, err_msg=f"{name} {attrs} on {target}")



@pytest.mark.parametrize("target", ["numpy", "numpy without scipy", "jax", "torch"])
def test_lgamma_at_its_poles_and_infinities_is_eager_pytorchs(target, monkeypatch):
    """+inf at -inf (SciPy's gammaln gives -inf; libm's fallback raised OverflowError), at 0 and the negative
    integers; NaN stays NaN."""
    torch = pytest.importorskip("torch")
    if target == "numpy without scipy":
        from pullback.ops import special

        monkeypatch.setattr(special, "_scipy_special", lambda: None)
        target = "numpy"
    elif target != "numpy":
        pytest.importorskip(target)
    xs = np.array([-np.inf, np.inf, np.nan, 0.0, -1.0, -2.0, -2.5, 0.5])
    x = pullback.var("x", shape=xs.shape, dtype="float64")
    got = pullback.build(pullback.IRModule.from_expr(pullback.Function([x], op.lgamma(x))), target=target)["main"](xs)
    np.testing.assert_allclose(np.asarray(got), torch.lgamma(torch.from_numpy(xs)).numpy(), rtol=1e-13)

def test_errors_name_the_op():
    x = pullback.var("x", shape=(2, 3))
    i = pullback.var("i", shape=(2, 3), dtype="int32")
    b = pullback.var("b", shape=(2, 3), dtype="bool")
    with pytest.raises(AttrError, match="clip.*a_min"):
        op.clip(x, 2.0, 1.0)
    with pytest.raises(AttrError, match="clip.*a_max"):
        op.clip(x, 0.0, "big")
    bad = [op.exp(i), op.add(x, i), op.add(x, pullback.var("y", shape=(4,))), op.logical_and(x, x),
           op.logical_not(x), op.where(x, x, x), op.where(b, x, i)]
    names = ["exp", "add", "add", "logical_and", "logical_not", "where", "where"]
    for e, name in zip(bad, names):
        with pytest.raises(TypeInferenceError, match=name):
            pullback.analysis.infer_expr(e)


def test_any_dims_broadcast():
    x = pullback.var("x", shape=(pullback.Any, 3))
    y = pullback.var("y", shape=(2, 1, 1))
    t = pullback.analysis.infer_expr(op.add(x, y))
    assert t.shape == (2, pullback.Any, 3)
    assert pullback.analysis.infer_expr(op.greater(x, y)).dtype == "bool"


def test_flops_count_elements():
    x = pullback.var("x", shape=(4, 5))
    e = op.tanh(x)
    pullback.analysis.infer_expr(e)
    assert e.op.flops([x.checked_type], e.checked_type, None) == 4 * 20


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_ad_pass_gradient(c):
    check_ad(c)


SECOND_ORDER = [case(n, g((2, 3))) for n, g in [("tanh", normal), ("sigmoid", normal), ("exp", normal), ("log", positive),
                                                 ("erf", normal), ("sqrt", positive), ("sin", normal),
                                                 ("lgamma", positive), ("digamma", positive)]] + [
    case(n, normal((2, 3)), gb((3,))) for n, gb in [("multiply", normal), ("divide", nonzero)]] + [
    case("power", positive((2, 3)), normal((3,)))]


@pytest.mark.parametrize("c", SECOND_ORDER, ids=repr)
def test_second_order(c):
    check_second(c)


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unary_operators_in_half_precision_on_every_target(dtype, target, monkeypatch):
    """Every unary operator of the table on float16 and bfloat16 tensors gives a tensor of that dtype: on numpy
    and jax within two roundings of the float64 result on the same (rounded) inputs (XLA composes some in the
    half type: jax's bfloat16 ``log2`` is ``log`` then a product, 1.1 ulp off at 0.992; float32's own error where
    the result is near 0: ``lgamma(1)``), on torch eager PyTorch's bits (its kernels: ``i0e`` in float16 is 3 half
    ulps off; ``ndtri`` has no float16 CPU kernel, in eager too). jax's ``ndtri`` and ``log_ndtr`` refused half
    types: they now compute in float32."""
    pytest.importorskip(target) if target != "numpy" else None
    ml_dtypes = pytest.importorskip("ml_dtypes")
    monkeypatch.setattr(sys.modules[__name__], "RNG", np.random.default_rng(5))  # the same inputs in any test order
    half = np.dtype(getattr(ml_dtypes, dtype)) if dtype == "bfloat16" else np.dtype(dtype)
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11  # a half ulp, relative
    problems = []
    for name, gen, eager in UNARY:
        xs = gen((3, 5)).astype(half)
        x = pullback.var("x", shape=xs.shape, dtype=dtype)
        run = pullback.build(pullback.Function([x], get_op(name)(x)), target=target)["main"]
        if target == "torch":
            import torch

            t = torch.from_numpy(xs.view(np.int16)).view(getattr(torch, dtype))
            try:
                want = eager(t)
            except NotImplementedError as e:  # no ATen kernel: bfloat16 computed in float32 (opmath), float16 as eager
                if dtype == "float16":
                    with pytest.raises(pullback.ExecutionError, match=str(e).splitlines()[0][:40]):
                        run(t)
                    continue
                run = (lambda f: lambda v: f(torch.from_numpy(v.view(np.int16)).view(torch.bfloat16))
                       .view(torch.int16).numpy().view(half))(run)
            else:
                got = run(t)
                if got.dtype != want.dtype or not torch.equal(got, want):
                    problems.append(f"{name}: {got.tolist()}, eager {want.tolist()}")
                continue
        ref_x = pullback.var("x", shape=xs.shape, dtype="float64")
        want = np.asarray(pullback.build(pullback.Function([ref_x], get_op(name)(ref_x)))["main"](xs.astype("float64")))
        try:
            got = np.asarray(run(xs))
        except Exception as e:  # noqa: BLE001 - listed with the others
            problems.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[-1][:160]}")
            continue
        if got.dtype != half:
            problems.append(f"{name}: {got.dtype}, not {dtype}")
            continue
        err = np.abs(got.astype("float64") - want)
        bound = 4 * ulp * np.abs(want) + 1e-6
        if not np.all(err <= bound):
            k = int(np.argmax(err - bound))
            problems.append(f"{name}: {got.flat[k]} at x = {xs.flat[k]}, float64 gives {want.flat[k]}")
    assert not problems, "\n".join(problems)
