"""The numpy target with ATen's kernels for its heavy operators (``build(mod, aten=True)``).

Every op-table program holding a GEMM, convolution, pooling or batch norm runs with ``aten=True`` and
equals the plain numpy target; inputs the caller passed (read-only, strided, reversed) and constants
reach ATen's kernels without being written, results stay NumPy arrays, and calls ATen does not take
(other dtypes) run NumPy's kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from op_table import table_programs
from pullback import Function, op, var
from pullback.ir.expr import Call
from pullback.ir.traversal import post_order
from pullback.runtime.aten_on_numpy import ATEN_OPS, ELEMENTWISE, as_tensor, aten_kernel, takes

torch = pytest.importorskip("torch")


def assert_same(want, got):
    wl, gl = pb.runtime.values.leaves(want), pb.runtime.values.leaves(got)
    assert len(wl) == len(gl)
    for k, (w, g) in enumerate(zip(wl, gl)):
        assert isinstance(g, (np.ndarray, np.generic)), type(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


def _typed(fn: Function) -> Function:
    return pb.transform.InferType()(pb.IRModule.from_expr(fn))["main"]


def _taken(mod) -> set:
    pb.analysis.infer_module(mod)
    return {n.op.name for n in post_order(mod["main"].body) if isinstance(n, Call) and takes(n)}


PROGRAMS = [(name, mod, inputs) for name, mod, inputs in table_programs("torch") if _taken(mod)]


def test_the_table_reaches_every_aten_operator():
    assert set().union(*(_taken(mod) for _, mod, _ in PROGRAMS)) == ATEN_OPS


def test_activations_softmaxes_and_their_gradients_run_aten_kernels_at_every_size():
    rng = np.random.default_rng(2)
    for shape in ((8, 16, 16, 16), (4, 8)):
        x, g = var("x", shape=shape), var("g", shape=shape)
        y = op.nn.softmax(x)
        outs = [op.nn.threshold_grad(g, op.nn.relu(x), 0.0), op.nn.gelu_grad(g, op.nn.gelu(x)),
                op.nn.softmax_grad(g, y), op.nn.log_softmax_grad(g, op.nn.log_softmax(x)),
                op.nn.gelu(x, approximate="tanh"), op.nn.clip_grad(g, op.clip(x, 0.0, 1.0), 0.0, 0.5),
                op.nn.silu_grad(g, op.nn.silu(x)), op.sigmoid(x), op.nn.leaky_relu_grad(g, op.nn.leaky_relu(x, 0.2), 0.2),
                op.nn.softplus_grad(g, op.nn.softplus(x, 2.0, 1.5), 2.0, 1.5), op.nn.mish_grad(g, op.nn.mish(x))]
        fn = _typed(Function([x, g], pb.Tuple(outs)))
        taken = {n.op.name for n in post_order(fn.body) if isinstance(n, Call) and takes(n)}
        assert taken == ELEMENTWISE and {"nn.softplus", "nn.softplus_grad", "nn.mish", "nn.mish_grad"} <= taken
        xs, gs = rng.standard_normal(shape).astype("float32"), rng.standard_normal(shape).astype("float32")
        for got, want in zip(pb.build(fn, aten=True)["main"](xs, gs), pb.build(fn)["main"](xs, gs)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_constant_padding_runs_aten_kernel_into_new_writable_memory():
    # constant padding (a single-tap convolution's weight gradient, negative widths crop) is ATen's; the other
    # modes stay NumPy's. The result is new memory, handed on writable (the integration hands it to torch as is)
    x = var("x", shape=(6, 5, 1, 1), dtype="float32")
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 5, 1, 1)).astype("float32")
    for widths, mode, aten in ((((0, 0), (0, 0), (1, 1), (1, 1)), "constant", True),
                               (((0, 0), (-1, -2), (0, 0), (0, 0)), "constant", True),
                               (((0, 0), (0, 0), (0, 0), (0, 0)), "constant", True),
                               (((0, 0), (1, 1), (0, 0), (0, 0)), "reflect", False)):
        fn = _typed(Function([x], op.nn.pad(x, widths, 0.5, mode)))
        assert takes(fn.body) == aten
        got = pb.build(fn, aten=True)["main"](a)
        np.testing.assert_array_equal(got, pb.build(fn)["main"](a))
        if aten:
            out = aten_kernel(fn.body)(a, fn.body.attrs)
            assert out.flags.writeable and not np.shares_memory(out, a)


def test_an_aten_result_reaches_the_next_aten_kernel_without_a_copy():
    # pooling's result may be a view, so it is handed on read-only; the next ATen kernel still reads its memory
    x = var("x", shape=(2, 3, 8, 8), dtype="float32")
    pool = _typed(Function([x], op.nn.max_pool2d(x, pool_size=(2, 2), strides=(2, 2)))).body
    a = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype("float32")
    pooled = aten_kernel(pool)(a, pool.attrs)
    assert not pooled.flags.writeable
    with pytest.raises(ValueError):
        pooled[0, 0, 0, 0] = 1.0
    assert as_tensor(torch, pooled).data_ptr() == pooled.ctypes.data


@pytest.mark.parametrize("mod, inputs", [pytest.param(m, i, id=name) for name, m, i in PROGRAMS])
def test_op_table_matches_numpy(mod, inputs):
    originals = [np.array(x, copy=True) for x in inputs]
    got = pb.build(mod, aten=True, check_outputs=True)["main"](*inputs)
    assert_same(pb.build(mod)["main"](*inputs), got)
    for x, x0 in zip(inputs, originals):
        np.testing.assert_array_equal(x, x0)  # nothing the caller passed was written


def _strided(x: np.ndarray) -> np.ndarray:
    """``x``'s values in every other element of a buffer twice as long on the last axis (last stride doubled)."""
    if x.ndim == 0:
        return x
    big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    big[..., ::2] = x
    return big[..., ::2]


@pytest.mark.parametrize("mod, inputs", [pytest.param(m, i, id=name) for name, m, i in PROGRAMS])
def test_op_table_on_strided_arrays(mod, inputs):
    """ATen's kernels on views of arrays whose last axis is not contiguous give the contiguous arrays' result (to
    a summation order's rounding): its flash attention read rows as contiguous memory (garbage outputs before)."""
    run = pb.build(mod, aten=True)["main"]
    want, got = run(*inputs), run(*[_strided(np.asarray(x)) for x in inputs])
    for k, (w, g) in enumerate(zip(pb.runtime.values.leaves(want), pb.runtime.values.leaves(got), strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


def _conv_relu():
    x, w = var("x", shape=(2, 3, 6, 6), dtype="float64"), var("w", shape=(4, 3, 3, 3), dtype="float64")
    return Function([x, w], op.nn.relu(op.nn.conv2d(x, w, padding=1)))


def test_caller_arrays_of_every_layout_and_constants():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 6, 6))
    w = rng.standard_normal((4, 3, 3, 3))
    fn = _conv_relu()
    want = pb.build(fn)["main"](x, w)
    exe = pb.build(fn, aten=True)["main"]
    ro = x.copy()
    ro.flags.writeable = False  # read-only at its source: copied for ATen
    flipped = np.ascontiguousarray(x[:, :, ::-1])[:, :, ::-1]  # negative strides: copied for ATen
    strided = np.repeat(x, 2, axis=3)[..., ::2]  # a view with gaps
    for arr in (x, ro, flipped, strided):
        before = np.array(arr, copy=True)
        np.testing.assert_allclose(exe(arr, w), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(arr, before)
    # the weight as a constant of the program (read-only data)
    xv = var("x", shape=(2, 3, 6, 6), dtype="float64")
    const_fn = Function([xv], op.nn.relu(op.nn.conv2d(xv, pb.const(w), padding=1)))
    np.testing.assert_allclose(pb.build(const_fn, aten=True)["main"](x), want, rtol=1e-12, atol=1e-12)


def test_as_tensor_shares_memory_where_it_can():
    a = np.arange(6.0).reshape(2, 3)
    ro = a[:, 1:]
    ro.flags.writeable = False  # a read-only view of writable memory (the evaluator's inputs): shared
    t = as_tensor(torch, ro)
    assert t.data_ptr() == ro.ctypes.data and not ro.flags.writeable
    src = np.arange(4.0)
    src.flags.writeable = False  # read-only at its source: a copy
    assert as_tensor(torch, src).data_ptr() != src.ctypes.data
    rev = a[:, ::-1]  # negative strides: a copy
    torch.testing.assert_close(as_tensor(torch, rev), torch.from_numpy(a.copy()).flip(1))
    rev.flags.writeable = False  # read-only and negative strides: a copy too
    torch.testing.assert_close(as_tensor(torch, rev), torch.from_numpy(a.copy()).flip(1))
    s = as_tensor(torch, np.float64(2.5))  # a NumPy scalar: a 0-d tensor
    assert s.shape == () and s.item() == 2.5


def test_a_convolution_plus_bias_runs_atens_kernel():
    """The plan writes conv2d + bias as ``nn.conv2d_bias``: ATen's too, not NumPy's im2col and OpenBLAS GEMM between
    ATen's kernels (the two thread pools' spinning workers fought: a small U-Net's forward 28 -> 4 ms)."""
    x, w, b = var("x", shape=(2, 3, 6, 6)), var("w", shape=(4, 3, 3, 3)), var("b", shape=(4, 1, 1))
    fn = _typed(Function([x, w, b], op.nn.relu(op.add(op.nn.conv2d(x, w, padding=1), b))))
    c = var("c", shape=(4,))
    bias_conv = Call(pb.ops.get_op("nn.conv2d_bias"), [x, w, c], fn.body.args[0].args[0].attrs)
    assert aten_kernel(_typed(Function([x, w, c], bias_conv)).body) is not None
    rng = np.random.default_rng(3)
    xs, ws, bs = (rng.standard_normal(s).astype("float32") for s in ((2, 3, 6, 6), (4, 3, 3, 3), (4, 1, 1)))
    np.testing.assert_allclose(pb.build(fn, aten=True)["main"](xs, ws, bs), pb.build(fn)["main"](xs, ws, bs),
                               rtol=1e-5, atol=1e-5)


def test_results_reused_in_place_stay_right():
    # relu writes into the convolution's fresh result (the plan's buffer reuse); the convolution itself is ATen's
    fn = _typed(_conv_relu())
    conv = next(n for n in post_order(fn.body) if isinstance(n, Call) and n.op.name == "nn.conv2d")
    assert aten_kernel(conv) is not None
    exe = pb.build(fn, aten=True)
    plan = exe["main"].plan
    plan.ensure()
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    for _ in range(3):  # buffers of one call must not leak into the next
        np.testing.assert_allclose(exe["main"](x, w), pb.build(fn)["main"](x, w), rtol=1e-12, atol=1e-12)


def test_other_dtypes_run_numpy_kernels():
    for dtype in ("float16", "int32"):
        a, b = var("a", shape=(3, 4), dtype=dtype), var("b", shape=(5, 4), dtype=dtype)
        fn = _typed(Function([a, b], op.nn.dense(a, b)))
        call = fn.body
        assert not takes(call) and aten_kernel(call) is None
        x, y = np.arange(12).reshape(3, 4).astype(dtype), np.arange(20).reshape(5, 4).astype(dtype)
        got = pb.build(fn, aten=True)["main"](x, y)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, pb.build(fn)["main"](x, y))


@pytest.mark.parametrize("axis, aten", [(-1, True), (2, True), (1, False)])
def test_layer_norm_and_its_gradient_run_aten_kernels_over_the_last_axis(axis, aten):
    """Layer norm and its gradient over the last axis run ATen's fused kernels (NumPy's are numba's: their import
    and cached machine code cost a transformer layer's first call 1.2 s); over another axis, NumPy's. The results
    equal the plain numpy target's."""
    rng = np.random.default_rng(4)
    c = 5 if axis in (-1, 2) else 3
    x, g = var("x", shape=(4, 3, 5), dtype="float64"), var("g", shape=(4, 3, 5), dtype="float64")
    gamma, beta = var("gamma", shape=(c,), dtype="float64"), var("beta", shape=(c,), dtype="float64")
    fwd = op.nn.native_layer_norm(x, gamma, beta, axis=axis, epsilon=1e-5)
    stats = [pb.TupleGetItem(fwd, 1), pb.TupleGetItem(fwd, 2)]
    grad = op.nn.native_layer_norm_grad(g, x, gamma, *stats, axis=axis, epsilon=1e-5)
    fn = _typed(Function([x, g, gamma, beta], pb.Tuple([pb.TupleGetItem(fwd, 0), grad])))
    calls = [n for n in post_order(fn.body) if isinstance(n, Call)]
    assert [takes(n) for n in calls] == [aten, aten]
    args = [rng.standard_normal((4, 3, 5)), rng.standard_normal((4, 3, 5)), rng.standard_normal(c), rng.standard_normal(c)]
    assert_same(pb.build(fn)["main"](*args), pb.build(fn, aten=True)["main"](*args))


def test_fused_groups_run_aten_gemms():
    a, b = var("a", shape=(3, 4), dtype="float64"), var("b", shape=(5, 4), dtype="float64")
    mod = pb.IRModule.from_expr(Function([a, b], op.tanh(op.add(op.nn.dense(a, b), pb.const(1.0, "float64")))))
    fused = pb.transform.FuseOps()(pb.transform.InferType()(mod))
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    np.testing.assert_allclose(pb.build(fused, aten=True)["main"](x, y), np.tanh(x @ y.T + 1.0), rtol=1e-12)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_aten_option_must_be_a_bool(bad):
    with pytest.raises(pb.ExecutionError, match="aten must be True or False"):
        pb.build(_conv_relu(), aten=bad)


def test_the_integration_builds_its_numpy_programs_with_aten():
    from pullback.integrations.torch import compile as pb_compile

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 2)).double()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    compiled = pb_compile(model, (x,), target="numpy")
    compiled(x).sum().backward()
    (tp,) = compiled._programs.values()
    for exe in (tp.fwd, tp.bwd):
        assert exe._exe.target.aten
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-12, atol=1e-12)


def test_negative_log_likelihood_runs_aten_kernels_with_integer_targets():
    """nll_loss and its gradient take ATen's kernels (their integer targets too): the loss and gradient are the
    torch target's, and an out-of-range target is the same error as on every target."""
    p, t, g = var("p", shape=(32, 10)), var("t", shape=(32,), dtype="int64"), var("g", shape=())
    w = pb.const(np.linspace(0.5, 1.5, 10, dtype="float32"))
    fn = _typed(Function([p, t, g], pb.Tuple([op.nn.nll_loss(p, t, w), op.nn.nll_loss_grad(g, p, t, w)])))
    assert {n.op.name for n in post_order(fn.body) if isinstance(n, Call) and takes(n)} == {"nn.nll_loss", "nn.nll_loss_grad"}
    rng = np.random.default_rng(3)
    ps, ts = rng.standard_normal((32, 10)).astype("float32"), rng.integers(0, 10, 32)
    ts[3] = -100  # ignored
    gs = np.float32(0.7)
    got, want = pb.build(fn, aten=True)["main"](ps, ts, gs), pb.build(fn, target="torch")["main"](ps, ts, gs)
    for a, b in zip(got, want):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, b.numpy())
    ts[5] = 10
    for exe in (pb.build(fn, aten=True), pb.build(fn)):
        with pytest.raises(pb.ExecutionError, match="target 10 is out of range"):
            exe["main"](ps, ts, gs)


def test_grouped_gemms_run_aten_kernels_with_integer_offsets():
    """A mixture of experts' grouped GEMMs take ATen's mm on the numpy target (NumPy's BLAS between ATen's kernels
    fought its thread pool): the results are the torch target's bits, empty groups and rows past the last too."""
    x, w, o = var("x", shape=(40, 16)), var("w", shape=(3, 16, 8)), var("o", shape=(3,), dtype="int64")
    g = var("g", shape=(40, 8))
    fn = _typed(Function([x, w, o, g], pb.Tuple([op.nn.grouped_matmul(x, w, o), op.nn.grouped_transpose_matmul(x, g, o)])))
    assert {n.op.name for n in post_order(fn.body) if isinstance(n, Call) and takes(n)} == {
        "nn.grouped_matmul", "nn.grouped_transpose_matmul"}
    rng = np.random.default_rng(5)
    args = [rng.standard_normal((40, 16)).astype("float32"), rng.standard_normal((3, 16, 8)).astype("float32"),
            np.array([12, 12, 33]), rng.standard_normal((40, 8)).astype("float32")]
    got, want = pb.build(fn, aten=True)["main"](*args), pb.build(fn, target="torch")["main"](*args)
    for a, b in zip(got, want):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, b.numpy())
    assert not got[0][33:].any() and not got[1][1].any()


def test_an_embedding_gradient_runs_aten_index_add_with_integer_positions():
    """An embedding's gradient (``index_add`` of rows at token ids, repeated ones included) takes ATen's kernel on
    the numpy target (NumPy's is a numba loop, whose import cost a program's first call ~0.6 s): eager's embedding
    backward's bits, the torch target's; an out-of-range id is the same error as on NumPy's kernel."""
    table, ids, g = var("table", shape=(50, 16)), var("ids", shape=(2, 12), dtype="int64"), var("g", shape=(2, 12, 16))
    fn = _typed(Function([table, ids, g], op.index_add(op.zeros_like(table), ids, g, axis=0, mode="fast")))
    assert {n.op.name for n in post_order(fn.body) if isinstance(n, Call) and takes(n)} == {"index_add"}
    rng = np.random.default_rng(8)
    w, t, gs = rng.standard_normal((50, 16)).astype("float32"), rng.integers(0, 50, (2, 12)), rng.standard_normal((2, 12, 16)).astype("float32")
    t[1, :4] = t[0, 0]  # repeated ids: their rows summed
    got = pb.build(fn, aten=True)["main"](w, t, gs)
    weight = torch.from_numpy(w).requires_grad_()
    (eager,) = torch.autograd.grad(torch.nn.functional.embedding(torch.from_numpy(t), weight), [weight],
                                   torch.from_numpy(gs))
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, eager.numpy())
    np.testing.assert_array_equal(got, pb.build(fn, target="torch")["main"](w, t, gs).numpy())
    t[1, 2] = 50
    for exe in (pb.build(fn, aten=True), pb.build(fn)):
        with pytest.raises(pb.ExecutionError, match="out of range"):
            exe["main"](w, t, gs)
