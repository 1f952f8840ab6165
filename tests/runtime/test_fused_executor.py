"""The fused NumPy executor: fused groups as single kernels equal the op-by-op run."""

import math

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.ir.expr import Call, Function, var
from pullback.ir.module import IRModule
from pullback.ir.traversal import post_order
from pullback.runtime.values import leaves
from pullback.testing.models import cnn, mlp, transformer_layer
from pullback.transform import FirstOrderGradient, FuseOps, standard_cleanup

MODELS = {
    "mlp": lambda: mlp(4, (8, 16, 16, 3)),
    "cnn": lambda: cnn(2, 8, (3, 4, 6), 5),
    "transformer": lambda: transformer_layer(2, 4, 8, 2, 16),
}


def _groups(mod: IRModule) -> int:
    return sum(1 for n in post_order(mod["main_grad"].body)
               if isinstance(n, Call) and isinstance(n.op, Function) and n.op.is_primitive)


def _flat(v):
    return [np.asarray(a) for a in leaves(v)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_gradient_equals_unfused(name):
    mod, make_inputs = MODELS[name]()
    grad = standard_cleanup()(FirstOrderGradient()(mod))
    fused = FuseOps()(grad)
    assert _groups(fused) > 0
    inputs = make_inputs(0)
    before = [a.copy() for a in inputs]
    ref = pullback.build(grad, fuse=False)["main_grad"](*inputs)
    for exe in (pullback.build(fused), pullback.build(fused, fuse=False), pullback.build(fused, check_outputs=True)):
        got = exe["main_grad"](*inputs)
        for r, g in zip(_flat(ref), _flat(got)):
            assert g.dtype == r.dtype and g.shape == r.shape
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    for a, b in zip(inputs, before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_profile_has_group_rows_and_peak(name):
    mod, make_inputs = MODELS[name]()
    fused = FuseOps()(standard_cleanup()(FirstOrderGradient()(mod)))
    prof = pullback.build(fused).profile(*make_inputs(0), func="main_grad")
    rows = [r for r in prof.rows if r.op.startswith("fused(")]
    assert rows and sum(r.calls for r in rows) == _groups(fused)
    assert prof.peak_bytes > 0
    assert "fused(" in prof.render()


def _prim(params, body):
    return Function(params, body, attrs={"Primitive": 1})


def test_group_never_writes_into_live_outer_values():
    x = var("x", shape=(3, 4), dtype="float32")
    a = op.exp(x)  # an intermediate that the group takes and the caller uses again
    p = var("p", shape=(3, 4), dtype="float32")
    t = op.tanh(p)
    g = Call(_prim([p], op.multiply(op.add(t, p), p)), [a])
    fn = Function([x], op.add(g, a))
    xs = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    e = np.exp(xs)
    want = (np.tanh(e) + e) * e + e
    np.testing.assert_allclose(pullback.build(fn)["main"](xs), want, rtol=1e-6)


def test_group_keeps_views_of_its_buffers_intact():
    p = var("p", shape=(2, 6), dtype="float32")
    t = op.tanh(p)
    r = op.reshape(t, (3, 4))  # a view of t's buffer lives on after t's last use
    m = op.multiply(t, p)      # t dies here: it must not be overwritten in place
    body = pullback.ir.expr.Tuple([op.sum(op.reshape(m, (3, 4)) + r), op.negative(r)])
    x = var("x", shape=(2, 6), dtype="float32")
    fn = Function([x], Call(_prim([p], body), [x]))
    xs = np.linspace(-2, 2, 12, dtype="float32").reshape(2, 6)
    got = pullback.build(fn)["main"](xs)
    ref = pullback.build(fn, fuse=False)["main"](xs)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[1], -np.tanh(xs).reshape(3, 4), rtol=1e-6)


def test_erf_kernel_matches_libm_in_float32():
    xs = np.linspace(-6, 6, 20001).astype("float32")
    want = np.array([math.erf(float(v)) for v in xs])
    got = op.erf.compute(xs, None)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.astype("float64"), want, rtol=1e-6, atol=1e-7)


def test_erf_and_gelu_kernels_match_reference():
    x = var("x", shape=(4, 50), dtype="float32")
    fn = Function([x], pullback.ir.expr.Tuple([op.erf(x), op.nn.gelu(x)]))
    xs = np.linspace(-5, 5, 200, dtype="float32").reshape(4, 50)
    erf, gelu = pullback.build(fn)["main"](xs)
    want = np.array([math.erf(float(v)) for v in xs.ravel()]).reshape(4, 50)
    assert erf.dtype == gelu.dtype == np.float32
    np.testing.assert_allclose(erf, want, atol=1e-6)
    cdf = 0.5 * (1 + np.array([math.erf(float(v) / math.sqrt(2.0)) for v in xs.ravel()]).reshape(4, 50))
    np.testing.assert_allclose(gelu, xs * cdf, rtol=1e-6, atol=1e-6)
