"""The nn operators (conv, pool, norm, loss, nn, activation) on every target give NumPy's result.

Every call of the nn case tables (test_nn_ops.py, the extra cases below) and of the
programs of test_nn_program.py is run, in float64 and in float32, with
``op.impl("jax")`` (inside ``jax.jit``, 64-bit types on) and ``op.impl("torch")``,
and, where a target has its own override, with the shared kernel on that
target's namespace too (so the kernel is right everywhere, not only where it
runs by default). Each call gets the same inputs as the NumPy reference (the
NumPy values of its arguments) and must return NumPy's dtype and shape, equal
integers, floats within a tolerance, and leave its inputs unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from pullback.analysis import infer_expr
from pullback.ir.expr import Call, Constant, Tuple, TupleGetItem, Var
from pullback.ir.traversal import post_order
from pullback.ops import list_ops
from pullback.ops.registry import array_namespace

from opgrad import case, vars_for
from test_nn_ops import CASES
from test_nn_program import PROGRAMS, _inputs

NN_MODULES = {"conv", "pool", "norm", "loss", "nn", "activation", "image"}
NN_OPS = {o.name for o in list_ops() if o.kernel is not None and o.kernel.__module__.rsplit(".", 1)[-1] in NN_MODULES}
TOLERANCE = {"float64": (1e-11, 1e-13), "float32": (2e-6, 1e-6)}  # (rtol, atol)
RNG = np.random.default_rng(3)


def _ties(*shape):
    return np.round(RNG.standard_normal(shape))  # many equal values per window


def _targets(*shape, c, dtype):
    return RNG.integers(0, c, shape).astype(dtype)


# paths of the target overrides the op tables do not reach: asymmetric or wide padding (ATen pads both sides
# equally, at most half the window), dilated average pooling, ties, int32 targets, batch_norm off axis 1
EXTRA = [
    case("nn.conv2d", RNG.standard_normal((1, 2, 6, 5)), RNG.standard_normal((3, 2, 2, 2)),
         attrs=dict(padding=(0, 1, 2, 0)), id="conv2d-asymmetric-padding"),
    case("nn.conv2d_transpose", RNG.standard_normal((2, 2, 4, 3)), RNG.standard_normal((2, 3, 3, 3)),
         attrs=dict(strides=(2, 1), padding=(1, 0, 2, 1), output_padding=(1, 0)), id="conv2d_transpose-asymmetric-padding"),
    case("nn.conv2d_backward_weight", RNG.standard_normal((2, 4, 3, 5)), RNG.standard_normal((2, 2, 6, 5)),
         attrs=dict(kernel_size=(2, 3), strides=(2, 1), padding=(1, 0, 0, 2)), id="conv2d_backward_weight-asymmetric"),
    case("nn.max_pool2d", RNG.standard_normal((1, 2, 7, 6)), attrs=dict(pool_size=(2, 3), strides=(2, 2), padding=(0, 1, 1, 0)),
         id="max_pool2d-asymmetric-padding"),
    case("nn.max_pool2d", RNG.standard_normal((1, 2, 5, 6)), attrs=dict(pool_size=(2, 2), strides=(1, 2), padding=(2, 2), ceil_mode=True),
         id="max_pool2d-padding-wider-than-half"),
    case("nn.max_pool2d_grad", RNG.standard_normal((1, 2, 4, 4)), _ties(1, 2, 6, 6),
         attrs=dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1), ceil_mode=True), wrt=[0], id="max_pool2d_grad-ties"),
    case("nn.max_pool2d_grad", RNG.standard_normal((1, 2, 4, 2)), _ties(1, 2, 7, 6),
         attrs=dict(pool_size=(2, 3), strides=(2, 2), padding=(0, 1, 1, 0), dilation=(1, 2)), wrt=[0],
         id="max_pool2d_grad-asymmetric-ties"),
    case("nn.max_pool2d_gather", _ties(1, 2, 7, 6), RNG.standard_normal((1, 2, 7, 6)),
         attrs=dict(pool_size=(2, 2), strides=(2, 2), padding=(1, 0, 0, 1)), wrt=[1], id="max_pool2d_gather-asymmetric-ties"),
    case("nn.max_pool2d_gather", _ties(1, 2, 6, 6), RNG.standard_normal((1, 2, 6, 6)),
         attrs=dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1), ceil_mode=True), wrt=[1], id="max_pool2d_gather-ties"),
    case("nn.avg_pool2d", RNG.standard_normal((1, 2, 7, 7)), attrs=dict(pool_size=(2, 2), strides=(2, 1), dilation=(2, 1)),
         id="avg_pool2d-dilated"),
    case("nn.avg_pool2d", RNG.standard_normal((1, 2, 6, 7)), attrs=dict(pool_size=(3, 2), strides=(2, 2), padding=(1, 0, 2, 1),
                                                                        ceil_mode=True, count_include_pad=True),
         id="avg_pool2d-asymmetric-padding"),
    case("nn.avg_pool2d_grad", RNG.standard_normal((2, 3, 4, 4)), RNG.standard_normal((2, 3, 6, 6)),
         attrs=dict(pool_size=(2, 2), strides=(2, 2), padding=(1, 1), count_include_pad=True), wrt=[0], id="avg_pool2d_grad-aten"),
    case("nn.avg_pool2d_grad", RNG.standard_normal((1, 2, 3, 6)), RNG.standard_normal((1, 2, 7, 7)),
         attrs=dict(pool_size=(2, 2), strides=(2, 1), dilation=(2, 1)), wrt=[0], id="avg_pool2d_grad-dilated"),
    case("nn.nll_loss", RNG.standard_normal((5, 4)), _targets(5, c=4, dtype="int32"), RNG.uniform(0.2, 1.0, 4), wrt=[0],
         id="nll_loss-int32-targets"),
    case("nn.nll_loss_grad", RNG.standard_normal((3, 2)), RNG.standard_normal((3, 4, 2)), _targets(3, 2, c=4, dtype="int32"),
         RNG.uniform(0.2, 1.0, 4), attrs=dict(reduction="none"), wrt=[0], id="nll_loss_grad-int32-spatial"),
    case("nn.batch_norm", RNG.standard_normal((3, 4, 2)), *RNG.standard_normal((3, 2)), RNG.uniform(0.5, 1.5, 2),
         attrs=dict(axis=2, training=True), id="batch_norm-training-axis2"),
    case("nn.batch_norm", RNG.standard_normal((1, 3)), *RNG.standard_normal((3, 3)), RNG.uniform(0.5, 1.5, 3),
         attrs=dict(training=True), id="batch_norm-training-one-per-channel"),
    case("nn.layer_norm", RNG.standard_normal((2, 3, 4)), RNG.standard_normal(4), RNG.standard_normal(4),
         attrs=dict(center=False), id="layer_norm-scale-only"),
]


def _programs() -> list:
    """(id, expr, vars, inputs) per program of test_nn_program.py."""
    out = []
    for name in sorted(PROGRAMS):
        fn = PROGRAMS[name][0]()
        out.append((f"program-{name}", fn.body, list(fn.params), _inputs(fn)))
    return out


def _subjects() -> list:
    """(id, expr, vars, inputs) of every case and program that calls an nn operator."""
    out = []
    for c in CASES + EXTRA:
        xs = vars_for(c.inputs)
        out.append((c.id, c.build(*xs), xs, c.inputs))
    return [s for s in out + _programs() if any(isinstance(n, Call) and n.op.name in NN_OPS for n in post_order(s[1]))]


def _runners(expr) -> list:
    """(target, how) pairs: the target's impl, and the shared kernel where the target has an override."""
    ops = [n.op for n in post_order(expr) if isinstance(n, Call) and n.op.name in NN_OPS]
    out = [("jax", "impl"), ("torch", "impl")]
    for target in ("numpy", "jax", "torch"):
        if any(target in o.impls for o in ops):
            out.append((target, "kernel"))
    return out


def _params():
    out = []
    for ident, expr, xs, inputs in _subjects():
        for target, how in _runners(expr):
            for dt in ("float64", "float32"):
                out.append(pytest.param(expr, xs, inputs, target, how, dt, id=f"{ident}-{target}-{how}-{dt}"))
    return out


def _in_dtype(expr, xs, inputs, dtype: str) -> tuple:
    """``expr`` rebuilt over new variables whose float inputs are ``dtype``, and those inputs."""
    inputs = [x.astype(dtype) if x.dtype.kind == "f" else x for x in inputs]
    new_xs = vars_for(inputs)
    new = dict(zip(xs, new_xs))
    for n in post_order(expr):
        if n in new:
            continue
        if isinstance(n, Call):
            new[n] = Call(n.op, [new[a] for a in n.args], n.attrs)
        elif isinstance(n, Tuple):
            new[n] = Tuple([new[f] for f in n.fields])
        elif isinstance(n, TupleGetItem):
            new[n] = TupleGetItem(new[n.tuple_value], n.index)
        else:
            raise TypeError(f"cannot rebuild a {type(n).__name__}")
    return new[expr], new_xs, inputs


# ------------------------------------------------------------------ running one call on a target


def _to_target(target: str, x: np.ndarray):
    if target == "jax":
        import jax.numpy as jnp

        return jnp.asarray(x)
    if target == "torch":
        import torch

        return torch.from_numpy(np.array(x, copy=True))
    return np.array(x, copy=True)


def _to_numpy(v):
    if isinstance(v, tuple):
        return tuple(_to_numpy(f) for f in v)
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


def _fn(op, target: str, how: str):
    if how == "impl":
        return op.impl(target)
    xp = array_namespace(target)
    return lambda *args: op.kernel(xp, *args)


def _run(op, attrs, args: list, target: str, how: str):
    """``op`` on ``target`` for NumPy ``args``; checks that the call leaves its inputs unchanged."""
    fn = _fn(op, target, how)
    xs = [_to_target(target, a) for a in args]
    if target == "jax":
        import jax

        out = jax.jit(lambda *a: fn(*a, attrs))(*xs)
    else:
        out = fn(*xs, attrs)
    for x, a in zip(xs, args):
        np.testing.assert_array_equal(_to_numpy(x), a, err_msg=f"{op.name} on {target} changed an input")
    return _to_numpy(out)


def _leaves(v) -> list:
    return [x for f in v for x in _leaves(f)] if isinstance(v, tuple) else [np.asarray(v)]


def _compare(got, want, what: str) -> None:
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape}, NumPy gives {w.dtype}{w.shape}"
        if w.dtype.kind == "f":
            rtol, atol = TOLERANCE[w.dtype.name]
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


def _check(expr, xs, inputs, target: str, how: str) -> int:
    """Evaluate ``expr`` on NumPy; run each nn call on ``target`` with the NumPy values of its arguments."""
    vals: dict = dict(zip(xs, inputs))
    checked = 0
    for n in post_order(expr):
        if isinstance(n, Var):
            continue
        if isinstance(n, Constant):
            vals[n] = n.data
        elif isinstance(n, Tuple):
            vals[n] = tuple(vals[f] for f in n.fields)
        elif isinstance(n, TupleGetItem):
            vals[n] = vals[n.tuple_value][n.index]
        elif isinstance(n, Call):
            args = [vals[a] for a in n.args]
            with np.errstate(all="ignore"):
                vals[n] = n.op.impl("numpy")(*args, n.attrs)
            if n.op.name in NN_OPS and (how == "impl" or target in n.op.impls):
                _compare(_run(n.op, n.attrs, args, target, how), vals[n], f"{n.op.name} on {target} ({how})")
                checked += 1
        else:
            raise TypeError(f"cannot evaluate a {type(n).__name__}")
    return checked


@pytest.mark.parametrize("expr, xs, inputs, target, how, dt", _params())
def test_nn_op_gives_numpy_result_on_target(expr, xs, inputs, target, how, dt):
    if target != "numpy":
        pytest.importorskip(target)
    expr, xs, inputs = _in_dtype(expr, xs, inputs, dt)
    infer_expr(expr)
    if target == "jax":
        import jax

        with jax.enable_x64(True):
            assert _check(expr, xs, inputs, target, how)
    else:
        assert _check(expr, xs, inputs, target, how)


def test_every_nn_op_is_checked_on_every_target():
    ops = {n.op.name for _, expr, _, _ in _subjects() for n in post_order(expr) if isinstance(n, Call)}
    assert NN_OPS <= ops, f"nn operators without a case: {sorted(NN_OPS - ops)}"
    assert len(NN_OPS) == 60, sorted(NN_OPS)  # every operator of conv, pool, norm, loss, nn, activation, image



@pytest.mark.parametrize("target", ["torch", "jax"])
@pytest.mark.parametrize("pool, strides, padding, ceil", [((2, 2), (1, 2), (2, 2), True), ((3, 3), (2, 2), (3, 1), False),
                                                          ((2, 3), (2, 2), (0, 1, 1, 0), False)])
def test_max_pool_gradient_with_padding_wider_than_half_the_window_is_numpys(target, pool, strides, padding, ceil):
    """Padding wider than ATen pads itself leaves windows wholly in the padding: their gradient goes to a padding
    position and is dropped, on every target (the torch target mapped those windows onto a data element, as
    ``max_pool2d_with_indices``' indices do: the gradient's sum was 56 where the 36 finite windows give 36)."""
    import pullback as pb
    from pullback import op, transform

    pytest.importorskip(target)
    xs = np.random.default_rng(1).standard_normal((1, 2, 5, 6))
    x = pb.var("x", shape=xs.shape, dtype="float64")
    y = op.nn.max_pool2d(x, pool_size=pool, strides=strides, padding=padding, ceil_mode=ceil)
    g = transform.FirstOrderGradient()(pb.IRModule.from_expr(pb.Function([x], op.sum(y))))
    value, (want,) = pb.build(g)["main_grad"](xs)
    finite = np.isfinite(pb.build(pb.Function([x], y))["main"](xs)).sum()
    assert want.sum() == finite
    arg = xs
    if target == "torch":
        import torch

        arg = torch.from_numpy(xs)
    got = np.asarray(pb.build(g, target=target)["main_grad"](arg)[1][0])
    np.testing.assert_array_equal(got, want)
