"""Linear-algebra operators (trilu, cholesky, solve_triangular, solve, inv, slogdet, matrix_exp, eigh, svd, pinv,
qr): forward and vjp against
PyTorch, gradient rules against finite differences, second order, kernels on every namespace.

``cholesky`` and ``eigh`` read the lower triangle of a matrix that is symmetric by contract, and their rules
(PyTorch's) give the gradient for symmetric perturbations: finite differences of single entries see a
different derivative, so their rules are checked through ``x -> op(x x^T + n I)``, where both agree.
"""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.analysis import infer_expr
from pullback.ir.errors import ExecutionError, TypeInferenceError
from pullback.ir.types import TensorType
from pullback.testing import check_grad, check_second_order

from namespaces import check_namespaces
from opgrad import case, check_ad, check_rule, check_second, dtype_check, torch_check

RNG = np.random.default_rng(11)


def well_conditioned(*shape):
    """Random square matrices with a dominant diagonal (condition numbers near 1)."""
    n = shape[-1]
    return RNG.standard_normal(shape) + 2 * n ** 0.5 * np.eye(n)


def spd(*shape):
    x = RNG.standard_normal(shape)
    return x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1])


def normal(*shape):
    return RNG.standard_normal(shape)


def L(name, *a, **k):  # torch.linalg by name, resolved lazily
    def f(*xs):
        import torch

        return getattr(torch.linalg, name)(*xs, *a, **k)

    return f


def eigh_canonical(a):
    """torch's eigh with pullback's eigenvector signs (the sign flip is piecewise constant: autograd passes it)."""
    import array_api_compat.torch as xp
    import torch

    from pullback.ops.linalg import canonical_signs

    w, v = torch.linalg.eigh(a)
    return w, canonical_signs(xp, v)


def svd_canonical(a):
    import array_api_compat.torch as xp
    import torch

    from pullback.ops.linalg import _column_signs

    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    signs = _column_signs(xp, u).detach()
    return u * signs, s, vh * signs.mT


def tril(k=0):
    return lambda x: __import__("torch").tril(x, k)


def triu(k=0):
    return lambda x: __import__("torch").triu(x, k)


CASES = [
    case("trilu", normal(3, 4), attrs=dict(k=0, upper=False), torch=tril()),
    case("trilu", normal(2, 4, 3), attrs=dict(k=1, upper=True), torch=triu(1), id="triu-k1"),
    case("trilu", normal(4, 4), attrs=dict(k=-1, upper=False), torch=tril(-1), id="tril-k-1"),
    case("solve_triangular", well_conditioned(4, 4), normal(4, 3), attrs=dict(upper=False),
         torch=L("solve_triangular", upper=False)),
    case("solve_triangular", well_conditioned(2, 3, 3), normal(2, 3, 2), attrs=dict(upper=True),
         torch=L("solve_triangular", upper=True), id="solve_triangular-upper-batched"),
    case("solve_triangular", well_conditioned(3, 3), normal(2, 3), attrs=dict(upper=True, left=False),
         torch=L("solve_triangular", upper=True, left=False), id="solve_triangular-right"),
    case("solve_triangular", well_conditioned(3, 3), normal(3, 2), attrs=dict(upper=False, unitriangular=True),
         torch=L("solve_triangular", upper=False, unitriangular=True), id="solve_triangular-unit"),
    case("solve_triangular", well_conditioned(2, 3, 3), normal(2, 2, 3), attrs=dict(upper=True, left=False, unitriangular=True),
         torch=L("solve_triangular", upper=True, left=False, unitriangular=True), id="solve_triangular-right-unit-upper"),
    case("solve", well_conditioned(4, 4), normal(4, 2), torch=L("solve")),
    case("solve", well_conditioned(2, 3, 3), normal(2, 3, 3), torch=L("solve"), id="solve-batched"),
    case("solve", well_conditioned(2, 1, 3, 3), normal(2, 1, 3, 1), torch=L("solve"), id="solve-two-batch-axes"),
    case("inv", well_conditioned(4, 4), torch=L("inv")),
    case("inv", well_conditioned(2, 2, 3, 3), torch=L("inv"), id="inv-two-batch-axes"),
    case("inv", np.zeros((1, 1, 0, 0)), torch=L("inv"), fd=False, id="inv-empty-matrices"),  # no entries to perturb
    case("solve", np.zeros((2, 0, 3, 3)) + np.eye(3), normal(2, 0, 3, 1), torch=L("solve"), fd=False, id="solve-empty-batch"),
    case("slogdet", well_conditioned(4, 4), torch=L("slogdet")),
    case("slogdet", -well_conditioned(3, 3, 3), torch=L("slogdet"), id="slogdet-negative-batched"),
    case("matrix_exp", normal(4, 4) * 0.5, torch=L("matrix_exp")),
    case("matrix_exp", normal(2, 3, 3), torch=L("matrix_exp"), id="matrix_exp-batched"),
    case("eigh", spd(4, 4), torch=eigh_canonical, fd=False),
    case("eigh", spd(2, 3, 3) - 4 * np.eye(3), torch=eigh_canonical, fd=False, id="eigh-batched-indefinite"),
    case("svd", normal(4, 4), torch=svd_canonical),
    case("svd", normal(2, 5, 3), torch=svd_canonical, id="svd-tall-batched"),
    case("svd", normal(3, 5), torch=svd_canonical, id="svd-wide"),
    case("pinv", normal(4, 4), torch=L("pinv")),
    case("pinv", normal(2, 5, 3), torch=L("pinv"), id="pinv-tall-batched"),
    case("pinv", normal(3, 5), torch=L("pinv"), id="pinv-wide"),
    # pinv jumps where the rank changes: at a rank-deficient matrix, or with singular values cut by the
    # tolerances, finite differences leave the constant-rank set that PyTorch's rule differentiates along
    case("pinv", normal(4, 2) @ normal(2, 5), torch=L("pinv"), fd=False, id="pinv-rank-2"),
    case("pinv", normal(3, 4), attrs=dict(atol=0.5, rtol=0.1), torch=L("pinv", atol=0.5, rtol=0.1), fd=False,
         id="pinv-tolerances"),
    case("qr", normal(4, 4), torch=L("qr")),
    case("qr", normal(2, 5, 3), torch=L("qr"), id="qr-tall-batched"),
    case("qr", normal(3, 5), torch=L("qr"), id="qr-wide"),
    case("qr", normal(2, 2, 4), torch=L("qr"), id="qr-wide-batched"),
    case("cholesky", spd(4, 4), torch=L("cholesky"), fd=False),
    case("cholesky", spd(2, 3, 3), torch=L("cholesky"), fd=False, id="cholesky-batched"),
]
DIFF = [c for c in CASES if c.fd]


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_forward_and_vjp_match_torch(c):
    pytest.importorskip("torch")
    torch_check(c)


@pytest.mark.parametrize("c", DIFF, ids=repr)
def test_gradient_rule_matches_finite_differences(c):
    check_rule(c)


@pytest.mark.parametrize("c", DIFF, ids=repr)
def test_ad_pass_gradient(c):
    check_ad(c)


@pytest.mark.parametrize("c", [c for c in DIFF if c.op != "trilu"], ids=repr)
def test_second_order(c):
    check_second(c)


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_kernel_returns_inferred_dtype(c):
    dtype_check(c, "float32")


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_kernel_on_every_namespace(c):
    check_namespaces(c)


def _through_spd(build, shape):
    """``x -> build(x x^T + n I)`` as a Function of ``x`` (a symmetric positive-definite argument)."""
    x = pullback.var("x", TensorType(shape, "float64"))
    n = shape[-1]
    a = op.add(op.nn.batch_matmul(x, x) if len(shape) == 3 else op.nn.matmul(x, x, transpose_b=True),
               pullback.const(n * np.eye(n)))
    return pullback.Function([x], build(a))


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3)])
def test_cholesky_gradient_through_a_symmetric_argument(shape):
    fn = _through_spd(op.cholesky, shape)
    x = RNG.standard_normal(shape)
    check_grad(fn, [x], rtol=1e-6, atol=1e-7)
    check_second_order(fn, [x], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3)])
def test_eigh_gradient_through_a_symmetric_argument(shape):
    """Eigenvalues and eigenvectors (through a cotangent on both) of ``x x^T + n I``; second order too."""
    fn = _through_spd(op.eigh, shape)
    x = RNG.standard_normal(shape)
    check_grad(fn, [x], rtol=1e-6, atol=1e-7)
    check_second_order(fn, [x], rtol=1e-5, atol=1e-6)


def test_gaussian_log_likelihood_by_cholesky_matches_torch():
    """A multivariate normal's log-density through cholesky, solve_triangular and the log of the diagonal:
    value and gradient equal torch.distributions.MultivariateNormal's."""
    torch = pytest.importorskip("torch")
    n = 4
    x = pullback.var("x", TensorType((n, n), "float64"))
    y = pullback.var("y", TensorType((n, 3), "float64"))
    cov = op.add(op.nn.matmul(x, x, transpose_b=True), pullback.const(np.eye(n)))
    low = op.cholesky(cov)
    z = op.solve_triangular(low, y, upper=False)
    half_logdet = op.sum(op.log(op.sum(op.multiply(low, pullback.const(np.eye(n))), axis=1)))
    nll = op.add(op.multiply(op.sum(op.multiply(z, z)), 0.5), op.multiply(half_logdet, 3.0))
    fn = pullback.Function([x, y], nll)
    xv, yv = RNG.standard_normal((n, n)), RNG.standard_normal((n, 3))
    check_grad(fn, [xv, yv], rtol=1e-6, atol=1e-7)

    from pullback.transform import FirstOrderGradient
    from pullback.runtime import build

    mod = FirstOrderGradient()(pullback.IRModule.from_expr(fn))
    value, (gx, gy) = build(mod)["main_grad"](xv, yv)
    tx, ty = torch.tensor(xv, requires_grad=True), torch.tensor(yv, requires_grad=True)
    dist = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=torch.float64),
                                                  tx @ tx.T + torch.eye(n, dtype=torch.float64))
    want = -(dist.log_prob(ty.T).sum() + 3 * n / 2 * np.log(2 * np.pi))
    want.backward()
    np.testing.assert_allclose(value, want.item(), rtol=1e-12)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gy, ty.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_errors_name_the_op_and_shapes():
    m = pullback.var("m", TensorType((3, 4), "float32"))
    sq = pullback.var("a", TensorType((3, 3), "float32"))
    for expr, pattern in [
        (op.cholesky(m), "cholesky.*square matrices, got 3x4"),
        (op.inv(pullback.var("v", TensorType((3,), "float32"))), "inv.*rank 2 or more"),
        (op.solve(sq, pullback.var("b", TensorType((4, 2), "float32"))), "solve.*b has 4 rows where a is 3x3"),
        (op.solve(sq, pullback.var("b", TensorType((2, 3, 2), "float32"))), "solve.*same batch axes"),
        (op.solve_triangular(sq, pullback.var("b", TensorType((2, 4), "float32")), left=False),
         "solve_triangular.*b has 4 columns"),
        (op.slogdet(pullback.var("h", TensorType((3, 3), "float16"))), "slogdet.*float32 or float64, got float16"),
        (op.solve(sq, pullback.var("b", TensorType((3, 2), "float64"))), "solve.*dtypes differ"),
    ]:
        with pytest.raises(TypeInferenceError, match=pattern):
            infer_expr(expr)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_a_matrix_that_is_not_positive_definite_is_an_execution_error(target):
    if target == "torch":
        pytest.importorskip("torch")
    from pullback.runtime import build

    a = pullback.var("a", TensorType((2, 2), "float64"))
    run = build(pullback.IRModule.from_expr(pullback.Function([a], op.cholesky(a))), target=target)["main"]
    with pytest.raises(ExecutionError, match="cholesky"):
        run(np.array([[1.0, 2.0], [2.0, 1.0]]))


# OpenBLAS's SVD (NumPy's) never returned on this matrix (both infinities in one batch element); eager PyTorch
# refuses a non-finite matrix with "failed to converge because the input matrix contained non-finite values"
_BOTH_INFINITIES = np.array([[-np.inf, -1.91564556, np.inf], [-0.32990407, -0.88064652, -0.65628501],
                             [-0.67201468, 0.38018909, -0.1100587], [1.48257116, -1.82960402, -0.00308096],
                             [-0.89205579, 0.77587185, -2.11806004]])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("name", ["svd", "pinv"])
@pytest.mark.parametrize("bad", ["both infinities", "nan"])
def test_svd_of_a_non_finite_matrix_is_an_execution_error_on_every_target(name, target, bad):
    if target != "numpy":
        pytest.importorskip(target)
    from pullback.runtime import build

    data = _BOTH_INFINITIES.copy() if bad != "nan" else np.where(np.eye(5, 3) > 0, np.nan, _BOTH_INFINITIES.clip(-1, 1))
    a = pullback.var("a", TensorType((2, 5, 3), "float64"))
    body = op.pinv(a) if name == "pinv" else op.svd(a)[1]
    run = build(pullback.IRModule.from_expr(pullback.Function([a], body)), target=target)["main"]
    batch = np.stack([np.ones((5, 3)) + np.eye(5, 3), data])
    with pytest.raises(ExecutionError, match=f"{name}: the input matrix contains non-finite values"):
        run(batch)
    np.testing.assert_allclose(run(batch[:1].repeat(2, 0)).shape, body.checked_type.shape)  # finite: runs
