"""The fast paths of kernels (bitwise where, max-pool masks, conv2d_transpose routes, float32 erf)
against straightforward NumPy references, including NaN, inf, -0.0 and ties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pullback.ops import conv as C
from pullback.ops import pool as P
from pullback.ops.elemwise import _where_compute, select_or_zero
from pullback.ops.special import erf
from pullback.ir.errors import ExecutionError
from pullback.runtime.numpy_executor import Executable
from pullback.runtime.tuning import keep_freed_memory

RNG = np.random.default_rng(7)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _specials(dtype, shape):
    x = RNG.standard_normal(shape).astype(dtype)
    x.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    return x


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5), (4, 5)), ((4, 5), (5,), (4, 5)), ((4, 1), (4, 5), ()),
                                    ((5,), (4, 5), (4, 5)), ((4, 5), (4, 5), (1,))])
def test_where_with_a_zero_branch_matches_np_where_bitwise(dtype, shapes):
    cs, xs, ys = shapes
    c = RNG.standard_normal(cs) > 0
    x = _specials(dtype, xs) if len(xs) == 2 else RNG.standard_normal(xs).astype(dtype)
    for a, b in ((x, np.zeros(ys, dtype)), (np.zeros(ys, dtype), x), (x, np.full(ys, -0.0, dtype))):
        got, want = _where_compute(c, a, b), np.where(c, a, b)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5), (4, 5)), ((4, 5), (5,), (4, 1)), ((4, 5), (), (4, 5)),
                                    ((2, 3, 4), (3, 4), (2, 1, 4)), ((), (), ()), ((0, 5), (0, 5), (5,))])
@pytest.mark.parametrize("strided", [False, True])
def test_where_with_a_full_condition_matches_np_where_bitwise(dtype, shapes, strided):
    """A float ``where`` whose condition has the result's shape is a bitwise select, ``y ^ ((x ^ y) & mask)``:
    np.where's bits (NaN, inf, -0.0), branches that broadcast, 0-d and empty arrays, strided views; a new array."""
    cs, xs, ys = shapes
    c = RNG.standard_normal(cs) > 0
    x = _specials(dtype, xs) if np.prod(xs) >= 4 else RNG.standard_normal(xs).astype(dtype)
    y = RNG.standard_normal(ys).astype(dtype)
    if strided and x.ndim:
        x = np.repeat(x, 2, axis=-1)[..., ::2]
    got, want = _where_compute(np.asarray(c), np.asarray(x), np.asarray(y)), np.where(c, x, y)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(_bits(got), _bits(want))
    assert not np.shares_memory(got, x) and not np.shares_memory(got, y)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("cs, xs", [((2, 3, 4, 5), (2, 3, 4, 5)), ((4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (1, 3, 1, 5))])
@pytest.mark.parametrize("zero", [0.0, -0.0])
def test_where_against_a_zero_constant_on_torch_matches_np_where_bitwise(dtype, cs, xs, zero):
    """The torch target's select against a +0.0 constant (a bitwise AND with the condition) gives np.where's bits,
    NaN and inf included, in any memory layout; against -0.0 it is an ordinary where."""
    torch = pytest.importorskip("torch")
    import pullback as pb

    c = RNG.standard_normal(cs) > 0
    x = _specials(dtype, xs)
    z = pb.const(np.full((), zero, dtype))
    cv, xv = pb.var("c", shape=cs, dtype="bool"), pb.var("x", shape=xs, dtype=dtype)
    for keep_true in (True, False):
        body = pb.op.where(cv, xv, z) if keep_true else pb.op.where(cv, z, xv)
        exe = pb.build(pb.Function([cv, xv], body), target="torch")["main"]
        want = np.where(c, x, np.array(zero, dtype)) if keep_true else np.where(c, np.array(zero, dtype), x)
        xt = torch.from_numpy(x.copy())
        ct = torch.from_numpy(c.copy())
        for layout in (torch.contiguous_format, torch.channels_last):
            xl = xt.contiguous(memory_format=layout) if xt.dim() == 4 else xt
            got = exe(ct, xl).numpy()
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.array_equal(_bits(got), _bits(want)), (keep_true, layout)


@pytest.mark.parametrize("shape", [(4, 6, 5, 7), (2, 3, 1, 1)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_global_average_pool_gradient_on_torch_is_eagers_as_a_view(shape, channels_last):
    """adaptive_avg_pool2d_grad to a 1x1 output on torch: eager autograd's gradient of ``adaptive_avg_pool2d(x, 1)``
    (a mean) exactly, as a broadcast view of the output gradient (no filled tensor)."""
    torch = pytest.importorskip("torch")
    from pullback.ops import get_op

    x = torch.randn(shape, dtype=torch.float32)
    g = torch.randn(shape[:-2] + (1, 1), dtype=torch.float32)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    op = get_op("nn.adaptive_avg_pool2d_grad")
    got = op.impl("torch")(g, x, op.make_attrs(output_size=(1, 1)))
    xr = x.clone().requires_grad_(True)
    torch.nn.functional.adaptive_avg_pool2d(xr, 1).backward(g)
    assert got.shape == xr.grad.shape and torch.equal(got, xr.grad)
    torch.testing.assert_close(got, torch.ops.aten._adaptive_avg_pool2d_backward(g, x), rtol=1e-6, atol=0)
    assert shape[-2:] == (1, 1) or got.stride()[-2:] == (0, 0)
    np.testing.assert_allclose(got.numpy(), op.impl("numpy")(g.numpy(), x.numpy(), op.make_attrs(output_size=(1, 1))),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["nn.leaky_relu", "nn.leaky_relu_grad", "sigmoid", "nn.silu", "nn.silu_grad",
                                  "nn.clip_grad"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_numpy_activation_overrides_give_the_shared_kernels_bits(name, dtype):
    """The NumPy overrides of these activations (``where``'s bitwise select, quiet ``1 / (1 + e^-x)``, a masked
    AND) give the shared kernel's bits on NumPy, NaN, infinities and signed zeros included, and warn of nothing."""
    import warnings

    from pullback.ops import get_op

    o = get_op(name)
    x = _specials(dtype, (6, 7))
    x.flat[4:8] = [0.0, 100.0, -100.0, 1.0]
    g = RNG.standard_normal((6, 7)).astype(dtype)
    a = o.make_attrs(**{"nn.leaky_relu": {"alpha": 0.2}, "nn.leaky_relu_grad": {"alpha": 0.2},
                        "nn.clip_grad": {"a_min": -1.0, "a_max": 1.0}}.get(name, {}))
    args = (x,) if o.num_inputs == 1 else (g, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = o.kernel(np, *args, a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # overflow to inf in e^-x is the kernel's way: no warning
        got = o.impl("numpy")(*args, a)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(_bits(got), _bits(want)), name


def test_select_or_zero_writes_into_a_strided_out():
    g = _specials(np.float32, (3, 4))
    hit = RNG.standard_normal((3, 4)) > 0
    out = np.full((3, 2, 4), 7.0, np.float32)
    select_or_zero(hit, g, out=out[:, 1])
    assert np.array_equal(_bits(out[:, 1]), _bits(np.where(hit, g, np.float32(0))))
    assert np.all(out[:, 0] == 7.0)


def _reference_max_pool_grad(g, x, a):
    views, out = P._slices(np, x, a, -np.inf)
    _, idx = P._max_scan(views)
    kw = a.pool_size[1]
    return P._scatter(np, lambda i, j: np.where(idx == i * kw + j, g, np.zeros((), g.dtype)), x, a, out)


@pytest.mark.parametrize("ps,st,pad,dil,ceil", [
    ((2, 2), (2, 2), (0, 0), (1, 1), False), ((3, 3), (2, 2), (1, 1), (1, 1), True),
    ((2, 3), (1, 1), (0, 1), (2, 1), False), ((3, 3), (3, 2), (0, 0), (1, 1), True)])
@pytest.mark.parametrize("with_nan", [False, True])
def test_max_pool_fast_paths_match_the_first_max_scan(ps, st, pad, dil, ceil, with_nan):
    a = P.MaxPool2DAttrs(pool_size=ps, strides=st, padding=pad, dilation=dil, ceil_mode=ceil)
    x = np.maximum(np.round(RNG.standard_normal((2, 3, 8, 8))), 0).astype(np.float32)  # many ties
    if with_nan:
        x.flat[RNG.integers(0, x.size, 6)] = np.nan
    y = P._max_pool_numpy(x, a)
    assert np.array_equal(y, P._max_scan(P._slices(np, x, a, -np.inf)[0])[0], equal_nan=True)
    best, k = P._max_scan(P._slices(np, x, a, -np.inf)[0])
    yi, idx = P._with_indices_numpy(x, a)  # offsets by bit masks, positions from a table
    assert np.array_equal(yi, best, equal_nan=True) and idx.dtype == np.int64
    assert np.array_equal(idx, P._flat_index(np, k, a, x.shape[2:], y.shape[2:], x))
    g = _specials(np.float32, y.shape)
    for gg in (g, np.broadcast_to(g[:, :, :1, :1], g.shape)):
        with np.errstate(invalid="ignore"):  # inf + -inf where overlapping windows add up
            got, want = P._max_pool_grad_numpy(gg, x, a), _reference_max_pool_grad(gg, x, a)
        assert got.shape == x.shape and got.dtype == x.dtype
        assert np.array_equal(got, want, equal_nan=True)  # -0.0 == 0.0


@pytest.mark.parametrize("strides,k,pad,dil,groups,out_pad,ci,og", [
    c for c in itertools.product([(1, 1), (2, 2), (2, 1)], [(3, 3), (2, 3)], [(0, 0), (1, 1)], [(1, 1), (2, 1)],
                                 [1, 2], [(0, 0), (1, 0)], [4], [2, 4, 6])
    if c[5][0] < c[0][0] and c[5][1] < c[0][1]])
def test_conv2d_transpose_routes_match_torch(strides, k, pad, dil, groups, out_pad, ci, og):
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, ci, 5, 6))
    w = RNG.standard_normal((ci, og, *k))
    a = C.Conv2DTransposeAttrs(strides=strides, padding=pad, dilation=dil, groups=groups, output_padding=out_pad)
    got = C._conv2d_transpose_numpy(x, w, a)
    want = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), stride=strides, padding=pad,
                                                dilation=dil, groups=groups, output_padding=out_pad).numpy()
    assert got.shape == want.shape and got.dtype == x.dtype and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("target", ["numpy", "torch"])
@pytest.mark.parametrize("shape,order", [((2, 3, 5), "C"), ((2, 3, 5), "T"), ((2, 3, 5), "S"), ((2, 2, 3, 5), "C"),
                                         ((2, 2, 3, 5), "T"), ((2, 2, 3, 5), "S"), ((0, 3, 5), "C"), ((3, 5), "C"), ((5,), "C"),
                                         ((2, 3, 0), "C"), ((2, 3, 0), "T"), ((0, 3, 0), "T")])
def test_dense_gemm_over_rows_in_memory_order(shape, order, target):
    from pullback.ops import get_op

    x = RNG.standard_normal(shape)
    if order == "T":  # a transposed view (sequence-first over batch-first data): one GEMM, a view of the result
        x = np.swapaxes(RNG.standard_normal(shape[1::-1] + shape[2:]), 0, 1)
    elif order == "S":  # rows that do not collapse into one index: the batched matmul
        x = RNG.standard_normal((shape[0], 2 * shape[1]) + shape[2:])[:, ::2]
    w = RNG.standard_normal((4, shape[-1]))
    want = np.einsum("...k,uk->...u", x, w)
    if target == "torch":
        torch = pytest.importorskip("torch")
        got = get_op("nn.dense").impl("torch")(torch.from_numpy(x), torch.from_numpy(w), None).numpy()
    else:
        got = get_op("nn.dense").impl("numpy")(x, w, None)
    assert got.shape == want.shape and got.dtype == x.dtype
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("e", [2.0, 3.0, 2.5, -1.0])
def test_power_by_a_scalar_2_or_3_multiplies(dtype, e):
    from pullback.ops import get_op

    fn = get_op("power").impl("numpy")
    x = _specials(dtype, (3, 7))
    for b in (np.array(e, dtype), np.full((1, 1), e, dtype)):
        got = fn(x, b, None)
        with np.errstate(invalid="ignore", divide="ignore"):
            want = np.power(x, b)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(dtype).eps, atol=0)
        assert np.array_equal(np.signbit(got), np.signbit(want))  # -0.0 ** 3 = -0.0
    assert fn(np.array(2.0, dtype), np.array(e, dtype), None).shape == ()  # a 0-d base: np.power


def test_conv2d_transpose_with_padding_wider_than_the_kernel():
    torch = pytest.importorskip("torch")
    x, w = RNG.standard_normal((1, 2, 7, 7)), RNG.standard_normal((2, 3, 3, 3))
    got = C._conv2d_transpose_numpy(x, w, C.Conv2DTransposeAttrs(padding=(3, 3)))  # crops x
    want = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), padding=3).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_erf_float32_is_within_a_few_ulp_and_float64_is_exact():
    scipy_special = pytest.importorskip("scipy.special")
    x = np.concatenate([np.linspace(-6, 6, 200_001, dtype=np.float32), np.logspace(-30, 0, 1001).astype(np.float32)])
    want = scipy_special.erf(x.astype(np.float64))
    got = erf(x)
    assert got.dtype == np.float32
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-38)) < 5e-7
    assert np.array_equal(erf(np.array([np.nan, np.inf, -np.inf], np.float32)), [np.nan, 1, -1], equal_nan=True)
    assert erf(x.astype(np.float16)).dtype == np.float16
    x64 = x.astype(np.float64)
    assert np.array_equal(erf(x64), scipy_special.erf(x64))


def test_executor_options():
    from pullback import op
    from pullback.ir.expr import Function, var
    from pullback.ir.module import IRModule

    v = var("x", shape=(2, 2), dtype="float32")
    mod = IRModule.from_expr(Function([v], op.nn.dense(v, v)))
    with pytest.raises(ExecutionError, match="blas_threads"):
        Executable(mod, blas_threads=0)
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    for threads in (1, 2, None):
        np.testing.assert_allclose(Executable(mod, blas_threads=threads)["main"](a), a @ a.T)
    np.testing.assert_allclose(Executable(mod, tune_malloc=True)["main"](a), a @ a.T)
    assert isinstance(keep_freed_memory(), bool)


# ------------------------------------------------------------------ fused NumPy kernels on several cache blocks


def _fused_cases():
    """(op name, inputs, attrs) at sizes spanning several blocks (``npfast.BLOCK``) with a partial last one."""
    big = (301, 257)  # 77357 elements: three flat blocks, rows of 257 (127 rows per row block)
    x, g, y = (RNG.standard_normal(big) for _ in range(3))
    gam, bet = RNG.standard_normal(257), RNG.standard_normal(257)
    xb, gb = RNG.standard_normal((6, 5, 41, 67)), RNG.standard_normal((6, 5, 41, 67))
    cb, mb, vb = RNG.standard_normal(5), RNG.standard_normal(5), RNG.uniform(0.5, 1.5, 5)
    sm = np.exp(y) / np.exp(y).sum(-1, keepdims=True)
    return [
        ("nn.gelu", [x * 3], {}), ("nn.gelu", [x * 3], dict(approximate="tanh")),
        ("nn.gelu_grad", [g, x * 3], {}), ("nn.gelu_grad", [g, x * 3], dict(approximate="tanh")),
        ("nn.softmax", [x * 5], {}), ("nn.log_softmax", [x * 5], {}),
        ("nn.softmax_grad", [g, sm], {}), ("nn.log_softmax_grad", [g, np.log(sm)], {}),
        ("nn.threshold_grad", [g, x], dict(threshold=0.25)),
        ("nn.layer_norm", [x, gam, bet], {}), ("nn.layer_norm", [x, gam, bet], dict(scale=False)),
        ("nn.layer_norm_grad", [g, x, gam], {}), ("nn.layer_norm_grad", [g, x, gam], dict(scale=False, center=False)),
        ("nn.batch_norm", [xb, cb, cb, mb, vb], dict(training=True)), ("nn.batch_norm", [xb, cb, cb, mb, vb], {}),
        ("nn.batch_norm", [xb, cb, cb, mb, vb], dict(training=True, center=False, scale=False)),
        ("nn.batch_norm_grad", [gb, xb, cb], {}), ("nn.batch_norm_grad", [gb, xb, cb], dict(scale=False)),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", range(len(_fused_cases())))
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_fused_numpy_kernels_over_several_blocks_match_the_shared_kernel(k, dtype, layout):
    """The NumPy overrides (cache blocks, in-place passes, einsum/BLAS reductions) give the shared kernel's
    result, on C-contiguous inputs and on inputs that are transposed views."""
    from pullback.ops import get_op

    name, inputs, attrs = _fused_cases()[k]
    o = get_op(name)
    a = o.make_attrs(**attrs)
    arrays = [np.asarray(v, dtype) for v in inputs]
    if layout == "transposed":  # same values, Fortran-ordered views
        arrays = [np.asfortranarray(v) if v.ndim > 1 else v for v in arrays]
    keep = [v.copy() for v in arrays]
    got = o.compute(*arrays, a)
    for v, w in zip(arrays, keep):
        np.testing.assert_array_equal(v, w)  # inputs unchanged
    # against the shared kernel in float64 (float32 sums of 80,000 terms differ in their last digits by order)
    want = o.kernel(np, *[np.asarray(v, np.float64) for v in inputs], a)
    for gv, wv in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert gv.dtype == dtype and gv.shape == wv.shape
        scale = float(np.abs(wv).max())
        tol = dict(rtol=1e-4, atol=1e-4 * scale) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11 * scale)
        np.testing.assert_allclose(gv, wv, **tol, err_msg=name)


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("shape,axis", [((5, 0, 0), 1), ((0, 4), 1), ((3, 0), -1), ((0,), 0)])
def test_softmax_and_index_add_of_empty_arrays(target, shape, axis):
    """Empty inputs give empty results (a max over an empty axis has no identity; a reshape with -1 is
    ambiguous when the other dims hold nothing): OpInfo's empty samples."""
    import pullback as pb
    from pullback import op

    if target != "numpy":
        pytest.importorskip(target)
    x = pb.var("x", shape=shape, dtype="float64")
    out = pb.Tuple([op.nn.softmax(x, axis=axis), op.nn.log_softmax(x, axis=axis)])
    exe = pb.build(pb.IRModule.from_expr(pb.Function([x], out)), target=target)
    for r in exe["main"](np.zeros(shape)):
        assert np.asarray(r).shape == shape and np.asarray(r).dtype == np.float64
    d, i, u = pb.var("d", shape=(0, 3, 3)), pb.var("i", shape=(6,), dtype="int64"), pb.var("u", shape=(0, 3, 6))
    exe = pb.build(pb.IRModule.from_expr(pb.Function([d, i, u], op.index_add(d, i, u, axis=2))), target=target)
    got = exe["main"](np.zeros((0, 3, 3), "float32"), np.array([0, 1, 2, 2, 1, 0]), np.zeros((0, 3, 6), "float32"))
    assert np.asarray(got).shape == (0, 3, 3)


@pytest.mark.parametrize("k,pad,dil,stride", [((3, 3), (1, 1, 1, 1), (1, 1), (1, 1)), ((3, 3), (2, 2, 2, 2), (2, 2), (1, 1)),
                                              ((1, 1), (0, 0, 0, 0), (1, 1), (1, 1)), ((3, 3), (1, 1, 1, 1), (1, 1), (2, 2)),
                                              ((3, 2), (1, 0, 1, 1), (1, 1), (1, 1)), ((3, 3), (0, 0, 2, 2), (1, 1), (1, 1))])
@pytest.mark.parametrize("n", [4, 0])
def test_convolutions_of_1x1_maps_are_one_gemm_with_their_tap_on_torch(k, pad, dil, stride, n):
    """A 1x1 map giving a 1x1 result meets one kernel tap: the torch kernels run that GEMM (ResNet's last stage
    on small images) and agree with ATen's convolutions, their data and weight gradients included."""
    torch = pytest.importorskip("torch")
    from pullback.ops import get_op
    from pullback.ops.conv import single_tap

    a = C.Conv2DAttrs(strides=stride, padding=pad, dilation=dil)
    assert single_tap((1, 1), (1, 1), k, a) is not None
    g = torch.Generator().manual_seed(0)
    x, w, gy = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((n, 6, 1, 1), (5, 6, *k), (n, 5, 1, 1)))
    xp = torch.nn.functional.pad(x, (pad[1], pad[3], pad[0], pad[2]))
    want = torch.nn.functional.conv2d(xp, w, None, stride, 0, dil)
    torch.testing.assert_close(get_op("nn.conv2d").impl("torch")(x, w, a), want, rtol=1e-12, atol=1e-12)
    xr = xp.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    torch.nn.functional.conv2d(xr, wr, None, stride, 0, dil).backward(gy)
    gx_want = xr.grad[:, :, pad[0]: pad[0] + 1, pad[1]: pad[1] + 1]
    wa = C.Conv2DBackwardWeightAttrs(kernel_size=k, strides=stride, padding=pad, dilation=dil)
    torch.testing.assert_close(get_op("nn.conv2d_backward_weight").impl("torch")(gy, x, wa), wr.grad, rtol=1e-12, atol=1e-12)
    ta = C.Conv2DTransposeAttrs(strides=stride, padding=pad, dilation=dil)
    torch.testing.assert_close(get_op("nn.conv2d_transpose").impl("torch")(gy, w, ta), gx_want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("hw,k,pad,dil,stride", [((2, 2), (3, 3), (1, 1, 1, 1), (1, 1), (2, 2)),
                                                 ((2, 2), (3, 3), (1, 1, 1, 1), (1, 1), (1, 1)),
                                                 ((4, 4), (3, 3), (1, 1, 1, 1), (1, 1), (2, 2)),
                                                 ((4, 3), (3, 2), (0, 1, 2, 0), (1, 1), (2, 2)),
                                                 ((5, 5), (3, 3), (1, 1, 1, 1), (2, 2), (3, 3)),
                                                 ((2, 2), (1, 1), (0, 0, 0, 0), (1, 1), (2, 2))])
@pytest.mark.parametrize("n,channels_last", [(3, False), (3, True), (0, False)])
def test_convolutions_with_small_outputs_are_im2col_and_one_gemm_on_torch(hw, k, pad, dil, stride, n, channels_last):
    """Where the output plane has at most ``SMALL_PLANE`` positions (a ResNet's last stages on small images,
    where oneDNN's weight gradient is slow), the torch kernels run ATen's im2col and one GEMM; they agree with
    ATen's convolution and its weight gradient (asymmetric padding, dilation, strides, empty batches)."""
    torch = pytest.importorskip("torch")
    from pullback.ops import get_op

    g = torch.Generator().manual_seed(1)
    x, w = torch.randn((n, 6) + hw, generator=g, dtype=torch.float64), torch.randn((5, 6) + k, generator=g, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    xr = torch.nn.functional.pad(x, (pad[1], pad[3], pad[0], pad[2]))
    wr = w.clone().requires_grad_(True)
    want = torch.nn.functional.conv2d(xr, wr, None, stride, 0, dil)
    assert want.shape[2] * want.shape[3] <= C.SMALL_PLANE
    a = C.Conv2DAttrs(strides=stride, padding=pad, dilation=dil)
    torch.testing.assert_close(get_op("nn.conv2d").impl("torch")(x, w, a), want.detach(), rtol=1e-12, atol=1e-12)
    gy = torch.randn(want.shape, generator=g, dtype=torch.float64)
    want.backward(gy)
    wa = C.Conv2DBackwardWeightAttrs(kernel_size=k, strides=stride, padding=pad, dilation=dil)
    got = get_op("nn.conv2d_backward_weight").impl("torch")(gy, x, wa)
    assert got.is_contiguous()
    torch.testing.assert_close(got, wr.grad, rtol=1e-12, atol=1e-12)


def test_a_convolution_keeps_the_channels_last_layout_its_data_arrives_in():
    """The layout a convolution runs in has hysteresis: data arriving channels-last stays so while the weight does
    not outweigh it (DenseNet's 3x3 convolutions after channels-last 1x1 ones: otherwise every layer converts its
    activations to NCHW and its gradients back), NCHW data turns channels-last only where it outweighs the weight
    4x; a 1x1 plane (both layouts at once) takes the NCHW rule; the data weighed is the larger of input and result."""
    torch = pytest.importorskip("torch")
    x = torch.zeros(16, 128, 8, 8)
    last = x.contiguous(memory_format=torch.channels_last)
    w = 32 * 128 * 3 * 3  # between a quarter of the data and all of it
    assert C.conv_layout(last, w) is C.channels_last and C.conv_layout(x, w) is C.nchw
    assert C.conv_layout(last, x.numel() + 1) is C.nchw
    assert C.conv_layout(x, x.numel() // 4) is C.channels_last
    plane = torch.zeros(16, 512, 1, 1).contiguous(memory_format=torch.channels_last)
    assert C.conv_layout(plane, 512 * 512) is C.nchw
    # a channel slice of a channels-last tensor (a concatenation's gradient) has its channels innermost too; the
    # data weighed is the larger side: a 3x3 convolution from 128 channels to 32, its data gradient from 32 to 128
    gy = torch.zeros(16, 256, 8, 8).contiguous(memory_format=torch.channels_last)[:, :32]
    assert not gy.is_contiguous(memory_format=torch.channels_last)
    assert C.conv_layout(gy, w, out_numel=x.numel()) is C.channels_last and C.conv_layout(gy, w) is C.nchw


def _backward_layouts():
    """A ``TorchDispatchMode`` listing, per ``convolution_backward`` called inside it, whether its output gradient
    is channels-last (``.seen``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Layouts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "convolution_backward":
                self.seen.append(args[0].is_contiguous(memory_format=torch.channels_last))
            return func(*args, **(kwargs or {}))

    return Layouts()


@pytest.mark.parametrize("static", [False, True])
def test_a_weight_gradient_runs_in_the_layout_its_data_arrives_in(static):
    """Where the layout rule leaves the choice to the data (it outweighs the weight, but not 4x), a weight gradient
    of channels-last data converts the output gradient to channels-last too (one layout for ATen, as the data's),
    in the generic kernel and in the one prepared for static shapes alike; the result is autograd's."""
    torch = pytest.importorskip("torch")
    from pullback.ops import get_op

    g = torch.Generator().manual_seed(4)
    x = torch.randn((2, 16, 8, 8), generator=g, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    w = torch.randn((16, 16, 2, 2), generator=g, dtype=torch.float64, requires_grad=True)
    gy = torch.randn((2, 16, 7, 7), generator=g, dtype=torch.float64)
    assert C._layout_rule(tuple(x.shape), w.numel(), 1, gy.numel()) is None
    torch.nn.functional.conv2d(x, w).backward(gy)
    wa = C.Conv2DBackwardWeightAttrs(kernel_size=(2, 2))
    kernel = C._backward_weight_prepared(tuple(gy.shape), tuple(x.shape), wa) if static else \
        get_op("nn.conv2d_backward_weight").impl("torch")
    with _backward_layouts() as layouts:
        gw = kernel(gy, x) if static else kernel(gy, x, wa)
    torch.testing.assert_close(gw, w.grad, rtol=1e-12, atol=1e-12)
    assert layouts.seen == [True]


@pytest.mark.parametrize("n,hw,k,pad", [(2, (2, 2), (7, 7), (3, 3, 3, 3)), (1, (4, 4), (3, 3), (0, 1, 1, 0))])
def test_depthwise_convolutions_run_channels_last_on_torch(n, hw, k, pad):
    """A depthwise convolution (groups = channels; ConvNeXt's 7x7, MobileNet's 3x3) runs channels-last on the
    torch target even where its weight outweighs its data (NCHW: 60x slower for a 7x7 on 2x2 planes), its weight
    gradient too, and agrees with autograd of ATen's convolution."""
    torch = pytest.importorskip("torch")
    from pullback.ops import get_op

    g = torch.Generator().manual_seed(3)
    c = 64
    x, w = torch.randn((n, c) + hw, generator=g, dtype=torch.float64), torch.randn((c, 1) + k, generator=g, dtype=torch.float64)
    assert C.conv_layout(x, w.numel(), c) is C.channels_last and C.conv_layout(x, w.numel()) is C.nchw
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    want = torch.nn.functional.conv2d(torch.nn.functional.pad(xr, (pad[1], pad[3], pad[0], pad[2])), wr, None, 1, 0, 1, c)
    gy = torch.randn(want.shape, generator=g, dtype=torch.float64)
    want.backward(gy)
    a = C.Conv2DAttrs(padding=pad, groups=c)
    torch.testing.assert_close(get_op("nn.conv2d").impl("torch")(x, w, a), want.detach(), rtol=1e-12, atol=1e-12)
    wa = C.Conv2DBackwardWeightAttrs(kernel_size=k, padding=pad, groups=c)
    with _backward_layouts() as layouts:
        gw = get_op("nn.conv2d_backward_weight").impl("torch")(gy, x, wa)
    torch.testing.assert_close(gw, wr.grad, rtol=1e-12, atol=1e-12)
    assert layouts.seen == [True]


@pytest.mark.parametrize("channels", [2, 3, 4, 6])
def test_weight_gradient_of_a_narrow_strided_1x1_convolution_on_torch(channels):
    """oneDNN's channels-last weight gradient of a strided 1x1 convolution of 2-7 channels returns wrong values
    on some calls and corrupts the heap with one thread (torch 2.13, AVX2): the torch kernel runs a GEMM there,
    right on every call."""
    torch = pytest.importorskip("torch")
    from pullback.ops import get_op

    g = torch.Generator().manual_seed(2)
    x = torch.randn((4, channels, 16, 16), generator=g).contiguous(memory_format=torch.channels_last)
    gy = torch.randn((4, 8, 8, 8), generator=g).contiguous(memory_format=torch.channels_last)
    a = C.Conv2DBackwardWeightAttrs(kernel_size=(1, 1), strides=(2, 2), padding=(0, 0, 0, 0))
    assert C._onednn_strided_1x1(tuple(x.shape), a)
    want = torch.einsum("nohw,nchw->oc", gy.double(), x.double()[:, :, ::2, ::2]).reshape(8, channels, 1, 1)
    kernel = get_op("nn.conv2d_backward_weight").impl("torch")
    for _ in range(20):
        torch.testing.assert_close(kernel(gy, x, a).double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("g_last,x_last", [(False, True), (True, False), (True, True), (False, False)])
def test_batch_norm_gradient_in_mixed_memory_layouts_on_torch(g_last, x_last):
    """The torch kernel of ``nn.batch_norm_grad`` takes an output gradient and data in any memory layouts (NCHW,
    channels-last, mixed: both go to ATen as NCHW then) and gives autograd's gradients of ``batch_norm``."""
    torch = pytest.importorskip("torch")
    from pullback.ops import get_op
    from pullback.ops.norm import BatchNormGradAttrs

    gen = torch.Generator().manual_seed(0)
    x, g = (torch.randn((4, 6, 5, 5), generator=gen, dtype=torch.float64) for _ in range(2))
    gamma = torch.rand(6, generator=gen, dtype=torch.float64) + 0.5
    layout = (lambda t, last: t.contiguous(memory_format=torch.channels_last) if last else t)
    xr, gr = x.clone().requires_grad_(True), gamma.clone().requires_grad_(True)
    y = torch.nn.functional.batch_norm(xr, None, None, gr, torch.zeros(6, dtype=torch.float64), training=True)
    y.backward(g)
    got = get_op("nn.batch_norm_grad").impl("torch")(layout(g, g_last), layout(x, x_last), gamma, BatchNormGradAttrs())
    for a, b in zip(got, (xr.grad, gr.grad, g.sum((0, 2, 3)))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape, k, kw", [
    ((2, 8, 6, 6), (3, 3), dict(padding=(1, 1, 1, 1))),
    ((2, 8, 7, 7), (3, 3), dict(padding=(0, 1, 1, 0), strides=(2, 2))),
    ((2, 8, 5, 5), (5, 5), dict(padding=(2, 2, 2, 2), groups=8)),
    ((2, 8, 1, 1), (3, 3), dict(padding=(1, 1, 1, 1))),  # one tap: a GEMM
    ((2, 8, 3, 3), (3, 3), dict(padding=(0, 0, 0, 0))),  # a 1x1 output: im2col and a GEMM
    ((2, 8, 2, 2), (7, 7), dict(padding=(3, 3, 3, 3), groups=8)),  # taps reading only padding: a 3x3 window
    ((2, 8, 3, 1), (5, 5), dict(padding=(2, 2, 2, 2), strides=(2, 1))),  # a 5x1 window of a 3x1 plane
    ((2, 8, 2, 2), (3, 3), dict(padding=(1, 0, 1, 2), strides=(2, 2))),  # asymmetric padding, a 1x1 output
])
def test_convolutions_of_static_shapes_get_prepared_torch_kernels(shape, k, kw):
    """On the torch target a convolution of static shapes (and its bias, data and weight gradients) runs a kernel
    prepared at build, its path, layout rule and padding decided once; each equals the op's generic torch kernel
    and the numpy target."""
    torch = pytest.importorskip("torch")
    import pullback as pb
    from pullback.runtime.torch_kernels import fast_kernel

    c = shape[1]
    o = c if kw.get("groups", 1) > 1 else 4
    x, w, b = pb.var("x", shape=shape), pb.var("w", shape=(o, c // kw.get("groups", 1)) + k), pb.var("b", shape=(o,))
    y = pb.op.nn.conv2d(x, w, **kw)
    gy = pb.var("gy", shape=y.checked_type.shape)
    calls = [y, pb.op.nn.conv2d_bias(x, w, b, **kw), pb.op.nn.conv2d_transpose(gy, w, **kw),
             pb.op.nn.conv2d_backward_weight(gy, x, kernel_size=k, **kw)]
    rng = np.random.default_rng(0)
    values = {v: rng.standard_normal(v.type_annotation.shape).astype("float64") for v in (x, w, b, gy)}
    for call in calls:
        if call.op.name == "nn.conv2d_transpose":
            call = pb.op.nn.conv2d_transpose(gy, w, output_padding=tuple(
                s - n for s, n in zip(shape[2:], call.checked_type.shape[2:])), **kw)
        args = [torch.from_numpy(values[a]) for a in call.args]
        call.checked_type  # noqa: B018 (typed: as in a built plan)
        prepared = fast_kernel(call)
        assert prepared is not None, call.op.name
        want = call.op.impl("torch")(*args, call.attrs)
        torch.testing.assert_close(prepared(*args, call.attrs), want, rtol=0, atol=0)
        np.testing.assert_allclose(want.numpy(), call.op.impl("numpy")(*[values[a] for a in call.args], call.attrs),
                                   rtol=1e-10, atol=1e-10)
    dynamic = pb.op.nn.conv2d(pb.var("x", shape=(pb.Any,) + shape[1:]), w, **kw)
    dynamic.checked_type  # noqa: B018
    assert fast_kernel(dynamic) is None


def test_taps_that_read_only_padding_are_not_computed():
    """ConvNeXt's 7x7 depthwise convolution of padding 3 on a 2x2 map meets the data through its centre 3x3 taps
    alone: on the torch target it runs as that 3x3 convolution of padding 1 (forward, data gradient, weight
    gradient zero off the window), with autograd's values (float64)."""
    torch = pytest.importorskip("torch")
    import pullback as pb
    from torch.utils._python_dispatch import TorchDispatchMode

    class Weights(TorchDispatchMode, list):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("convolution", "convolution_backward"):
                self.append(tuple(args[2 if func.overloadpacket.__name__ == "convolution_backward" else 1].shape))
            return func(*args, **(kwargs or {}))

    kw = dict(padding=(3, 3, 3, 3), groups=16)
    x, w, gy = (pb.var(n, shape=s, dtype="float64") for n, s in (("x", (4, 16, 2, 2)), ("w", (16, 1, 7, 7)), ("gy", (4, 16, 2, 2))))
    calls = [pb.op.nn.conv2d(x, w, **kw), pb.op.nn.conv2d_transpose(gy, w, **kw),
             pb.op.nn.conv2d_backward_weight(gy, x, kernel_size=(7, 7), **kw)]
    gen = torch.Generator().manual_seed(0)
    xs, ws, gys = (torch.randn(v.type_annotation.shape, generator=gen, dtype=torch.float64) for v in (x, w, gy))
    xr, wr = xs.clone().requires_grad_(True), ws.clone().requires_grad_(True)
    y = torch.nn.functional.conv2d(xr, wr, None, 1, 3, 1, 16)
    y.backward(gys)
    for call, want in zip(calls, (y.detach(), xr.grad, wr.grad)):
        fn = pb.build(pb.Function(list(call.args), call), target="torch")["main"]
        with Weights() as seen:
            got = fn(*[{x: xs, w: ws, gy: gys}[a] for a in call.args])
        assert seen and all(s[2:] == (3, 3) for s in seen), (call.op.name, seen)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not wr.grad[:, :, [0, 1, 5, 6]].any() and not wr.grad[:, :, :, [0, 1, 5, 6]].any()
