"""ATen linear-algebra converters: ``torch.linalg``'s Cholesky, triangular and general solves, inverse, (log-)
determinants, ``eigh``, ``svd``, ``pinv``, ``qr``, ``matrix_exp``, ``householder_product``, ``torch.cholesky_solve``,
``torch.tril``/``triu`` (Gaussian processes, normalizing flows, orthogonal parametrizations, spectral losses).

The ``*_ex`` overloads also return LAPACK's ``info`` (0 on success): torch.export checks it with
``aten._linalg_check_errors``, an operator threaded through an effect token. pullback's kernels raise on the
numpy and torch targets where the check would (a singular matrix, one that is not positive definite), and
give NaN on jax as ``jax.numpy.linalg`` does, so ``info`` is a zero and the check is dropped. The factors
``LU`` and ``pivots`` that autograd saves are not converted (a program that reads them is refused).
"""

from __future__ import annotations

import numpy as np

from ..ir.errors import PullbackError
from ..ir.expr import Expr, TupleGetItem, const
from ..ops.common import broadcast_shapes
from ..ops.linalg import mT, mm
from .aten_table import _op, as_dtype, aten, expand_to, scalar, static

CHECK_ERRORS = "aten._linalg_check_errors.default"


class EffectToken:
    """The value of torch.export's effect token: threaded through the (dropped) error checks, never computed."""


TOKEN = EffectToken()


@aten("with_effects")
def _with_effects(cx, token, target, *args, **kwargs):
    if str(target) != CHECK_ERRORS:
        raise PullbackError(f"{target} has side effects, which pullback does not convert")
    return [token]


def _info(cx, a: Expr) -> Expr:
    """LAPACK's ``info`` for each matrix of ``a``: 0 (the kernels raise where it would not be)."""
    return const(np.zeros(tuple(cx.shape_of(a))[:-2], dtype="int32"))


def _same_batch(cx, a: Expr, b: Expr) -> tuple:
    """``a`` and ``b`` with their batch axes broadcast against each other (the operators take equal ones)."""
    sa, sb = tuple(cx.shape_of(a)), tuple(cx.shape_of(b))
    batch = broadcast_shapes("linalg", (), sa[:-2], sb[:-2])
    return expand_to(cx, a, batch + sa[-2:]), expand_to(cx, b, batch + sb[-2:])


@aten("aten.tril.default", "aten.triu.default")
def _trilu(cx, x, diagonal=0):
    return _op("trilu")(x, int(diagonal), str(cx.node.target) == "aten.triu.default")


@aten("aten.cholesky.default")
def _cholesky(cx, a, upper=False):
    low = _op("cholesky")(a)
    return mT(low) if upper else low


@aten("aten.linalg_cholesky_ex.default")
def _cholesky_ex(cx, a, upper=False, check_errors=False):
    return [_cholesky(cx, a, upper), _info(cx, a)]


@aten("aten.linalg_solve_triangular.default")
def _solve_triangular(cx, a, b, upper, left=True, unitriangular=False):
    a, b = _same_batch(cx, a, b)
    return _op("solve_triangular")(a, b, upper=bool(upper), left=bool(left), unitriangular=bool(unitriangular))


@aten("aten.triangular_solve.default")
def _triangular_solve(cx, b, a, upper=True, transpose=False, unitriangular=False):
    """The deprecated ``torch.triangular_solve``: ``(A^-1 B or A^-T B, A)``."""
    a2, b2 = _same_batch(cx, a, b)
    if transpose:
        a2, upper = mT(a2), not upper
    return [_op("solve_triangular")(a2, b2, upper=bool(upper), unitriangular=bool(unitriangular)), a]


@aten("aten.cholesky_solve.default")
def _cholesky_solve(cx, b, factor, upper=False):
    """``A^-1 B`` for ``A = L L^T`` (``U^T U`` when ``upper``): two triangular solves."""
    factor, b = _same_batch(cx, factor, b)
    low = mT(factor) if upper else factor
    y = _op("solve_triangular")(low, b, upper=False)
    return _op("solve_triangular")(mT(low), y, upper=True)


@aten("aten.cholesky_inverse.default")
def _cholesky_inverse(cx, factor, upper=False):
    """``(L L^T)^-1`` (``(U^T U)^-1`` when ``upper``)."""
    n = cx.shape_of(factor)[-1]
    return _cholesky_solve(cx, const(np.eye(n, dtype=cx.dtype_of(factor))), factor, upper)


def _is_vector_rhs(cx, a: Expr, b: Expr) -> bool:
    """PyTorch's rule: ``B`` is a (batch of) vector(s) when it is 1-D or has ``A``'s shape without the last axis."""
    sa, sb = tuple(cx.shape_of(a)), tuple(cx.shape_of(b))
    return len(sb) == 1 or (len(sb) == len(sa) - 1 and sb == sa[:-1])


@aten("aten._linalg_solve_ex.default")
def _solve_ex(cx, a, b, left=True, check_errors=False):
    vector = _is_vector_rhs(cx, a, b)
    if vector:
        b = _op("expand_dims")(b, -1)
    if not left:  # X A = B  <=>  A^T X^T = B^T
        a, b = mT(a), mT(b)
    a, b = _same_batch(cx, a, b)
    x = _op("solve")(a, b)
    if not left:
        x = mT(x)
    if vector:
        x = _op("squeeze")(x, (-1,))
    return [x, None, None, _info(cx, a)]


@aten("aten.linalg_inv_ex.default")
def _inv_ex(cx, a, check_errors=False):
    return [_op("inv")(a), _info(cx, a)]


@aten("aten._linalg_slogdet.default")
def _slogdet(cx, a):
    s = _op("slogdet")(a)
    return [TupleGetItem(s, 0), TupleGetItem(s, 1), None, None]


@aten("aten.linalg_matrix_exp.default")
def _matrix_exp(cx, a):
    return _op("matrix_exp")(a)


@aten("aten.linalg_householder_product.default")
def _householder_product(cx, a, tau):
    """``H_1 ... H_k`` (its first ``n`` columns), ``H_i = I - tau_i v_i v_i^T`` with ``v_i`` column ``i`` of
    ``a`` below the diagonal and 1 on it (LAPACK's ``orgqr``; the orthogonal parametrization's
    ``householder`` map): one rank-one update per reflector, so gradients come from the elementwise rules."""
    shape = static(cx, "householder_product", cx.shape_of(a))
    (m, n), k, dt = shape[-2:], cx.shape_of(tau)[-1], cx.dtype_of(a)
    q: Expr = const(np.eye(m, dtype=dt))
    for i in range(k):
        below = np.zeros((m, 1), dtype=dt)
        below[i + 1:] = 1
        unit = np.zeros((m, 1), dtype=dt)
        unit[i] = 1
        col = _op("strided_slice")(a, (i,), (i + 1,), axes=(-1,))
        v = _op("add")(_op("multiply")(col, const(below)), const(unit))  # (..., m, 1)
        vt = mT(v)
        qv = _op("sum")(_op("multiply")(q, vt), (-1,), True)  # Q v, (..., m, 1)
        t = _op("expand_dims")(_op("strided_slice")(tau, (i,), (i + 1,), axes=(-1,)), -1)  # (..., 1, 1)
        q = _op("subtract")(q, _op("multiply")(t, _op("multiply")(qv, vt)))
    if tuple(cx.shape_of(q)) != tuple(shape[:-2]) + (m, m):
        q = expand_to(cx, q, tuple(shape[:-2]) + (m, m))
    return _op("strided_slice")(q, (0,), (n,), axes=(-1,))


@aten("aten._linalg_eigh.default")
def _eigh(cx, a, UPLO="L", compute_v=True):
    """``torch.linalg.eigh``/``eigvalsh``: the eigenvectors' signs are pullback's (``ops.linalg.eigh``)."""
    res = _op("eigh")(a if UPLO == "L" else mT(a))
    return [TupleGetItem(res, 0), TupleGetItem(res, 1) if compute_v else None]


@aten("aten._linalg_svd.default")
def _svd(cx, a, full_matrices=False, compute_uv=True, driver=None):
    """``torch.linalg.svd``/``svdvals`` (and ``matrix_norm``'s 2 and nuclear norms): the reduced factors, their
    signs pullback's (``ops.linalg.svd``)."""
    m, n = cx.shape_of(a)[-2:]
    compute_uv = compute_uv and any(user.args[1] != 1 for user in cx.node.users)  # autograd's factors: unused
    if compute_uv and full_matrices and m != n:
        raise PullbackError(f"svd with full_matrices=True of a {m}x{n} matrix is not supported (the extra singular "
                            "vectors have no gradient): use torch.linalg.svd(A, full_matrices=False)")
    res = _op("svd")(a)
    s = TupleGetItem(res, 1)
    return [TupleGetItem(res, 0), s, TupleGetItem(res, 2)] if compute_uv else [None, s, None]


@aten("aten.linalg_qr.default")
def _qr(cx, a, mode="reduced"):
    """``torch.linalg.qr``: reduced (``complete`` where it is the same, m <= n) or ``r`` alone."""
    m, n = cx.shape_of(a)[-2:]
    if mode == "complete" and m > n:
        raise PullbackError(f"qr with mode='complete' of a {m}x{n} matrix is not supported: use mode='reduced'")
    res = _op("qr")(a)
    return [None if mode == "r" else TupleGetItem(res, 0), TupleGetItem(res, 1)]


@aten("aten.linalg_pinv.atol_rtol_tensor", "aten.linalg_pinv.atol_rtol_float")
def _pinv(cx, a, atol=None, rtol=None, hermitian=False):
    """``V diag(1/s) U^T`` over the singular values above ``max(atol, rtol * s_max)`` (PyTorch's defaults: rtol
    ``eps * max(m, n)`` when neither is given, 0 when only atol is): the ``pinv`` operator, or with tolerances
    given as tensors, through ``svd`` (whose gradient needs distinct singular values)."""
    if not isinstance(atol, Expr) and not isinstance(rtol, Expr):  # the operator, whose gradient is finite at any rank
        return _op("pinv")(a, 0.0 if atol is None else float(atol), None if rtol is None else float(rtol))
    dt = cx.dtype_of(a)
    m, n = cx.shape_of(a)[-2:]
    if 0 in (m, n):
        return _op("zeros")(tuple(cx.out_shape), dt)
    if rtol is None:
        rtol = float(np.finfo(dt).eps) * max(m, n) if atol is None else 0.0

    def per_matrix(t):  # a tolerance of the batch's shape, against each matrix's singular values
        t = as_dtype(cx, t, dt)
        return _op("expand_dims")(t, -1) if cx.ndim_of(t) else t

    res = _op("svd")(a)
    u, sv, vh = (TupleGetItem(res, i) for i in range(3))
    tol = _op("multiply")(_op("max")(sv, (-1,), True), per_matrix(rtol))
    if atol is not None:
        tol = _op("maximum")(tol, per_matrix(atol))
    kept = _op("greater")(sv, tol)
    inv_s = _op("where")(kept, _op("divide")(scalar(1.0, dt), _op("where")(kept, sv, scalar(1.0, dt))), scalar(0.0, dt))
    return mm(_op("multiply")(mT(vh), _op("expand_dims")(inv_s, -2)), u, tb=True)


@aten("aten._linalg_det.default")
def _det(cx, a):
    """``sign * exp(logabsdet)``: 0 for a singular matrix (whose gradient, the adjugate, is not computed)."""
    s = _op("slogdet")(a)
    return [_op("multiply")(TupleGetItem(s, 0), _op("exp")(TupleGetItem(s, 1))), None, None]
