"""Complex tensors and Fourier transforms: forward and vector-Jacobian products against PyTorch (complex64 /
complex128 results, PyTorch's conjugate convention), gradient rules against finite differences over the real and
imaginary parts, every namespace, and the errors of bad input."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.analysis import infer_expr
from pullback.ir.errors import AttrError, TypeInferenceError

from namespaces import check_namespaces
from opgrad import case, check_ad, check_rule, dtype_check, torch_check

RNG = np.random.default_rng(11)


def _c(*shape):
    return RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)


Z, W, ROW = _c(3, 4), _c(3, 4), _c(4)
X8, X7 = RNG.standard_normal((3, 8)), RNG.standard_normal((3, 7))
HALF5, GRID = _c(3, 5), _c(4, 5)


def aten(name, *args):
    def f(*xs):
        import torch

        return getattr(torch.ops.aten, name)(*xs, *args)

    return f


def T(name):
    def f(*xs):
        import torch

        return getattr(torch, name)(*xs)

    return f


def _view_as_complex(x):
    import torch

    return torch.view_as_complex(x)


CASES = [
    case("view_as_real", Z, torch=T("view_as_real")),
    case("view_as_complex", RNG.standard_normal((3, 4, 2)), torch=_view_as_complex),
    case("conj", Z, torch=T("conj_physical")),
    case("complex_abs", Z, torch=T("abs")),
    case("add", Z, ROW, torch=T("add"), id="add-complex"),
    case("subtract", Z, W, torch=T("sub"), id="subtract-complex"),
    case("multiply", Z, ROW, torch=T("mul"), id="multiply-complex-broadcast"),
    case("divide", Z, W, torch=T("div"), id="divide-complex"),
    case("negative", Z, torch=T("neg"), id="negative-complex"),
    case("cast", Z, attrs={"dtype": "float64"}, torch=lambda z: z.real, id="cast-complex-to-real"),
    case("cast", X8, attrs={"dtype": "complex128"}, torch=lambda x: x.to(dtype=__import__("torch").complex128),
         id="cast-real-to-complex"),
    case("nn.batch_matmul", _c(2, 3, 4), _c(2, 4, 5), attrs={"transpose_b": False}, torch=T("bmm"),
         id="batch_matmul-complex"),
    case("nn.matmul", _c(4, 3), _c(5, 4), attrs={"transpose_a": True, "transpose_b": True},
         torch=lambda a, b: a.T @ b.T, id="matmul-complex-transposed"),
    case("sum", Z, attrs={"axis": (1,)}, torch=lambda z: z.sum(1), id="sum-complex"),
    case("transpose", Z, attrs={"axes": (1, 0)}, torch=lambda z: z.T, id="transpose-complex"),
    case("fft_r2c", X8, args=((1,), 0, True), torch=aten("_fft_r2c", [1], 0, True), id="r2c-onesided-even"),
    case("fft_r2c", X7, args=((1,), 1, True), torch=aten("_fft_r2c", [1], 1, True), id="r2c-onesided-odd-ortho"),
    case("fft_r2c", X8, args=((0, 1), 2, False), torch=aten("_fft_r2c", [0, 1], 2, False), id="r2c-full-2d"),
    case("fft_r2c", X7, args=((1, 0), 0, True), torch=aten("_fft_r2c", [1, 0], 0, True), id="r2c-onesided-axis0-last"),
    case("fft_c2r", HALF5, args=((1,), 0, 8), torch=aten("_fft_c2r", [1], 0, 8), id="c2r-even"),
    case("fft_c2r", HALF5, args=((1,), 2, 9), torch=aten("_fft_c2r", [1], 2, 9), id="c2r-odd"),
    case("fft_c2r", GRID, args=((0, 1), 1, 8), torch=aten("_fft_c2r", [0, 1], 1, 8), id="c2r-2d"),
    case("fft_c2c", Z, args=((1,), 0, True), torch=aten("_fft_c2c", [1], 0, True), id="c2c-forward"),
    case("fft_c2c", Z, args=((0, 1), 2, False), torch=aten("_fft_c2c", [0, 1], 2, False), id="c2c-inverse-2d"),
]


def _complex64_kernels(c):
    dtype_check(c, "float32")  # complex inputs in complex64


CHECKS = {"torch": torch_check, "rule-vs-fd": check_rule, "ad-vs-fd": check_ad, "dtype": _complex64_kernels,
          "namespaces": check_namespaces}


@pytest.mark.parametrize("check", list(CHECKS.values()), ids=list(CHECKS))
@pytest.mark.parametrize("c", CASES, ids=repr)
def test_case(c, check):
    """Forward and vjp equal PyTorch's, the rule and the AD pass equal finite differences, kernels return the
    inferred dtype in complex64 and give NumPy's result on every namespace."""
    pytest.importorskip("torch")
    check(c)


def test_abs_gradient_is_zero_at_zero_as_in_pytorch():
    z = np.array([0j, 3 + 4j])
    x = pullback.var("z", shape=(2,), dtype="complex128")
    mod = pullback.transform.FirstOrderGradient()(pullback.IRModule.from_expr(pullback.Function([x], op.sum(op.complex_abs(x)))))
    _, (g,) = pullback.build(mod)["main_grad"](z)
    np.testing.assert_allclose(g, [0, 0.6 + 0.8j])


def test_a_spectral_filter_trains_through_every_target():
    """rfft -> complex weights -> irfft: value and gradients on numpy, jax and torch equal to autograd."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    x = pullback.var("x", shape=(2, 16), dtype="float32")
    wr = pullback.var("w", shape=(9, 2), dtype="float32")
    spec = op.multiply(op.fft_r2c(x, (1,), 1, True), op.view_as_complex(wr))
    loss = op.sum(op.square(op.fft_c2r(spec, (1,), 1, 16)))
    mod = pullback.transform.FirstOrderGradient()(pullback.IRModule.from_expr(pullback.Function([x, wr], loss)))
    xv, wv = RNG.standard_normal((2, 16)).astype("float32"), RNG.standard_normal((9, 2)).astype("float32")
    xt, wt = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    ref = torch.fft.irfft(torch.fft.rfft(xt, norm="ortho") * torch.view_as_complex(wt), n=16, norm="ortho").square().sum()
    ref.backward()
    for target in ("numpy", "jax", "torch"):
        args = (xv, wv) if target != "torch" else (torch.tensor(xv), torch.tensor(wv))
        value, (dx, dw) = pullback.build(mod, target=target)["main_grad"](*args)
        np.testing.assert_allclose(np.asarray(value), ref.item(), rtol=1e-5, err_msg=target)
        np.testing.assert_allclose(np.asarray(dx), xt.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=target)
        np.testing.assert_allclose(np.asarray(dw), wt.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=target)


def test_complex_types_and_constants_round_trip_the_text_format():
    z = pullback.var("z", shape=(2,), dtype="complex64")
    body = op.multiply(z, pullback.const(np.array([1 + 2j, -0.5j], dtype="complex64")))
    mod = pullback.IRModule.from_expr(pullback.Function([z], op.view_as_real(body)))
    text = pullback.astext(mod)
    assert "complex64" in text
    back = pullback.parse(text)
    assert pullback.structural_equal(back, mod)
    zv = np.array([1 - 1j, 2 + 0.5j], dtype="complex64")
    np.testing.assert_array_equal(pullback.build(back)["main"](zv), pullback.build(mod)["main"](zv))


def test_errors_name_the_op_and_the_problem():
    x = pullback.var("x", shape=(3, 8))
    z = pullback.var("z", shape=(3, 5), dtype="complex64")
    i = pullback.var("i", shape=(3, 8), dtype="int32")
    for e, pattern in [
        (op.view_as_real(x), "view_as_real: argument 0 must be a complex tensor, got float32"),
        (op.view_as_complex(x), "view_as_complex: the last axis must have size 2"),
        (op.fft_r2c(i, (1,)), "fft_r2c: argument 0 must be a float32 or float64 tensor, got int32"),
        (op.fft_c2r(z, (1,), 0, 12), "fft_c2r: axis 1 holds 5 entries; a one-sided spectrum of last_size=12 holds 7"),
        (op.fft_c2c(z, (2,)), "fft_c2c: axis 2 is out of range"),
        (op.fft_c2c(z, (1, -1)), "fft_c2c: repeated axis in \\(1, -1\\)"),
        (op.maximum(z, z), "maximum: argument 0 is a complex64 tensor; maximum takes no complex tensors"),
        (op.add(z, x), "add: .*dtypes differ"),
        (op.exp(z), "exp: argument 0 is a complex64 tensor; exp takes no complex tensors"),
        (op.nn.dense(z, z), "nn.dense: argument 0 is a complex64 tensor; nn.dense takes no complex tensors"),
    ]:
        with pytest.raises(TypeInferenceError, match=pattern):
            infer_expr(e)
    with pytest.raises(AttrError, match="normalization must be 0"):
        op.fft_r2c(x, (1,), 3)
    with pytest.raises(AttrError, match="axes must name at least one axis"):
        op.fft_c2c(z, ())
    with pytest.raises(pullback.PullbackError, match="float32 holds real numbers"):
        pullback.const(1j, "float32")


def _cx(v):
    return pullback.const(np.array(v, dtype="complex64"))


CLEANUP_CASES = {
    "times-one": lambda z: op.multiply(z, _cx(1)), "times-zero": lambda z: op.multiply(z, _cx(0)),
    "plus-zero": lambda z: op.add(z, _cx(0)), "over-imaginary": lambda z: op.divide(z, _cx(2j)),
    "self-difference": lambda z: op.subtract(z, z), "constant-chain": lambda z: op.multiply(op.multiply(z, _cx(2)), _cx(3j)),
    "double-negation": lambda z: op.negative(op.negative(z)), "double-conj": lambda z: op.conj(op.conj(z)),
    "repeated-term": lambda z: op.add(op.multiply(z, _cx(2)), op.multiply(z, _cx(2))),
    "cast-round-trip": lambda z: op.cast(op.cast(z, "complex128"), "complex64"),
    "view-round-trip": lambda z: op.view_as_complex(op.view_as_real(z)),
    "fft-round-trip": lambda z: op.fft_c2c(op.fft_c2c(z, (0,), 2, True), (0,), 0, False),
}


@pytest.mark.parametrize("build", list(CLEANUP_CASES.values()), ids=list(CLEANUP_CASES))
def test_cleanup_and_fusion_keep_complex_values_and_gradients(build):
    """standard_cleanup's algebra (x*1, x*0, x-x, constant chains, CSE) and FuseOps on complex programs: the same
    values, and the same gradient of ``sum(|f(z)|)``."""
    z = pullback.var("z", shape=(3,), dtype="complex64")
    zv = np.array([1 + 2j, -0.5j, 3], dtype="complex64")
    mod = pullback.IRModule.from_expr(pullback.Function([z], build(z)))
    clean = pullback.transform.FuseOps()(pullback.transform.standard_cleanup()(mod))
    np.testing.assert_allclose(pullback.build(clean)["main"](zv), pullback.build(mod)["main"](zv), rtol=1e-6, atol=1e-6)
    loss = pullback.IRModule.from_expr(pullback.Function([z], op.sum(op.complex_abs(build(z)))))
    grad = pullback.transform.FirstOrderGradient()(loss)
    want = pullback.build(grad)["main_grad"](zv)[1][0]
    got = pullback.build(pullback.transform.standard_cleanup()(grad))["main_grad"](zv)[1][0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
