"""The torch target: every operator's ``op.impl("torch")`` run on tensors equals the numpy target.

The operator table runs as one program per op test module (``op_table``), every result compared
with the numpy target's.
"""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from op_table import table_programs
from pullback import Call, Function, op, var
from pullback.ops.registry import OpDef
from xp_ops import mul, neg

torch = pytest.importorskip("torch")



def to_numpy(value):
    return pb.runtime.values.to_output(value, lambda t: t.detach().cpu().numpy())


def assert_same(want, got):
    wl, gl = pb.runtime.values.leaves(want), pb.runtime.values.leaves(to_numpy(got))
    assert len(wl) == len(gl)
    for k, (w, g) in enumerate(zip(wl, gl)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


@pytest.mark.parametrize("mod, inputs", [pytest.param(m, i, id=name) for name, m, i in table_programs("torch")])
def test_op_table_matches_numpy(mod, inputs):
    got = pb.build(mod, target="torch", check_outputs=True)["main"](*inputs)
    for leaf in pb.runtime.values.leaves(got):
        assert isinstance(leaf, torch.Tensor), type(leaf)
    assert_same(pb.build(mod)["main"](*inputs), got)


def _strided(t):
    """``t``'s values in every other element of a buffer twice as long on the last axis (last stride 2)."""
    if t.ndim == 0:
        return t
    big = t.new_zeros(t.shape[:-1] + (2 * t.shape[-1],))
    big[..., ::2] = t
    return big[..., ::2]


def _transposed(t):
    """``t``'s values in column-major memory (its last two axes' strides swapped)."""
    return t.mT.contiguous().mT if t.ndim >= 2 else t


@pytest.mark.parametrize("layout", [_strided, _transposed], ids=["strided", "transposed"])
@pytest.mark.parametrize("mod, inputs", [pytest.param(m, i, id=name) for name, m, i in table_programs("torch")])
def test_op_table_on_tensors_of_any_strides(mod, inputs, layout):
    """Every operator on input tensors whose last axis is not contiguous gives the contiguous inputs' result (to
    a summation order's rounding). ATen's CPU flash attention kernels read rows as contiguous memory whatever
    the strides (attention outputs and gradients were garbage, up to 1e38), as its layer norm backward reads
    the saved statistics."""
    plain = [torch.from_numpy(np.array(x, copy=True)) for x in inputs]
    run = pb.build(mod, target="torch")["main"]
    want, got = to_numpy(run(*plain)), to_numpy(run(*[layout(t) for t in plain]))
    for k, (w, g) in enumerate(zip(pb.runtime.values.leaves(want), pb.runtime.values.leaves(got), strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


def test_an_operator_without_a_torch_kernel_is_refused_at_build():
    numpy_only = OpDef("numpy_only", 1, lambda ts, attrs: ts[0], compute=lambda x, attrs=None: -x)
    x = var("x", shape=(2,))
    with pytest.raises(pb.ExecutionError, match=r"^target 'torch': no kernel for numpy_only$"):
        pb.build(Function([x], Call(numpy_only, [x])), target="torch")


def test_tensors_in_and_out_without_copies():
    x = var("x", shape=(2, 3))
    exe = pb.build(Function([x], mul(x, x)), target="torch", device="cpu")
    assert exe.device == torch.device("cpu")
    t = torch.arange(6.0).reshape(2, 3)
    out = exe["main"](t)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, t * t)
    a = np.arange(6, dtype="float32").reshape(2, 3)
    ident = pb.build(Function([x], x), target="torch")["main"]
    assert np.shares_memory(ident(a).numpy(), a)  # a writable NumPy input is used in place
    ro = a.copy()
    ro.flags.writeable = False
    assert not np.shares_memory(ident(ro).numpy(), ro)  # a read-only one is copied: tensors are writable


def test_results_come_back_as_nested_tuples_of_the_kernels_tensors():
    """The torch target returns its tensors as they are: a tuple holding no list is returned itself, and a list
    anywhere inside (a kernel's several results) becomes a tuple, as on the other targets."""
    from pullback.runtime.values import as_is, to_output

    t = torch.ones(2)
    flat = (t, (t, (t,)), t)
    assert to_output(flat, as_is) is flat
    assert to_output(t, as_is) is t
    nested = to_output((t, (t, [t, (t, [t])])), as_is)
    assert nested == (t, (t, (t, (t, (t,)))))
    assert to_output([t, [t]], as_is) == (t, (t,))
    x = var("x", shape=(2, 3))
    parts = pb.build(Function([x], pb.Tuple([op.split(x, 3, axis=1), x])), target="torch")["main"](torch.randn(2, 3))
    assert type(parts) is tuple and type(parts[0]) is tuple and len(parts[0]) == 3


def test_bad_device_is_a_pullback_error():
    x = var("x", shape=(2,))
    with pytest.raises(pb.ExecutionError, match="target 'torch': cannot use device 'nonsense'"):
        pb.build(Function([x], neg(x)), target="torch", device="nonsense")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_device():  # pragma: no cover - no GPU on the test machines
    x = var("x", shape=(2,))
    out = pb.build(Function([x], neg(x)), target="torch", device="cuda")["main"](np.ones(2, "float32"))
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), -torch.ones(2))


@pytest.mark.parametrize("k", [pb.const(2.0), pb.const(np.full((1, 1), 2.0, "float32")), pb.const(3.0), pb.const(0.5),
                               pb.const(-1.0), pb.const(-2.0), pb.const(1.7),
                               pb.const(np.float32(2.0) + np.zeros((3,), "float32"))])
def test_power_by_a_constant_scalar_gives_the_numpy_result(k):
    """``x ** k`` with a constant scalar ``k`` runs as ``torch.pow(x, float)`` (ATen's fast paths for 2, 3, +-0.5,
    -1, -2; pow by a 0-d tensor is its generic kernel) with the numpy target's result, broadcasting included."""
    x = var("x", shape=(2, 3))
    fn = Function([x], pb.op.power(x, k))
    xs = np.array([[-1.5, 0.0, np.inf], [np.nan, -0.0, 3.0]], "float32")
    want = pb.build(fn)["main"](xs)
    got = pb.build(fn, target="torch")["main"](xs)
    assert tuple(got.shape) == want.shape and got.numpy().dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, equal_nan=True)




@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bounds", [(0.0, 6.0), (-0.5, -0.5), (0.0, np.inf), (-np.inf, 1.0), (-np.inf, np.inf)])
@pytest.mark.parametrize("nan", [False, True])
def test_clip_gradient_keeps_the_closed_interval_like_numpy(dtype, bounds, nan):
    """``nn.clip_grad`` on the torch target (ATen's ``hardtanh_backward`` on bounds widened by one ulp, else the
    comparisons) equals the numpy target's bit for bit: the gradient kept at the bounds and at infinities inside
    them, zero where the data is NaN or outside."""
    lo, hi = bounds
    x, g = var("x", shape=(4, 5), dtype=dtype), var("g", shape=(4, 5), dtype=dtype)
    fn = Function([g, x], pb.op.nn.clip_grad(g, x, lo, hi))
    t = np.dtype(dtype).type
    xs = np.concatenate([np.array([lo, hi, -np.inf, np.inf, 0.0, 6.0, -0.5, 1.0, np.nextafter(t(hi), t(np.inf)),
                                   np.nextafter(t(lo), t(-np.inf))], dtype), np.linspace(-7, 7, 10).astype(dtype)])
    if nan:
        xs[4] = np.nan
    xs = xs.reshape(4, 5)
    gs = np.arange(1, 21, dtype=dtype).reshape(4, 5)
    want = pb.build(fn)["main"](gs, xs)
    np.testing.assert_array_equal(want, np.where((xs >= t(lo)) & (xs <= t(hi)), gs, 0))
    got = pb.build(fn, target="torch")["main"](gs, xs)
    assert got.numpy().dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want)


def test_relu6_gradient_is_one_hardtanh_backward(monkeypatch):
    """``clip``'s gradient is one ``nn.clip_grad`` call, one ATen ``hardtanh_backward`` on the torch target."""
    import torch

    calls = []
    real = torch.ops.aten.hardtanh_backward
    monkeypatch.setattr(torch.ops.aten, "hardtanh_backward", lambda *a: calls.append(1) or real(*a))
    x = var("x", shape=(3, 4))
    mod = pb.transform.FirstOrderGradient()(pb.IRModule.from_expr(Function([x], pb.op.sum(pb.op.clip(x, 0.0, 6.0)))))
    grad_ops = {n.op.name for n in pb.ir.traversal.post_order(mod["main_grad"].body) if isinstance(n, Call)}
    assert "nn.clip_grad" in grad_ops and not grad_ops & {"logical_and", "greater_equal", "where"}
    xs = np.array([[-1.0, 0.0, 3.0, 6.0], [7.0, 2.0, -0.0, 5.5], [6.5, 0.5, 1.0, 8.0]], "float32")
    _, (gx,) = pb.build(mod, target="torch")["main_grad"](xs)
    np.testing.assert_array_equal(gx.numpy(), ((xs >= 0) & (xs <= 6)).astype("float32"))
    assert calls == [1]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_and_its_gradient_are_eagers_bits(reduction):
    """On (N, C) log-probabilities ``nn.nll_loss`` and its gradient are ATen's own kernels: eager's sums, bit for bit
    (weights, an ignored target)."""
    torch.manual_seed(0)
    lp = torch.randn(64, 10, dtype=torch.float32).log_softmax(1)
    t = torch.randint(0, 10, (64,))
    t[3] = -100
    w = torch.rand(10)
    p, tv, wv = var("p", shape=(64, 10)), var("t", shape=(64,), dtype="int64"), var("w", shape=(10,))
    mod = pb.transform.FirstOrderGradient(wrt=["p"])(pb.IRModule.from_expr(
        Function([p, tv, wv], pb.op.sum(pb.op.nn.nll_loss(p, tv, wv, reduction)))))
    loss, (gp,) = pb.build(mod, target="torch")["main_grad"](lp, t, w)
    x = lp.clone().requires_grad_(True)
    want = torch.nn.functional.nll_loss(x, t, w, reduction=reduction).sum()
    want.backward()
    assert torch.equal(loss, want.detach()) and torch.equal(gp, x.grad)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "maximum", "minimum", "divide"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8"])
def test_integer_arithmetic_takes_atens_kernel_and_wraps_as_numpy(name, dtype):
    """Same-dtype integer add, subtract, multiply, maximum and minimum call ATen directly (batch norm's
    ``num_batches_tracked + 1``: 7 -> 1 us), wrapping on overflow as NumPy does; division keeps the shared kernel."""
    from pullback.runtime.torch_kernels import fast_kernel

    info = np.iinfo(dtype)
    a = np.array([info.max, info.min, 7, 0, 3], dtype)
    b = np.array([1, 1, 3, 5, 2], dtype) if name == "divide" else np.array([1, 255 if dtype == "uint8" else -1, 3, 0, 2], dtype)
    x, y = var("x", shape=(5,), dtype=dtype), var("y", shape=(5,), dtype=dtype)
    body = getattr(op, name)(x, y)
    mod = pb.IRModule.from_expr(Function([x, y], body))
    pb.analysis.infer_module(mod)
    assert (fast_kernel(mod["main"].body) is None) == (name == "divide")
    with np.errstate(over="ignore"):
        want = pb.build(mod)["main"](a, b)
    got = pb.build(mod, target="torch")["main"](a, b)
    np.testing.assert_array_equal(to_numpy(got), want)


@pytest.mark.parametrize("fast", [True, False])
def test_rsqrt_is_eagers_bits(fast):
    """``rsqrt`` is ``torch.rsqrt`` (``1 / sqrt`` rounds otherwise on ~14% of float32 elements: every RMSNorm
    drifted from eager by 1e-7), in a fused elementwise chain or alone."""
    torch.manual_seed(0)
    y = torch.rand(4096) + 1e-3
    x = var("x", shape=(4096,))
    mod = pb.IRModule.from_expr(Function([x], op.multiply(op.rsqrt(op.add(x, pb.const(1e-6))), x)))
    from pullback.runtime.torch_target import TorchExecutable

    got = TorchExecutable(mod, fast=fast)["main"](y)
    assert torch.equal(got, torch.rsqrt(y + 1e-6) * y)


@pytest.mark.parametrize("name, aten", [("nn.threshold_grad", "threshold_backward"), ("nn.silu_grad", "silu_backward"),
                                        ("nn.gelu_grad", "gelu_backward"), ("tanh_grad", "tanh_backward"),
                                        ("sigmoid_grad", "sigmoid_backward"), ("nn.softplus_grad", "softplus_backward"),
                                        ("nn.mish_grad", "mish_backward")])
@pytest.mark.parametrize("data_last", [True, False])
def test_elementwise_gradients_of_mixed_layouts_follow_the_data(name, aten, data_last, monkeypatch):
    """A gradient in one memory format meeting data in the other (a convolution's input gradient and a saved
    activation): ATen's kernel gets the gradient converted to the data's layout (on mixed layouts it takes 3-20x
    longer); the values are the numpy target's."""
    from pullback.ops.registry import get_op

    torch.manual_seed(0)
    last, first = torch.channels_last, torch.contiguous_format
    fmt = last if data_last else first
    x = torch.randn(4, 6, 5, 5).contiguous(memory_format=fmt)
    g = torch.randn(4, 6, 5, 5).contiguous(memory_format=first if data_last else last)
    seen, real = [], getattr(torch.ops.aten, aten)
    monkeypatch.setattr(torch.ops.aten, aten, lambda *a, **k: seen.append(a[0].is_contiguous(memory_format=fmt)) or real(*a, **k))
    op = get_op(name)
    attrs = op.attrs_type() if op.attrs_type is not None else None
    got = op.impl("torch")(g, x, attrs)
    assert seen == [True]
    np.testing.assert_allclose(got.numpy(), op.impl("numpy")(g.numpy(), x.numpy(), attrs), rtol=1e-6, atol=1e-6)


def aten_calls():
    """A ``TorchDispatchMode`` listing the ATen operators called inside it (``.names``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    return Calls()


def test_a_small_linear_of_rows_is_one_addmm():
    """A small layer's ``nn.linear`` on a matrix is one ATen call (the GEMM adds the bias: ``addmm``), not a GEMM and
    an in-place add; its result is the numpy target's."""
    x, w, b = var("x", shape=(8, 16)), var("w", shape=(32, 16)), var("b", shape=(32,))
    f = Function([x, w, b], pb.op.nn.linear(x, w, b))
    rng = np.random.default_rng(0)
    xs, ws, bs = (rng.standard_normal(s).astype("float32") for s in ((8, 16), (32, 16), (32,)))
    fn = pb.build(f, target="torch")["main"]
    args = [torch.from_numpy(a) for a in (xs, ws, bs)]
    fn(*args)
    with aten_calls() as calls:
        got = fn(*args)
    assert [n for n in calls.names if n not in ("detach", "t", "transpose")] == ["addmm"], calls.names
    np.testing.assert_allclose(got.numpy(), pb.build(f)["main"](xs, ws, bs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batches", [(6, 6), (1, 6), (6, 1)])
def test_a_batched_product_of_equal_batches_is_one_bmm(ta, tb, batches):
    """``nn.batch_matmul`` of two equal batches (attention's products) is ATen's ``bmm`` alone, not ``matmul``'s
    expands and reshapes around it (five calls more); a batch broadcast from 1 keeps ``matmul`` (no ``bmm`` takes
    it). Every case gives
    the float64 product's values."""
    rng = np.random.default_rng(1)
    sa, sb = (batches[0], 5, 7) if ta else (batches[0], 7, 5), (batches[1], 3, 5) if tb else (batches[1], 5, 3)
    a64, b64 = rng.standard_normal(sa), rng.standard_normal(sb)
    a, b = var("a", shape=sa), var("b", shape=sb)
    fn = pb.build(Function([a, b], pb.op.nn.batch_matmul(a, b, ta, tb)), target="torch")["main"]
    args = [torch.from_numpy(x.astype("float32")) for x in (a64, b64)]
    with aten_calls() as calls:
        got = fn(*args)
    if batches[0] == batches[1]:
        assert [n for n in calls.names if n not in ("detach", "transpose")] == ["bmm"], calls.names
    want = (a64.swapaxes(1, 2) if ta else a64) @ (b64.swapaxes(1, 2) if tb else b64)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "bool"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_index_add_with_repeated_positions_equals_numpy(dtype, axis, monkeypatch):
    """``index_add`` on the torch target (ATen's ``index_add`` along one axis where the dtypes allow, else
    ``index_put`` with accumulation) adds every update of a repeated position, as the numpy target does."""
    import torch

    calls = []
    real = torch.Tensor.index_add
    monkeypatch.setattr(torch.Tensor, "index_add", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(5)
    xs = (rng.standard_normal((3, 4, 5)) * 3).astype(dtype)
    idx = np.array([1, 0, 1, 1, 2, -1], "int64")
    ax = -1 if axis is None else axis
    ushape = (6,) if axis is None else xs.shape[:ax % 3] + (6,) + xs.shape[ax % 3 + 1:]
    us = (rng.standard_normal(ushape) * 3).astype(dtype)
    x, i, u = var("x", shape=xs.shape, dtype=dtype), var("i", shape=(6,), dtype="int64"), var("u", shape=ushape, dtype=dtype)
    fn = Function([x, i, u], pb.op.index_add(x, i, u, axis, "wrap"))
    want = pb.build(fn)["main"](xs, idx, us)
    got = pb.build(fn, target="torch")["main"](xs, idx, us)
    np.testing.assert_array_equal(got.numpy(), want)
    assert len(calls) == (dtype != "bool")


@pytest.fixture
def any_weight(monkeypatch):
    """oneDNN's size thresholds lowered to every weight and result (the layout tests use small ones)."""
    from pullback.ops import onednn

    monkeypatch.setattr(onednn, "MIN_MACS", 1)
    monkeypatch.setattr(onednn, "MIN_WEIGHT", 1)
    monkeypatch.setattr(onednn, "MIN_STRIDED_OUT", 1)


@pytest.mark.parametrize("x_shape, w_shape, x_t, w_t, dtype", [
    ((6, 5), (4, 5), False, False, "float32"),   # row-major rows: oneDNN
    ((2, 3, 5), (4, 5), False, False, "float32"),  # 3-D rows: oneDNN
    ((5, 6), (4, 5), True, False, "float32"),    # a weight gradient's transposed rows: oneDNN, as they are
    ((2, 5, 3), (4, 5), True, False, "float32"),  # N-D rows that are not contiguous: MKL
    ((6, 5), (5, 4), False, True, "float32"),    # a transposed weight (an input gradient's W.T): oneDNN
    ((0, 5), (4, 5), False, False, "float32"),   # no rows: no work for oneDNN
    ((6, 0), (4, 0), False, False, "float32"),   # K = 0: never oneDNN (it has no such primitive)
    ((6, 5), (4, 5), False, False, "float64"),   # oneDNN has no float64 inner product
])
def test_dense_on_every_layout_equals_numpy_and_row_major_float32_runs_onednn(onednn_calls, any_weight, x_shape,
                                                                           w_shape, x_t, w_t, dtype):
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    x_val = torch.from_numpy(xs).transpose(-1, -2) if x_t else torch.from_numpy(xs)
    w_val = torch.from_numpy(ws).t() if w_t else torch.from_numpy(ws)
    x, w = var("x", shape=tuple(x_val.shape), dtype=dtype), var("w", shape=tuple(w_val.shape), dtype=dtype)
    fn = Function([x, w], pb.op.nn.dense(x, w))
    got = pb.build(fn, target="torch")["main"](x_val, w_val)
    want = pb.build(fn)["main"](x_val.numpy(), w_val.numpy())
    assert tuple(got.shape) == want.shape and got.numpy().dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    assert len(onednn_calls) == (dtype == "float32" and 0 not in x_shape and not (x_t and len(x_shape) > 2))


@pytest.mark.parametrize("ta, tb", [(False, False), (False, True), (True, False), (True, True)])
def test_matmul_of_rows_runs_onednn_with_the_numpy_result(onednn_calls, any_weight, ta, tb):
    """2-D ``nn.matmul`` (GPT-2's Conv1D, every input gradient, and with a transposed left operand its weight
    gradients) runs oneDNN's inner product."""
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((5, 6) if ta else (6, 5)).astype("float32")
    ys = rng.standard_normal((4, 5) if tb else (5, 4)).astype("float32")
    x, y = var("x", shape=xs.shape), var("y", shape=ys.shape)
    fn = Function([x, y], pb.op.nn.matmul(x, y, transpose_a=ta, transpose_b=tb))
    got = pb.build(fn, target="torch")["main"](xs, ys)
    np.testing.assert_allclose(got.numpy(), pb.build(fn)["main"](xs, ys), rtol=1e-5, atol=1e-5)
    assert len(onednn_calls) == 1



def test_small_weight_gradients_stay_with_mkl(onednn_calls):
    """A weight gradient (``dY.T @ X``: transposed rows) goes to oneDNN only for a result of 128 x 128 elements
    or more: on smaller ones its reordering costs more than its GEMM gains."""
    rng = np.random.default_rng(3)
    for units, k, used in [(32, 64, False), (64, 255, False), (128, 128, True), (64, 256, True)]:
        g, x = var("g", shape=(1024, units)), var("x", shape=(1024, k))
        gs, xs = rng.standard_normal((1024, units)).astype("float32"), rng.standard_normal((1024, k)).astype("float32")
        fn = Function([g, x], pb.op.nn.matmul(g, x, transpose_a=True))
        onednn_calls.clear()
        got = pb.build(fn, target="torch")["main"](gs, xs)
        assert len(onednn_calls) == used, (units, k)
        np.testing.assert_allclose(got.numpy(), gs.T.astype("float64") @ xs, rtol=1e-4, atol=1e-3)


def test_small_gemms_stay_with_mkl(onednn_calls):
    """oneDNN's per-call cost doubles a classifier's tiny GEMM, and with the weight cold in the caches (as a training
    step meets it) it is slower than MKL up to ~2^23 multiply-adds (``ops.onednn``): only GEMMs of 2^24 or more go
    there, whatever their shape (many rows of a small weight too)."""
    for m, n, k, used in [(32, 10, 512, False), (4, 256, 256, False), (32, 256, 256, False), (128, 512, 128, False),
                          (256, 256, 255, False), (256, 256, 256, True), (65536, 16, 16, True), (65535, 16, 16, False)]:
        x, w = var("x", shape=(m, k)), var("w", shape=(n, k))
        onednn_calls.clear()
        got = pb.build(Function([x, w], pb.op.nn.dense(x, w)), target="torch")["main"](np.ones((m, k), "float32"),
                                                                                       np.ones((n, k), "float32"))
        assert len(onednn_calls) == used, (m, n, k)
        np.testing.assert_array_equal(got.numpy(), np.full((m, n), k, "float32"))


@pytest.mark.parametrize("vendor, mkl, want", [("GenuineIntel", True, False), ("AuthenticAMD", True, True),
                                               ("GenuineIntel", False, True), ("", True, True)])
def test_float32_gemms_go_to_onednn_only_where_mkl_is_not_tuned(vendor, mkl, want):
    """MKL is eager's float32 GEMM and at its best on Intel CPUs (oneDNN there: no faster on contiguous rows,
    1.3-1.8x slower on a weight gradient's strided ones); elsewhere oneDNN is about twice as fast."""
    from pullback.ops import onednn

    assert onednn.prefers_onednn(vendor, mkl) is want


def test_an_intel_cpu_keeps_float32_gemms_with_mkl(monkeypatch):
    """Decided once per process from the vendor: on a GenuineIntel CPU with torch's MKL, a large float32 GEMM
    never reaches oneDNN (bfloat16 still does: there it is eager's own kernel)."""
    pytest.importorskip("torch")
    from pullback.ops import onednn

    if onednn.linear() is None:
        pytest.skip("this torch has no oneDNN")
    calls = []
    real = onednn.linear()
    monkeypatch.setattr(onednn, "linear", lambda: lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(onednn, "cpu_vendor", lambda: "GenuineIntel")
    import torch

    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    onednn._float32_preferred.cache_clear()
    try:
        x, w = var("x", shape=(512, 256)), var("w", shape=(256, 256))
        xs, ws = np.ones((512, 256), "float32"), np.ones((256, 256), "float32")
        got = pb.build(Function([x, w], pb.op.nn.dense(x, w)), target="torch")["main"](xs, ws)
        np.testing.assert_array_equal(got.numpy(), np.full((512, 256), 256, "float32"))
        assert calls == []
        monkeypatch.setattr(onednn, "cpu_vendor", lambda: "AuthenticAMD")
        onednn._float32_preferred.cache_clear()
        pb.build(Function([x, w], pb.op.nn.dense(x, w)), target="torch")["main"](xs, ws)
        assert calls == [1]
    finally:
        onednn._float32_preferred.cache_clear()


@pytest.mark.parametrize("x_t", [False, True], ids=["rows", "transposed-rows"])
@pytest.mark.parametrize("shape", [(8, 16, 32), (64, 32)])
def test_bfloat16_linear_of_rows_is_eagers_f_linear(onednn_calls, shape, x_t):
    """A bfloat16 ``nn.linear`` / ``nn.dense`` + bias of contiguous rows runs oneDNN's bfloat16 inner product (on a
    CPU with native bfloat16: what eager's ``F.linear`` / ``addmm`` run), so its result is eager's bit for bit, the
    bias added before the one rounding (a GEMM, then an add, rounds twice); rows of other strides (a weight
    gradient's) stay with ``torch.mm``, 1.6-2.5x faster there."""
    from pullback.ops import onednn

    if onednn.bfloat16_linear() is None:
        pytest.skip("this CPU has no native bfloat16 inner product in oneDNN")
    torch.manual_seed(0)
    xs = torch.randn(shape[::-1] if x_t else shape).to(torch.bfloat16)
    xs = xs.transpose(0, -1) if x_t else xs
    ws, bs = torch.randn(24, shape[-1]).to(torch.bfloat16), torch.randn(24).to(torch.bfloat16)
    x, w, b = (var(n, shape=tuple(t.shape), dtype="bfloat16") for n, t in (("x", xs), ("w", ws), ("b", bs)))
    want = torch.nn.functional.linear(xs.contiguous(), ws, bs)
    for body in (pb.op.nn.linear(x, w, b), pb.op.add(pb.op.nn.dense(x, w), b)):
        onednn_calls.clear()
        got = pb.build(Function([x, w, b], body), target="torch")["main"](xs, ws, bs)
        assert len(onednn_calls) == (not x_t)
        if not x_t:
            assert torch.equal(got, want)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_an_autocast_region_does_not_change_the_programs_dtypes():
    """Inside ``torch.autocast`` (bfloat16) a float32 program still computes in float32: its matmul is not cast
    down, its result is the one computed outside the region."""
    from pullback import op

    x, w = var("x", shape=(4, 8)), var("w", shape=(3, 8))
    exe = pb.build(pb.IRModule.from_expr(Function([x, w], op.nn.relu(op.nn.dense(x, w)))), target="torch")
    a, b = torch.randn(4, 8), torch.randn(3, 8)
    want = exe["main"](a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.functional.linear(a, b).dtype == torch.bfloat16  # what autocast does to ATen's linear
        got = exe["main"](a, b)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_constant_result_is_a_fresh_tensor_each_call():
    """Torch tensors cannot be read-only: a result that is a constant of the program (alone, in a tuple, or an If
    branch's) comes back as a copy, so a caller writing into it in place (``acc.index_add_``) leaves the next
    call's result alone; a computed result is not copied."""
    x, c = var("x", shape=(2,)), var("c", shape=(), dtype="bool")
    zeros = pb.const(np.zeros(2, "float32"))
    body = pb.Tuple([pb.op.negative(x), zeros, pb.If(c, pb.const(np.ones(2, "float32")), x)])
    f = pb.build(pb.IRModule.from_expr(Function([x, c], body)), target="torch")["main"]
    xs = torch.tensor([1.0, 2.0])
    for _ in range(2):
        neg, z, branch = f(xs, torch.tensor(True))
        torch.testing.assert_close(z, torch.zeros(2))
        torch.testing.assert_close(branch, torch.ones(2))
        z.add_(5.0)
        branch.mul_(3.0)
    _, _, same = f(xs, torch.tensor(False))
    assert same.data_ptr() == xs.data_ptr()  # an input passed through stays itself


@pytest.mark.parametrize("shape", [(2, 160, 2, 2), (3, 5, 7, 4), (1, 8, 1, 9)])
def test_a_pointwise_transposed_convolution_is_one_gemm_with_atens_values(shape):
    """A 1x1 stride-1 transposed convolution (a pointwise convolution's data gradient) runs as one GEMM over the
    positions, not ATen's slow_conv_transpose2d; its values are ATen's."""
    from pullback import op

    n, c, h, w = shape
    x, k = var("x", shape=shape, dtype="float64"), var("k", shape=(c, 6, 1, 1), dtype="float64")
    mod = pb.IRModule.from_expr(Function([x, k], op.nn.conv2d_transpose(x, k, kernel_size=(1, 1))))
    a, b = torch.randn(shape, dtype=torch.float64), torch.randn(c, 6, 1, 1, dtype=torch.float64)
    with torch.autograd.profiler.profile() as prof:
        got = pb.build(mod, target="torch")["main"](a, b)
    assert not [e for e in prof.function_events if "slow_conv_transpose2d" in e.name]
    torch.testing.assert_close(got, torch.nn.functional.conv_transpose2d(a, b), rtol=1e-12, atol=1e-12)


def test_a_slice_is_a_view_of_its_operand():
    """``strided_slice`` with positive steps is a view on the torch target, as eager's slicing, ``unbind`` and
    ``chunk`` are (a ViT's q, k, v: three copies of the projection a block otherwise)."""
    torch = pytest.importorskip("torch")
    x = var("x", shape=(3, 4, 5))
    fn = Function([x], pb.op.strided_slice(x, begin=(1,), end=(3,), axes=(1,)))
    xs = torch.randn(3, 4, 5)
    got = pb.build(fn, target="torch")["main"](xs)
    assert got.untyped_storage().data_ptr() == xs.untyped_storage().data_ptr()
    assert torch.equal(got, xs[:, 1:3])


@pytest.mark.parametrize("shape, begin, end, view", [
    ((512, 64, 3, 3), (0, 0, 1, 1), (512, 64, 2, 2), False),  # a 3x3 weight's centre tap: every ninth element
    ((4, 6, 8), (0, 0, 2), (4, 6, 3), False),  # a column: every eighth
    ((4, 6, 8), (0, 2, 0), (4, 3, 8), True),  # a row of each matrix: dense
    ((4, 6, 8), (1, 0, 2), (3, 6, 6), True),  # part of each row, rows apart: dense rows
    ((4, 1, 8), (0, 0, 0), (4, 1, 8), True),
])
def test_a_slice_is_a_view_only_when_its_rows_stay_dense(shape, begin, end, view):
    """A slice whose innermost axis is not at unit stride is copied once (the op's kernel): a GEMM on such a view
    copies it element by element first, at every use (a ResNet's last stage on 32x32 images: the 3x3 weights'
    centre taps read by six GEMMs a step, 0.78 ms each against 0.08)."""
    torch = pytest.importorskip("torch")
    x = var("x", shape=shape)
    fn = Function([x], pb.op.strided_slice(x, begin=begin, end=end))
    xs = torch.randn(shape)
    got = pb.build(fn, target="torch")["main"](xs)
    assert (got.untyped_storage().data_ptr() == xs.untyped_storage().data_ptr()) is view
    assert got.is_contiguous() or view
    assert torch.equal(got, xs[tuple(slice(b, e) for b, e in zip(begin, end))])


@pytest.mark.parametrize("shape", [(4, 16, 64), (2, 3, 8, 64)])
def test_linear_of_contiguous_rows_is_eagers_f_linear(shape):
    """N-D contiguous rows with a bias: eager's ``F.linear`` (one ``addmm`` over the flattened rows, the bias in the
    GEMM's output: one pass over the result less than a GEMM and an add), bit for bit."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    xs, ws, bs = torch.randn(shape, generator=g), torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    x, w, b = var("x", shape=shape), var("w", shape=(32, 64)), var("b", shape=(32,))
    got = pb.build(Function([x, w, b], pb.op.nn.linear(x, w, b)), target="torch")["main"](xs, ws, bs)
    assert torch.equal(got, torch.nn.functional.linear(xs, ws, bs))


@pytest.mark.parametrize("negative", [False, True])
def test_take_checks_its_indices_in_one_pass(negative):
    """A ``take``'s bounds check is one ``aminmax`` over the indices (not a comparison per bound, their union and
    an ``any``), and negative indices are wrapped only when there are some; the result is the numpy target's,
    and an index out of range is an error naming the first one."""
    x, i = var("x", shape=(5, 3)), var("i", shape=(4,), dtype="int64")
    f = Function([x, i], op.take(x, i, axis=0, mode="fast"))
    xs = np.arange(15, dtype="float32").reshape(5, 3)
    idx = np.array([0, -1, 3, 1] if negative else [0, 4, 3, 1])
    fn = pb.build(f, target="torch")["main"]
    fn(xs, idx)
    with aten_calls() as calls:
        got = fn(torch.from_numpy(xs), torch.from_numpy(idx))
    names = [n for n in calls.names if n not in ("lift_fresh", "detach", "_local_scalar_dense")]
    assert names == ["aminmax", *(["lt", "add", "where"] if negative else []), "index_select"], calls.names
    np.testing.assert_array_equal(got.numpy(), pb.build(f)["main"](xs, idx))
    with pytest.raises(pb.ExecutionError, match="take: index 7 out of range"):
        fn(xs, np.array([0, 7, -9, 1]))


@pytest.mark.parametrize("kind", ["collapse_sum_to", "sum"])
def test_a_bias_gradient_sums_rows_as_eager_does(kind):
    """A linear layer's bias gradient, (B, L, C) summed down to (C,), runs as ATen's sum over dim 0 of the (B * L,
    C) view (as eager's ``addmm`` backward sums it; over (0, 1) keeping dims ATen takes 1.5-2.6x longer), with
    eager's bits; a transposed operand (no such view) sums as it is; both equal the numpy target."""
    x = var("x", shape=(4, 96, 128))
    out = op.collapse_sum_to(x, (128,)) if kind == "collapse_sum_to" else op.sum(x, axis=(0, 1), keepdims=True)
    f = Function([x], out)
    fn, ref = pb.build(f, target="torch")["main"], pb.build(f)["main"]
    xs = torch.randn(4, 96, 128)
    for t in (xs, xs.transpose(0, 1).contiguous().transpose(0, 1)):
        with torch_args_of("sum") as seen:
            got = fn(t)
        assert seen == [(((384, 128), (128, 1)), [0])] if t.is_contiguous() else [(((4, 96, 128), t.stride()), [0, 1])]
        np.testing.assert_allclose(got.numpy(), ref(t.numpy()), rtol=1e-5, atol=1e-4)
    assert torch.equal(fn(xs).reshape(128), xs.reshape(-1, 128).sum(0))


def torch_args_of(name: str):
    """A ``TorchDispatchMode`` listing, for each call of ATen operator ``name``, its tensor's (shape, strides) and
    its dims (``.seen``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode, list):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == name:
                self.append(((tuple(args[0].shape), args[0].stride()), list(args[1])))
            return func(*args, **(kwargs or {}))

    return Seen()


@pytest.mark.parametrize("target", ["torch", "numpy"])
def test_rows_met_across_their_features_are_one_gemm(target):
    """``nn.dense`` of an NCHW tensor seen as NHWC rows (its features not innermost: EdgeNeXt's pointwise layers
    in the backward) copies the rows once and runs one GEMM over them, as eager's ``addmm`` backward does, not a
    batched matmul of one small GEMM per (n, h); the result is the float64 product's."""
    from pullback.ops.nn import dense_in_memory_order

    rng = np.random.default_rng(0)
    x64, w64 = rng.standard_normal((16, 88, 4, 4)), rng.standard_normal((24, 88))
    x, w = (torch.from_numpy(a.astype("float32")) for a in (x64, w64))
    if target == "numpy":
        x, w = x.numpy(), w.numpy()
    rows = x.transpose(0, 2, 3, 1) if target == "numpy" else x.permute(0, 2, 3, 1)
    with aten_calls() as calls:
        got = dense_in_memory_order(rows, w)
    if target == "torch":
        assert "bmm" not in calls.names and calls.names.count("mm") == 1, calls.names
    want = x64.transpose(0, 2, 3, 1) @ w64.T
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    assert got.shape == (16, 4, 4, 24)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("transposed", [False, True])
def test_stack_on_a_new_innermost_axis_fills_its_columns(dtype, axis, transposed):
    """``stack`` on a new last axis (an interleave: ``x[..., ::2]``'s gradient beside ``x[..., 1::2]``'s) copies
    each tensor into its column of a new tensor (``torch.stack`` joins them element by element there, 3.5x the
    time); on other axes it is ``torch.stack``. Either way the numpy target's values, operands of any layout."""
    from pullback.runtime.torch_kernels import fast_kernel

    rng = np.random.default_rng(3)
    xs = [(rng.standard_normal((4, 3)) * 3).astype(dtype) for _ in range(3)]
    params = [var(f"x{i}", shape=(3, 4) if transposed else (4, 3), dtype=dtype) for i in range(3)]
    fn = Function(params, op.stack([op.transpose(p) if transposed else p for p in params], axis))
    args = [x.T.copy() if transposed else x for x in xs]
    want = pb.build(fn)["main"](*args)
    np.testing.assert_array_equal(want, np.stack(xs, axis))
    got = pb.build(fn, target="torch")["main"](*args)
    np.testing.assert_array_equal(got.numpy(), want)
    assert fn.body.checked_type.shape == want.shape
    assert (fast_kernel(fn.body) is not None) == (axis == -1)


@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
def test_gather_and_scatter_add_are_atens_kernels_without_a_pass_over_the_indices(index_dtype, monkeypatch):
    """``gather`` and ``scatter_add`` on torch are ATen's (eager's kernels and bits: repeated positions summed in
    its order), reading an expanded index as it is, with no ``aminmax`` over the indices first; an index out of
    range is the pullback error naming the op and the range."""
    import torch

    from pullback import ExecutionError

    rng = np.random.default_rng(1)
    xs, us = rng.standard_normal((2, 3, 5)).astype("float32"), rng.standard_normal((2, 3, 4)).astype("float32")
    idx = rng.integers(0, 5, (1, 1, 4)).astype(index_dtype)
    x, u, i = var("x", shape=(2, 3, 5)), var("u", shape=(2, 3, 4)), var("i", shape=(1, 1, 4), dtype=index_dtype)
    wide = op.broadcast_to(i, (2, 3, 4))
    fn = Function([x, u, i], pb.Tuple([op.gather(x, 2, wide), op.scatter_add(x, wide, u, 2)]))
    seen = []
    real = torch.Tensor.aminmax
    monkeypatch.setattr(torch.Tensor, "aminmax", lambda *a, **k: seen.append(1) or real(*a, **k))
    got = pb.build(fn, target="torch")["main"](xs, us, idx)
    assert not seen
    tx, ti = torch.from_numpy(xs), torch.from_numpy(idx).long().expand(2, 3, 4)
    assert torch.equal(got[0], tx.gather(2, ti)) and torch.equal(got[1], tx.scatter_add(2, ti, torch.from_numpy(us)))
    for a, b in zip(got, pb.build(fn)["main"](xs, us, idx)):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-6)
    for bad in (5, -1):
        idx[0, 0, 2] = bad
        with pytest.raises(ExecutionError, match=rf"gather: index {bad} out of range \[0, 5\) along axis 2"):
            pb.build(fn, target="torch")["main"](xs, us, idx)
