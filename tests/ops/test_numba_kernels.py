"""GELU and its gradient compiled by numba (``ops.numba_kernels``) against float64 references, the NumPy
kernels' handling of NaN, inf and overflow, and the fallback when numba is off."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pullback.ops import get_op
from pullback.ops import numba_kernels as NK

pytest.importorskip("numba")
RNG = np.random.default_rng(11)
APPROX = ["none", "tanh"]


def _reference(name, arrays, approximate):
    o = get_op(name)
    return o.kernel(np, *[a.astype(np.float64) for a in arrays], o.make_attrs(approximate=approximate))


def _numpy_kernel(name, arrays, approximate, monkeypatch):
    """The op's NumPy implementation with numba turned off."""
    with monkeypatch.context() as m:
        m.setenv("PULLBACK_NUMBA", "0")
        NK._compiled.cache_clear()
        o = get_op(name)
        out = o.compute(*arrays, o.make_attrs(approximate=approximate))
    NK._compiled.cache_clear()
    return out


@pytest.mark.parametrize("approximate", APPROX)
def test_gelu_and_its_gradient_are_within_float32_rounding_of_float64(approximate):
    x = np.linspace(-14, 14, 200_001, dtype=np.float32)
    g = RNG.uniform(-2, 2, x.shape).astype(np.float32)
    y, gy = NK.gelu(x, approximate), NK.gelu_grad(g, x, approximate)
    assert y.dtype == gy.dtype == np.float32
    want_y = _reference("nn.gelu", [x], approximate)
    want_g = _reference("nn.gelu_grad", [g, x], approximate)
    # a few ulp of the result, and 1e-6 absolute where the result is near zero (cancellation in the reference)
    np.testing.assert_allclose(y, want_y, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(gy, want_g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("approximate", APPROX)
def test_special_values_give_what_the_numpy_kernel_gives(approximate, monkeypatch):
    """NaN stays NaN; +-inf and values whose cube overflows give the NumPy kernel's IEEE results."""
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 50, -50, 3e-39, -5, 5, 1e-20], np.float32)
    x = np.resize(specials, NK.MIN_SIZE)  # large enough for the compiled loops
    g = np.ones_like(x)
    with np.errstate(all="ignore"):
        for name, args in (("nn.gelu", [x]), ("nn.gelu_grad", [g, x])):
            got = NK.gelu(x, approximate) if name == "nn.gelu" else NK.gelu_grad(g, x, approximate)
            want = _numpy_kernel(name, args, approximate, monkeypatch)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("approximate", APPROX)
def test_the_numpy_target_uses_the_compiled_kernels_on_any_layout(approximate):
    """Through the op: C-contiguous, transposed and strided float32 inputs give the float64 reference's values
    (closer than the NumPy kernel, whose ``1 - tanh^2`` cancels), and the inputs are not written."""
    base = RNG.standard_normal((768, 192)).astype(np.float32) * 3
    gbase = RNG.standard_normal((768, 192)).astype(np.float32)
    for x, g in ((base, gbase), (base.T, gbase.T), (base[::2, ::2], gbase[::2, ::2])):
        assert x.size >= NK.MIN_SIZE
        keep = x.copy(), g.copy()
        for name, args in (("nn.gelu", [x]), ("nn.gelu_grad", [g, x])):
            o = get_op(name)
            got = o.compute(*args, o.make_attrs(approximate=approximate))
            want = _reference(name, args, approximate)
            assert got.shape == want.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(x, keep[0])
        np.testing.assert_array_equal(g, keep[1])


def test_other_dtypes_shapes_and_numba_off_fall_back_to_numpy(monkeypatch):
    x32 = np.ones((3, 4), np.float32)
    assert NK.gelu(x32.astype(np.float64), "none") is None
    assert NK.gelu(x32.astype(np.float16), "none") is None
    assert NK.gelu(np.float32(1.0) * np.ones((), np.float32), "none") is None  # 0-d: the NumPy kernel
    assert NK.gelu_grad(np.ones((4,), np.float32), x32, "none") is None  # different shapes
    assert NK.gelu(np.zeros((0, 5), np.float32), "tanh") is None
    assert NK.gelu(np.ones((NK.MIN_SIZE - 1,), np.float32), "tanh") is None  # small: NumPy's kernel
    big = np.ones((NK.MIN_SIZE,), np.float32)
    monkeypatch.setenv("PULLBACK_NUMBA", "0")
    NK._compiled.cache_clear()
    try:
        assert not NK.enabled()
        assert NK.gelu(big, "none") is None and NK.gelu_grad(big, big, "tanh") is None
    finally:
        monkeypatch.delenv("PULLBACK_NUMBA")
        NK._compiled.cache_clear()
    assert NK.enabled() and NK.gelu(big, "none") is not None


def test_exp_is_float32_accurate_on_its_whole_range():
    from pullback.ops.numba_loops import exp

    v = np.concatenate([np.linspace(-100, 100, 20_001), [-87.0, 88.7, 88.72, 0.0, -0.0]]).astype(np.float32)
    got = np.array([exp(x) for x in v], np.float32)
    want = np.exp(v.astype(np.float64))
    normal = (v >= -87) & (v <= 88.7)
    np.testing.assert_allclose(got[normal], want[normal], rtol=3e-7)
    assert np.all(got[v < -87] <= 2e-38) and np.all(got[v > 88.72] == np.inf)
    assert np.isnan(exp(np.float32(np.nan)))


def _rows_cases():
    x = RNG.standard_normal((257, 129)).astype(np.float32) * 4  # above NK.MIN_SIZE
    g = RNG.standard_normal((257, 129)).astype(np.float32)
    gamma, beta = RNG.standard_normal(129).astype(np.float32), RNG.standard_normal(129).astype(np.float32)
    sm = np.exp(x - x.max(-1, keepdims=True))
    sm /= sm.sum(-1, keepdims=True)
    return [("nn.softmax", [x], {}), ("nn.log_softmax", [x], {}), ("nn.softmax_grad", [g, sm], {}),
            ("nn.log_softmax_grad", [g, np.log(sm)], {}), ("nn.log_softmax_grad", [g, x], {}),  # any y, exp of y > 0
            ("nn.layer_norm", [x + 3, gamma, beta], {}), ("nn.layer_norm", [x, gamma, beta], dict(scale=False)),
            ("nn.layer_norm", [x, gamma, beta], dict(center=False, epsilon=0.1)),
            ("nn.layer_norm_grad", [g, x + 3, gamma], {}), ("nn.layer_norm_grad", [g, x, gamma], dict(scale=False)),
            ("nn.layer_norm_grad", [g, x, gamma], dict(center=False, scale=False))]


@pytest.mark.parametrize("k", range(len(_rows_cases())))
def test_row_loops_match_float64_and_the_numpy_kernels(k, monkeypatch):
    name, arrays, attrs = _rows_cases()[k]
    o = get_op(name)
    a = o.make_attrs(**attrs)
    got = o.compute(*arrays, a)
    want = o.kernel(np, *[v.astype(np.float64) for v in arrays], a)
    with monkeypatch.context() as m:
        m.setenv("PULLBACK_NUMBA", "0")
        NK._compiled.cache_clear()
        plain = o.compute(*arrays, a)
    NK._compiled.cache_clear()
    as_tuple = lambda v: v if isinstance(v, tuple) else (v,)  # noqa: E731
    for gv, wv, pv in zip(as_tuple(got), as_tuple(want), as_tuple(plain)):
        assert gv.dtype == np.float32 and gv.shape == wv.shape
        scale = max(1.0, float(np.abs(wv).max()))
        # at least as close to float64 as the NumPy kernel (or within 4e-7 of the scale)
        assert np.abs(gv - wv).max() <= max(4e-7 * scale, 1.5 * np.abs(pv - wv).max()), name


def test_row_loops_keep_nan_and_inf_as_numpy_does():
    x = RNG.standard_normal((NK.MIN_SIZE // 8, 9)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, :] = -np.inf
    x[2, 5] = -np.inf
    x[3, 2] = np.inf
    o = get_op("nn.softmax")
    with np.errstate(all="ignore"):
        got = o.compute(x, o.make_attrs())
    assert np.isnan(got[0]).all() and np.isnan(got[1]).all() and np.isnan(got[3]).all()
    assert got[2, 5] == 0 and np.isclose(got[2].sum(), 1, rtol=1e-6)
    assert not np.isnan(got[4:]).any() and np.allclose(got[4:].sum(1), 1, rtol=1e-5)


def test_a_program_with_small_activations_never_imports_numba():
    code = ("import sys, numpy as np, pullback as pb; from pullback import op\n"
            "x = pb.var('x', shape=(32, 10)); f = pb.Function([x], op.nn.log_softmax(op.nn.gelu(x)))\n"
            "pb.build(pb.IRModule.from_expr(f))['main'](np.ones((32, 10), 'float32'))\n"
            "assert 'numba' not in sys.modules, 'numba imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_a_numba_that_does_not_import_warns_once_and_numpy_kernels_run(tmp_path):
    broken = tmp_path / "numba"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('Numba needs NumPy 1.x')\n")  # found, fails to import
    code = ("import sys, warnings, numpy as np\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "from pullback.ops import get_op, numba_kernels as NK\n"
            "x = np.linspace(-3, 3, NK.MIN_SIZE, dtype=np.float32)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    o = get_op('nn.gelu'); y = o.compute(x, o.make_attrs())\n"
            "    o.compute(x, o.make_attrs(approximate='tanh'))\n"
            "assert [str(m.message)[:60] for m in w] == ['pullback: numba is installed but does not import (ImportErro'], w\n"
            "np.testing.assert_allclose(y, o.kernel(np, x.astype(np.float64), o.make_attrs()), rtol=1e-5, atol=1e-6)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("axis", [0, 1])
def test_an_embedding_gradient_adds_rows_as_np_add_at_does(axis, monkeypatch):
    """``index_add`` with repeated (and negative) indices on the numpy target: one compiled loop, bit for bit
    ``np.add.at``'s sums (the same additions in the same order), the kernel's own result with numba off; an index
    out of range is the op's error, nothing added."""
    import pullback as pb
    from pullback import Function, op, var

    shape, n = ((64, 512), 1024) if axis == 0 else ((4, 64, 128), 96)
    idx = RNG.integers(-shape[axis], shape[axis], n)
    upd_shape = shape[:axis] + (n,) + shape[axis + 1:]
    x, i, u = var("x", shape=shape), var("i", shape=(n,), dtype="int64"), var("u", shape=upd_shape)
    f = Function([x, i, u], op.index_add(x, i, u, axis=axis, mode="fast"))
    xs, us = RNG.standard_normal(shape).astype(np.float32), RNG.standard_normal(upd_shape).astype(np.float32)
    want = xs.copy()
    np.add.at(want, (slice(None),) * axis + (np.where(idx < 0, idx + shape[axis], idx),), us)
    calls = []
    loop = NK._compiled("add_rows")
    monkeypatch.setattr(NK, "_compiled", lambda name: (lambda *a: calls.append(name) or loop(*a)) if name == "add_rows" else None)
    got = pb.build(f)["main"](xs, idx, us)
    assert calls == ["add_rows"]
    np.testing.assert_array_equal(got, want)
    bad = idx.copy()
    bad[5] = shape[axis]
    with pytest.raises(pb.ExecutionError, match=f"index {shape[axis]} out of range"):
        pb.build(f)["main"](xs, bad, us)
    monkeypatch.setattr(NK, "_compiled", lambda name: None)  # numba off: the NumPy kernel, the same numbers
    np.testing.assert_array_equal(pb.build(f)["main"](xs, idx, us), want)
    assert calls == ["add_rows"]
