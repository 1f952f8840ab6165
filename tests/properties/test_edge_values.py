"""Edge values: each semantics defined once, the same on every target (issue 15).

A table of operators x edge values x targets (numpy, jax, torch). Each row states the
defined result, not only that targets agree:

- integer ``divide`` / ``floor_divide`` / ``mod`` / ``remainder`` by zero: an ExecutionError
  (PyTorch's rule; NumPy would give 0 and XLA -1);
- ``max`` / ``min`` over a slice holding NaN: NaN, and a NaN gradient for every entry of the
  slice (torch.amax's rule); ``maximum`` / ``minimum`` where an operand is NaN: NaN, and a NaN
  gradient for both operands (PyTorch gives both the whole gradient; NaN in, NaN out instead);
- ``nn.max_pool2d`` (and its indices and gradient) over a window holding NaN: NaN, the index and the gradient
  at the window's last NaN (PyTorch's rule; ties keep the first maximum);
- ``std`` / ``variance`` of a constant slice: exactly 0, with a zero gradient (PyTorch's rule);
  unbiased over one entry: NaN, gradient NaN;
- an index out of range in ``take(mode="fast")``, ``gather``, ``scatter``, ``scatter_add``,
  ``index_add(mode="fast")``, ``nn.nll_loss`` targets: an ExecutionError (the jax target checks
  inside the XLA program and raises after the call, also inside If branches and called
  functions); ``mode="clip"`` / ``"wrap"`` define the value instead.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.transform import FirstOrderGradient

TARGETS = [t for t in ("numpy", "jax", "torch") if t == "numpy" or importlib.util.find_spec(t)]
NAN = math.nan


def _v(name, shape, dtype="float32"):
    return pb.var(name, shape=shape, dtype=dtype)


def _mod(params, body):
    return pb.IRModule.from_expr(pb.Function(params, body))


def _np(value):
    if isinstance(value, tuple):
        return tuple(_np(v) for v in value)
    return value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)


def _run(mod, target, inputs, fn="main"):
    return _np(pb.build(mod, target=target)[fn](*inputs))


# ------------------------------------------------------------------ integer division by zero

DIVISIONS = [
    ("divide", lambda a, b: op.divide(a, b)),
    ("floor_divide", lambda a, b: op.floor_divide(a, b)),
    ("mod", lambda a, b: op.mod(a, b)),
    ("remainder", lambda a, b: op.remainder(a, b)),
]
DIVISORS = {  # name -> (dividend, divisor): every one has a zero divisor somewhere
    "all-zero": (np.array([7, -7, 0]), np.array([0, 0, 0])),
    "one-zero": (np.arange(-4, 5), np.array([1, 2, 3, -1, 0, 2, 3, 4, 5])),
    "zero-scalar": (np.array([[1, 2], [3, 4]]), np.array(0)),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8"])
@pytest.mark.parametrize("divisors", sorted(DIVISORS))
@pytest.mark.parametrize("name,build", DIVISIONS, ids=[f"{n}{i}" for i, (n, _) in enumerate(DIVISIONS)])
def test_integer_division_by_zero_is_an_error(name, build, divisors, dtype, target):
    a, b = DIVISORS[divisors]
    a = np.abs(a) if dtype == "uint8" else a
    a, b = a.astype(dtype), b.astype(dtype)
    pa, pb_ = _v("a", a.shape, dtype), _v("b", b.shape, dtype)
    mod = _mod([pa, pb_], build(pa, pb_))
    with pytest.raises(pb.ExecutionError, match=f"@main: {name}: integer division by zero"):
        _run(mod, target, [a, b])
    ok = np.where(b == 0, 1, b).astype(dtype)  # the same program without the zero: the values of NumPy
    want = _run(mod, "numpy", [a, ok])
    np.testing.assert_array_equal(_run(mod, target, [a, ok]), want)


@pytest.mark.parametrize("target", TARGETS)
def test_float_division_by_zero_is_ieee(target):
    a, b = _v("a", (3,)), _v("b", (3,))
    mod = _mod([a, b], pb.Tuple([op.divide(a, b), op.floor_divide(a, b), op.mod(a, b)]))
    got = _run(mod, target, [np.array([1, -1, 0], "float32"), np.zeros(3, "float32")])
    np.testing.assert_array_equal(got[0], [np.inf, -np.inf, np.nan])
    assert np.isnan(got[2]).all()


# ------------------------------------------------------------------ max / min over NaN

EXTREMES = [("max", op.max), ("min", op.min)]
NAN_INPUTS = {  # name -> (x, axis, keepdims)
    "nan-all-axes": (np.array([[1, NAN, 3], [4, 5, 6]]), None, False),
    "nan-one-row": (np.array([[1, NAN, 3], [4, 5, 6]]), 1, False),
    "nan-one-column": (np.array([[1, NAN, 3], [4, 5, 6]]), 0, True),
    "all-nan": (np.full((2, 2), NAN), 1, True),
    "nan-and-inf": (np.array([[np.inf, NAN], [-np.inf, 1]]), 1, False),
    "ties-no-nan": (np.array([[2, 2, 1], [0, 5, 5]]), 1, False),
}


def _extreme_reference(name: str, x: np.ndarray, axis, keepdims: bool):
    """(value, gradient of its sum) by the defined rule: NaN slices give NaN, ties share evenly."""
    f = np.max if name == "max" else np.min
    y = f(x, axis=axis, keepdims=True)
    mask = (x == y).astype(x.dtype)
    count = mask.sum(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        grad = np.where(np.isnan(y), NAN, mask / count)
    return (y if keepdims else f(x, axis=axis, keepdims=False)), np.broadcast_to(grad, x.shape)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("inputs", sorted(NAN_INPUTS))
@pytest.mark.parametrize("name,fn", EXTREMES, ids=[n for n, _ in EXTREMES])
def test_max_min_over_nan(name, fn, inputs, target):
    x, axis, keepdims = NAN_INPUTS[inputs]
    x = x.astype("float32")
    p = _v("x", x.shape)
    mod = FirstOrderGradient()(_mod([p], fn(p, axis=axis, keepdims=keepdims)))
    value, (grad,) = _run(mod, target, [x], "main_grad")
    want_value, want_grad = _extreme_reference(name, x, axis, keepdims)
    np.testing.assert_array_equal(value, want_value)
    np.testing.assert_array_equal(grad, want_grad)  # NaN positions included


PAIRS = {  # name -> (a, b)
    "nan-left": (np.array([NAN, 1, 2]), np.array([0, 0, 3])),
    "nan-right": (np.array([0, 0, 3]), np.array([NAN, 1, 2])),
    "both-nan": (np.array([NAN, NAN]), np.array([NAN, 1])),
    "inf-ties": (np.array([np.inf, -np.inf, 1]), np.array([np.inf, -np.inf, 1])),
    "broadcast-nan": (np.array([[NAN], [1]]), np.array([0, 2])),
}


def _pair_reference(name: str, a: np.ndarray, b: np.ndarray):
    pick = np.greater if name == "maximum" else np.less
    lose = np.less if name == "maximum" else np.greater
    a, b = np.broadcast_arrays(a, b)
    wins = np.where(pick(a, b), 1.0, np.where(lose(a, b), 0.0, np.where(a == b, 0.5, NAN)))
    return (np.maximum if name == "maximum" else np.minimum)(a, b), wins, 1.0 - wins


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("inputs", sorted(PAIRS))
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_with_nan(name, inputs, target):
    a, b = (v.astype("float32") for v in PAIRS[inputs])
    pa, pb_ = _v("a", a.shape), _v("b", b.shape)
    mod = FirstOrderGradient()(_mod([pa, pb_], getattr(op, name)(pa, pb_)))
    value, (ga, gb) = _run(mod, target, [a, b], "main_grad")
    want, wa, wb = _pair_reference(name, a, b)
    np.testing.assert_array_equal(value, want)
    np.testing.assert_array_equal(ga, _unbroadcast(wa, a.shape))
    np.testing.assert_array_equal(gb, _unbroadcast(wb, b.shape))


def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    return g.sum(axis=tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1), keepdims=True).reshape(shape)


# ------------------------------------------------------------------ std / variance of a constant

CONSTANTS = {  # name -> (x, axis, unbiased); every reduced slice constant
    "0.1-x7": (np.full(7, 0.1), None, False),
    "7.7-x3-unbiased": (np.full(3, 7.7), None, True),
    "123.456-x10": (np.full(10, 123.456), None, False),
    "rows": (np.array([[0.3] * 7, [1 / 3] * 7]), 1, True),
    "columns": (np.array([[0.1, 2.0], [0.1, 2.0], [0.1, 2.0]]), 0, False),
    "3d-two-axes": (np.full((2, 3, 4), -1e-3), (0, 2), False),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("inputs", sorted(CONSTANTS))
@pytest.mark.parametrize("name", ["std", "variance"])
def test_std_and_variance_of_a_constant(name, inputs, dtype, target):
    x, axis, unbiased = CONSTANTS[inputs]
    x = x.astype(dtype)
    p = _v("x", x.shape, dtype)
    mod = FirstOrderGradient()(_mod([p], getattr(op, name)(p, axis=axis, unbiased=unbiased)))
    value, (grad,) = _run(mod, target, [x], "main_grad")
    assert (np.asarray(value) == 0).all(), value  # exactly 0 on every target, whatever the rounding of the mean
    assert (grad == 0).all(), grad


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["std", "variance"])
def test_std_and_variance_mixed_slices_and_one_entry(name, target):
    x = np.array([[2.0, 2.0, 2.0], [1.0, 2.0, 3.0]], "float32")
    p = _v("x", x.shape)
    mod = FirstOrderGradient()(_mod([p], getattr(op, name)(p, axis=1)))
    value, (grad,) = _run(mod, target, [x], "main_grad")
    c = x[1] - x[1].mean()
    want = c / (3 * np.sqrt((c * c).mean())) if name == "std" else 2 * c / 3
    np.testing.assert_allclose(grad, np.stack([np.zeros(3), want]), rtol=1e-6, atol=1e-7)
    one = _v("y", (1,))
    mod1 = FirstOrderGradient()(_mod([one], getattr(op, name)(one, unbiased=True)))
    value1, (grad1,) = _run(mod1, target, [np.array([2.0], "float32")], "main_grad")
    assert np.isnan(value1) and np.isnan(grad1).all()  # N - 1 = 0: NaN, as in PyTorch


# ------------------------------------------------------------------ indices out of range

X3 = np.array([1.0, 2.0, 3.0], "float32")
INDEX_OPS = {  # name -> (builder of params, inputs (bad index last), words)
    "take-fast": (lambda x, i: op.take(x, i, mode="fast"), [X3], ["take", "out of range"]),
    "take-fast-axis": (lambda x, i: op.take(x, i, axis=1, mode="fast"), [np.ones((2, 3), "float32")], ["take", "out of range"]),
    "gather": (lambda x, i: op.gather(x, 0, i), [X3], ["gather", "out of range [0, 3)"]),
    "scatter_add": (lambda x, i: op.scatter_add(x, i, op.ones_like(op.cast(i, "float32")), 0), [X3],
                    ["scatter_add", "out of range"]),
    "scatter": (lambda x, i: op.scatter(x, i, op.ones_like(op.cast(i, "float32")), 0), [X3], ["scatter", "out of range"]),
    "index_add": (lambda x, i: op.index_add(x, i, op.ones_like(op.cast(i, "float32")), None, "fast"), [X3],
                  ["index_add", "out of range"]),
}
FAST = {"take-fast", "take-fast-axis", "index_add"}  # mode="fast": -n <= i < n, negative counting from the end
BAD_INDICES = {"past-the-end": [0, 3], "far": [2, 1000], "negative": [-1, 0], "very-negative": [0, -4]}


def _index_mod(build, data_shape, n: int, dtype: str = "int32", where: str = "plain"):
    x, i = _v("x", data_shape), _v("i", (n,), dtype)
    body = build(x, i)
    if where == "if":  # inside a branch: lax.cond on jax
        c = _v("c", (), "bool")
        t = body.checked_type
        return _mod([x, i, c], pb.If(c, body, op.zeros(t.shape, t.dtype)))
    if where == "call":  # in a called function
        gv = pb.GlobalVar("f")
        xf, i_f = _v("xf", data_shape), _v("if_", (n,), dtype)
        mod = pb.IRModule({gv: pb.Function([xf, i_f], build(xf, i_f))})
        return mod.with_function("main", pb.Function([x, i], pb.Call(gv, [x, i])))
    return _mod([x, i], body)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("where", ["plain", "if", "call"])
@pytest.mark.parametrize("bad", sorted(BAD_INDICES))
@pytest.mark.parametrize("name", sorted(INDEX_OPS))
def test_index_out_of_range_is_an_error(name, bad, where, target):
    build, data, words = INDEX_OPS[name]
    idx = np.array(BAD_INDICES[bad], "int32")
    if name in FAST and bad == "negative":
        pytest.skip("mode='fast' counts -1 from the end (in range)")
    mod = _index_mod(build, data[0].shape, len(idx), where=where)
    args = data + [idx] + ([np.array(True)] if where == "if" else [])
    with pytest.raises(pb.ExecutionError) as ei:
        _run(mod, target, args)
    assert all(w in str(ei.value) for w in words), ei.value
    if where == "if":  # the branch that is not taken does not fail
        got = _run(mod, target, data + [idx, np.array(False)])
        assert not np.asarray(got).any()
    good = np.array([0, 2], "int32")
    np.testing.assert_allclose(_run(mod, target, data + [good] + args[len(data) + 1:]),
                               _run(mod, "numpy", data + [good] + args[len(data) + 1:]))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode,want", [("clip", [3.0, 1.0, 3.0]), ("wrap", [X3[3 % 3], X3[-1 % 3], X3[1000 % 3]])])
def test_take_clip_and_wrap_define_the_value(mode, want, target):
    x, i = _v("x", (3,)), _v("i", (3,), "int32")
    mod = _mod([x, i], op.take(x, i, mode=mode))
    np.testing.assert_array_equal(_run(mod, target, [X3, np.array([3, -1, 1000], "int32")]), want)


NLL_TARGETS = {"too-big": [0, 3], "negative": [-1, 1], "far": [5, 7]}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("bad", sorted(NLL_TARGETS))
def test_nll_loss_target_out_of_range_is_an_error(bad, grad, target):
    p, t, w = _v("p", (2, 3)), _v("t", (2,), "int64"), _v("w", (3,))
    mod = _mod([p, t, w], op.nn.nll_loss(p, t, w))
    fn = "main"
    if grad:
        mod, fn = FirstOrderGradient(wrt=["p"])(mod), "main_grad"
    lp = np.log(np.full((2, 3), 1 / 3, "float32"))
    with pytest.raises(pb.ExecutionError, match="nn.nll_loss: .*target.* out of range \\[0, 3\\)"):
        _run(mod, target, [lp, np.array(NLL_TARGETS[bad], "int64"), np.ones(3, "float32")], fn)
    ignored = np.array([-100, 1], "int64")  # ignore_index is not a class: no error, the other target counts
    got = _run(mod, target, [lp, ignored, np.ones(3, "float32")], fn)
    want = _run(mod, "numpy", [lp, ignored, np.ones(3, "float32")], fn)
    np.testing.assert_allclose(got[0] if grad else got, want[0] if grad else want, rtol=1e-6)


def test_traced_kernels_outside_the_jax_target_keep_their_own_behaviour():
    """Kernels traced by a user's own jax.jit have no collector: nothing is checked (XLA clamps)."""
    jax = pytest.importorskip("jax")
    fn = op.gather.impl("jax")
    out = jax.jit(lambda x, i: fn(x, i, op.gather.make_attrs(axis=0)))(X3, np.array([0, 7], "int32"))
    assert np.asarray(out).tolist() == [1.0, 3.0]


# ------------------------------------------------------------------ max pooling over NaN


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("attrs", [dict(pool_size=(2, 3), strides=(2, 3)), dict(pool_size=(3, 3), strides=(1, 2), padding=(1, 1, 1, 1)),
                                   dict(pool_size=(2, 2), strides=(1, 1), dilation=(2, 1))])
def test_max_pooling_of_windows_holding_nan_is_pytorchs(target, attrs):
    """A window holding NaN pools to NaN, its index and its gradient at its last NaN; ties keep the first
    maximum: PyTorch's max_pool2d, its indices and its gradient, on every target (the numpy target once let NaN
    through only at a window's first tap)."""
    torch = pytest.importorskip("torch")
    x = np.round(np.random.default_rng(5).standard_normal((2, 3, 6, 9))).astype(np.float32)
    x[0, 0, 0, 1] = x[0, 0, 1, 0] = x[1, 2, 3, 4] = x[1, 1, :, 5] = np.nan
    x[0, 1, 0, 0] = np.nan  # a window's first tap
    xt = torch.tensor(x, requires_grad=True)
    pads = attrs.get("padding", (0,) * 4)
    want, want_idx = torch.nn.functional.max_pool2d(xt, attrs["pool_size"], attrs["strides"], pads[:2],
                                                    attrs.get("dilation", (1, 1)), return_indices=True)
    g = np.random.default_rng(6).standard_normal(want.shape).astype(np.float32)
    want.backward(torch.tensor(g))
    xv, gv = pb.var("x", shape=x.shape), pb.var("g", shape=g.shape)
    outs = [op.nn.max_pool2d(xv, **attrs), op.nn.max_pool2d_with_indices(xv, **attrs), op.nn.max_pool2d_grad(gv, xv, **attrs)]
    exe = pb.build(pb.IRModule.from_expr(pb.Function([gv, xv], pb.Tuple(outs))), target=target)
    y, (yi, idx), dx = exe["main"](g, x)
    for v in (y, yi):
        np.testing.assert_array_equal(np.asarray(v), want.detach().numpy())  # NaN where PyTorch has NaN
    np.testing.assert_array_equal(np.asarray(idx), want_idx.numpy())
    np.testing.assert_allclose(np.asarray(dx), xt.grad.numpy(), rtol=1e-6, atol=1e-6)
