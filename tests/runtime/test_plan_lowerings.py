"""The plan's lowerings (``runtime.plan``), on every target with the same results as the body as written:

- reshapes of one value share its copy (``share_reshape_sources``): a later reshape of a value an earlier
  reshape reads reshapes that earlier result instead;
- a dense whose one use adds a bias vector runs as ``nn.linear``, a convolution whose one use adds a bias per
  channel as ``nn.conv2d_bias`` (``fuse_bias_adds``);
- ``stop_gradient(x)`` is read as ``x`` (``drop_stop_gradients``);
- a dense of transposed matrices (a weight gradient's ``dense(g^T, x^T)``) is the matmul ``g^T x``
  (``fold_gemm_transposes``)."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Function, IRModule, Tuple, op, var
from pullback.ir.traversal import post_order
from pullback.runtime.plan import drop_stop_gradients, fold_gemm_transposes, fuse_bias_adds, share_reshape_sources

TARGETS = ["numpy", "torch", "jax"]


def _typed(f: Function) -> tuple:
    """``(body, its post-order)`` with every node typed, as a built module's are (the lowerings read cached
    types only)."""
    f.body.checked_type  # noqa: B018 - infers and caches the types of the whole body
    return f.body, post_order(f.body)


def test_an_untyped_body_is_left_as_written():
    f, _ = _two_reshapes_of_a_transpose()
    x, w, b = var("x", shape=(2, 5)), var("w", shape=(4, 5)), var("b", shape=(4,))
    g = Function([x, w, b], op.add(op.nn.dense(x, w), b))
    assert share_reshape_sources(f.body, post_order(f.body)) is f.body
    assert fuse_bias_adds(g.body, post_order(g.body)) is g.body


def _two_reshapes_of_a_transpose(second=(6, 4, 8)):
    x = var("x", shape=(4, 6, 8))
    t = op.transpose(x, (1, 0, 2))  # not contiguous: each reshape of it to rows copies
    return Function([x], Tuple([op.reshape(t, (24, 8)), op.sum(op.reshape(t, second), axis=0)])), x


def test_the_second_reshape_reads_the_first():
    f, _ = _two_reshapes_of_a_transpose()
    body = share_reshape_sources(*_typed(f))
    first, summed = body.fields
    second = summed.args[0]
    assert second.args[0] is first and second.attrs.newshape == (6, 4, 8)
    assert second.checked_type == f.body.fields[1].args[0].checked_type
    assert share_reshape_sources(body, post_order(body)) is body  # nothing left to share


def test_a_reshape_copying_a_dim_of_its_operand_is_kept():
    f, _ = _two_reshapes_of_a_transpose(second=(0, 4, 8))  # 0: the operand's dim 0, which differs between the two
    assert share_reshape_sources(*_typed(f)) is f.body


@pytest.mark.parametrize("target", TARGETS)
def test_results_are_those_of_each_reshape_of_the_value(target):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    f, _ = _two_reshapes_of_a_transpose()
    x = np.random.default_rng(0).standard_normal((4, 6, 8)).astype("float32")
    keep = x.copy()
    rows, sums = pb.build(IRModule.from_expr(f), target=target)["main"](x)
    t = x.transpose(1, 0, 2)
    np.testing.assert_array_equal(np.asarray(rows), t.reshape(24, 8))
    np.testing.assert_allclose(np.asarray(sums), t.reshape(6, 4, 8).sum(0), rtol=1e-6)
    np.testing.assert_array_equal(x, keep)


def test_the_torch_target_copies_the_value_once():
    torch = pytest.importorskip("torch")
    x = var("x", shape=(4, 6, 8))
    t = op.transpose(x, (1, 0, 2))
    f = Function([x], Tuple([op.reshape(t, (24, 8)), op.reshape(t, (6, 32))]))
    a, b = pb.build(IRModule.from_expr(f), target="torch")["main"](torch.randn(4, 6, 8))
    assert a.data_ptr() == b.data_ptr()  # before: two copies of the transposed value
    assert torch.equal(a.reshape(6, 32), b)


# ---------------------------------------------------------------- dense + bias


def _ops(body) -> list:
    return [n.op.name for n in post_order(body) if hasattr(n, "op")]


def _dense_plus(kind: str, x, w, b):
    d = op.nn.dense(x, w)
    if kind == "add":
        return op.add(d, b)
    if kind == "add-bias-first":
        return op.add(b, d)
    return op.nn.bias_add(d, b, axis=-1)


@pytest.mark.parametrize("kind", ["add", "add-bias-first", "bias_add"])
def test_a_dense_plus_its_bias_becomes_one_linear(kind):
    x, w, b = var("x", shape=(2, 3, 5)), var("w", shape=(4, 5)), var("b", shape=(4,))
    f = Function([x, w, b], op.tanh(_dense_plus(kind, x, w, b)))
    body = fuse_bias_adds(*_typed(f))
    assert _ops(body) == ["nn.linear", "tanh"]
    assert body.args[0].checked_type == f.body.args[0].checked_type


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("first", ["shape read first", "add first"])
def test_a_dense_whose_type_alone_is_read_again_becomes_one_linear(target, first):
    """Over a dynamic length a gradient program reads a GEMM's result for its shape (``zeros_like``: ConcretizeLike
    cannot write it out); that read is not a use of its value: the GEMM and its bias are one ``nn.linear``, which
    the read takes its shape from. Where the read runs first in the post-order, before the sum, they stay apart
    (fused, the GEMM would run twice)."""
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    x, w, b = (var(n, shape=s, dtype="float64") for n, s in (("x", (pb.Any, 5)), ("w", (4, 5)), ("b", (4,))))
    d = op.nn.dense(x, w)
    shape, total = op.zeros_like(d), op.add(d, b)
    f = Function([x, w, b], Tuple([shape, total] if first == "shape read first" else [total, shape]))
    body = fuse_bias_adds(*_typed(f))
    assert _ops(body) == (["nn.dense", "zeros_like", "add"] if first == "shape read first" else ["nn.linear", "zeros_like"])
    rng = np.random.default_rng(3)
    xv, wv, bv = (rng.standard_normal(s) for s in ((6, 5), (4, 5), (4,)))
    out = pb.build(IRModule.from_expr(f), target=target)["main"](xv, wv, bv)
    got = {k: np.asarray(v) for k, v in zip(("shape", "total") if first == "shape read first" else ("total", "shape"), out)}
    np.testing.assert_array_equal(got["shape"], np.zeros((6, 4)))
    np.testing.assert_allclose(got["total"], xv @ wv.T + bv, rtol=1e-12)


@pytest.mark.parametrize("target", TARGETS)
def test_a_matmul_by_a_matrix_plus_its_bias_becomes_one_linear(target):
    """GPT-2's Conv1D: ``addmm(bias, x, w)`` with w of shape (in, out)."""
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    x, w, b = (var(n, shape=s, dtype="float64") for n, s in (("x", (6, 5)), ("w", (5, 4)), ("b", (4,))))
    f = Function([x, w, b], op.add(b, op.nn.matmul(x, w)))
    assert _ops(fuse_bias_adds(*_typed(f))) == ["transpose", "nn.linear"]
    rng = np.random.default_rng(2)
    xv, wv, bv = (rng.standard_normal(s) for s in ((6, 5), (5, 4), (4,)))
    np.testing.assert_allclose(np.asarray(pb.build(IRModule.from_expr(f), target=target)["main"](xv, wv, bv)),
                               xv @ wv + bv, rtol=1e-12)


def test_a_matmul_of_transposed_data_or_batched_weights_stays():
    x, w, b = var("x", shape=(5, 6)), var("w", shape=(5, 4)), var("b", shape=(4,))
    f = Function([x, w, b], op.add(op.nn.matmul(x, w, transpose_a=True), b))
    assert fuse_bias_adds(*_typed(f)) is f.body
    x, w = var("x", shape=(2, 6, 5)), var("w", shape=(2, 5, 4))
    f = Function([x, w, b], op.add(op.nn.batch_matmul(x, w, transpose_b=False), b))
    assert fuse_bias_adds(*_typed(f)) is f.body


def _dense_then(then):
    x, w, b = var("x", shape=(4, 5)), var("w", shape=(4, 5)), var("b", shape=(4,))
    return Function([x, w, b], then(op.nn.dense(x, w), b))


@pytest.mark.parametrize("why, f", [
    ("the dense is used twice", _dense_then(lambda d, b: op.multiply(op.add(d, b), d))),
    ("the dense is returned too", _dense_then(lambda d, b: Tuple([op.add(d, b), d]))),
    ("the bias is on the rows", _dense_then(lambda d, b: op.nn.bias_add(d, b, axis=0))),
    ("the sum is not a bias", _dense_then(lambda d, b: op.add(d, op.nn.dense(b, op.reshape(b, (1, 4)))))),
])
def test_other_sums_stay_as_written(why, f):
    assert fuse_bias_adds(*_typed(f)) is f.body, why


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(2, 3, 5), (3, 5), (5,), (16, 8, 256)])
def test_linear_results_are_the_dense_plus_the_bias(target, shape):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    units = 256 if shape[-1] == 256 else 4  # 256 x 256: oneDNN's GEMM with the bias on torch
    x, w, b = var("x", shape=shape), var("w", shape=(units, shape[-1])), var("b", shape=(units,))
    exe = pb.build(IRModule.from_expr(Function([x, w, b], op.tanh(op.add(op.nn.dense(x, w), b)))), target=target)
    assert "nn.linear" in exe["main"].plan.dump()
    rng = np.random.default_rng(1)
    xv, wv, bv = (rng.standard_normal(s).astype("float32") for s in (shape, (units, shape[-1]), (units,)))
    keep = [a.copy() for a in (xv, wv, bv)]
    got = np.asarray(exe["main"](xv, wv, bv))
    want = np.tanh(xv.astype("float64") @ wv.T.astype("float64") + bv)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    for a, k in zip((xv, wv, bv), keep):
        np.testing.assert_array_equal(a, k)


def test_a_sequence_first_view_gets_its_bias_too():
    """attention's in-projection: a dense of a transposed input (the GEMM in memory order) plus its bias."""
    torch = pytest.importorskip("torch")
    x, w, b = var("x", shape=(8, 16, 256)), var("w", shape=(768, 256)), var("b", shape=(768,))
    f = Function([x, w, b], op.add(op.nn.dense(op.transpose(x, (1, 0, 2)), w), b))
    xv, wv, bv = torch.randn(8, 16, 256), torch.randn(768, 256), torch.randn(768)
    got = pb.build(IRModule.from_expr(f), target="torch")["main"](xv, wv, bv)
    want = torch.nn.functional.linear(xv.double().transpose(0, 1), wv.double(), bv.double())
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("target", TARGETS)
def test_calls_of_module_functions_around_the_lowerings_keep_their_types(target):
    """A lowering rebuilds the nodes after the ones it changes: a call of a module function among them keeps its
    type (inferring it again would need the module; a straight-through estimator's custom_vjp, Hugging Face's
    YOSO, failed so)."""
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    from pullback import Call, GlobalVar

    sq = GlobalVar("sq")
    y = var("y", shape=(2, 3, 4))
    x, w, b = var("x", shape=(2, 3, 5)), var("w", shape=(4, 5)), var("b", shape=(4,))
    h = Call(sq, [op.add(op.nn.dense(x, w), b)])  # the call's operand is rebuilt as an nn.linear
    t = op.transpose(h, (1, 0, 2))
    body = op.multiply(op.reshape(t, (3, 8)), op.reshape(Call(sq, [op.reshape(t, (2, 3, 4))]), (3, 8)))
    mod = IRModule({sq: Function([y], op.multiply(y, y))}).with_function("main", Function([x, w, b], body))
    exe = pb.build(mod, target=target)
    assert "nn.linear" in exe["main"].plan.dump()
    rng = np.random.default_rng(4)
    xv, wv, bv = (rng.standard_normal(s).astype("float32") for s in ((2, 3, 5), (4, 5), (4,)))
    hv = (xv @ wv.T + bv) ** 2
    tv = hv.transpose(1, 0, 2)
    np.testing.assert_allclose(np.asarray(exe["main"](xv, wv, bv)), tv.reshape(3, 8) * (tv.reshape(2, 3, 4) ** 2).reshape(3, 8),
                               rtol=1e-5)


# ---------------------------------------------------------------- conv2d + bias


def _conv_plus(kind: str, x, w, b):
    c = op.nn.conv2d(x, w, padding=(1, 1, 1, 1))
    if kind == "add":  # the importer's form
        return op.add(c, op.reshape(b, (-1, 1, 1)))
    if kind == "add-bias-first":
        return op.add(op.reshape(b, (-1, 1, 1)), c)
    return op.nn.bias_add(c, b, axis=1)


@pytest.mark.parametrize("kind", ["add", "add-bias-first", "bias_add"])
def test_a_convolution_plus_its_bias_becomes_one_conv2d_bias(kind):
    x, w, b = var("x", shape=(2, 3, 6, 6)), var("w", shape=(4, 3, 3, 3)), var("b", shape=(4,))
    f = Function([x, w, b], op.nn.relu(_conv_plus(kind, x, w, b)))
    body = fuse_bias_adds(*_typed(f))
    assert _ops(body) == ["nn.conv2d_bias", "nn.relu"]
    assert body.args[0].attrs == f.body.args[0].args[0 if kind != "add-bias-first" else 1].attrs
    assert body.args[0].checked_type == f.body.args[0].checked_type


def _conv_then(then, bias_shape=(4,)):
    x, w, b = var("x", shape=(2, 3, 6, 6)), var("w", shape=(4, 3, 3, 3)), var("b", shape=bias_shape)
    return Function([x, w, b], then(op.nn.conv2d(x, w), b))


@pytest.mark.parametrize("why, f", [
    ("the convolution is used twice", _conv_then(lambda c, b: op.multiply(op.add(c, op.reshape(b, (-1, 1, 1))), c))),
    ("the bias is on the width", _conv_then(lambda c, b: op.add(c, b))),
    ("the bias is per position", _conv_then(lambda c, b: op.add(c, op.reshape(b, (1, 4, 4))), bias_shape=(16,))),
    ("bias_add on another axis", _conv_then(lambda c, b: op.nn.bias_add(c, b, axis=3))),
])
def test_other_sums_with_a_convolution_stay_as_written(why, f):
    assert fuse_bias_adds(*_typed(f)) is f.body, why


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("x_shape, w_shape, kw", [
    ((2, 3, 6, 6), (4, 3, 3, 3), dict(padding=(1, 1, 1, 1))),
    ((2, 4, 7, 7), (4, 1, 3, 3), dict(strides=(2, 2), groups=4)),  # depthwise
    ((3, 4, 1, 1), (5, 4, 3, 3), dict(padding=(1, 1, 1, 1))),  # one tap
    ((16, 32, 16, 16), (64, 32, 3, 3), dict(padding=(1, 1, 1, 1))),  # channels-last on torch
])
def test_conv2d_bias_results_are_the_convolution_plus_the_bias(target, x_shape, w_shape, kw):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    x, w, b = var("x", shape=x_shape), var("w", shape=w_shape), var("b", shape=(w_shape[0],))
    f = Function([x, w, b], op.tanh(op.add(op.nn.conv2d(x, w, **kw), op.reshape(b, (-1, 1, 1)))))
    exe = pb.build(IRModule.from_expr(f), target=target)
    assert "nn.conv2d_bias" in exe["main"].plan.dump()
    rng = np.random.default_rng(3)
    xv, wv, bv = (rng.standard_normal(s).astype("float32") for s in (x_shape, w_shape, (w_shape[0],)))
    keep = [a.copy() for a in (xv, wv, bv)]
    got = np.asarray(exe["main"](xv, wv, bv))
    x64, w64 = var("x", shape=x_shape, dtype="float64"), var("w", shape=w_shape, dtype="float64")
    plain = IRModule.from_expr(Function([x64, w64], op.nn.conv2d(x64, w64, **kw)))
    want = np.tanh(pb.build(plain, target="numpy")["main"](xv.astype("float64"), wv.astype("float64")) + bv[:, None, None])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    for a, k in zip((xv, wv, bv), keep):
        np.testing.assert_array_equal(a, k)


# ---------------------------------------------------------------- stop_gradient


def _saved_statistics():
    """A batch norm's shape of forward: its statistics saved (under stop_gradient, twice over one of them) beside
    the result, and a parameter returned under stop_gradient."""
    x, w = var("x", shape=(4, 3)), var("w", shape=(3,))
    m = op.mean(x, axis=0)
    y = op.multiply(op.subtract(x, m), w)
    sg = op.stop_gradient
    return Function([x, w], Tuple([y, sg(m), sg(sg(op.exp(m))), sg(w)])), x, w


def test_stop_gradients_are_read_as_their_operand():
    f, x, w = _saved_statistics()
    spans = {v: v.span for v in (x, w)}
    body = drop_stop_gradients(*_typed(f))
    assert "stop_gradient" not in _ops(body)
    _, m, e, w2 = body.fields
    assert w2 is w and m.op.name == "mean" and e.op.name == "exp"
    assert body.checked_type == f.body.checked_type
    assert "stop_gradient" in _ops(f.body) and all(v.span == s for v, s in spans.items())  # the input unchanged
    assert drop_stop_gradients(body, post_order(body)) is body


@pytest.mark.parametrize("target", TARGETS)
def test_results_with_stop_gradients_dropped_are_those_written(target):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    f, _, _ = _saved_statistics()
    exe = pb.build(IRModule.from_expr(f), target=target)
    assert "stop_gradient" not in exe["main"].plan.dump()
    rng = np.random.default_rng(5)
    xv, wv = rng.standard_normal((4, 3)).astype("float32"), rng.standard_normal(3).astype("float32")
    y, m, e, w = (np.asarray(r) for r in exe["main"](xv, wv))
    np.testing.assert_allclose(m, xv.mean(0), rtol=1e-6)
    np.testing.assert_allclose(e, np.exp(xv.mean(0)), rtol=1e-6)
    np.testing.assert_allclose(y, (xv - xv.mean(0)) * wv, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w, wv)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("both", [True, False])
def test_a_dense_of_transposed_matrices_is_one_matmul(target, both):
    """``dense(transpose(g), transpose(x))`` (a weight gradient) runs as ``matmul(g, x, transpose_a=True)``, no
    transpose left; ``dense(transpose(g), w)`` as ``matmul(g, w, transpose_a=True, transpose_b=True)``; the
    results are the body's as written; a dense of untransposed data is left as it is."""
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    g, x, w = var("g", shape=(12, 4)), var("x", shape=(12, 5)), var("w", shape=(5, 12))
    f = Function([g, x, w], op.nn.dense(op.transpose(g, (1, 0)), op.transpose(x, (1, 0)) if both else w))
    body = fold_gemm_transposes(*_typed(f))
    assert _ops(body) == ["nn.matmul"], _ops(body)
    assert (body.attrs.transpose_a, body.attrs.transpose_b) == (True, not both)
    assert body.args[0] is g and body.args[1] is (x if both else w)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(v.type_annotation.shape).astype("float32") for v in (g, x, w)]
    got = np.asarray(pb.build(f, target=target)["main"](*args))
    want = args[0].T @ (args[1] if both else args[2].T)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    v = var("v", shape=(4, 7))
    plain = Function([g, v], op.nn.dense(g, op.transpose(v, (1, 0))))
    assert fold_gemm_transposes(*_typed(plain)) is plain.body
