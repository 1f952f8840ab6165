"""Linear algebra: matrix products, triangles, Cholesky, solves, inverses and log-determinants.

``nn.matmul`` (2-D) and ``nn.batch_matmul`` (3-D, batch dim may broadcast from 1) take Relay's
``transpose_a`` / ``transpose_b`` flags (``batch_matmul`` defaults to ``transpose_b=True`` like Relay).
``trilu``, ``cholesky``, ``solve_triangular``, ``solve``, ``inv``, ``slogdet``, ``matrix_exp``, ``eigh``, ``svd``, ``pinv`` and ``qr``
work on stacks of
matrices (``torch.linalg``'s operators). Every gradient is written with these operators, so second
derivatives work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..ir.errors import AttrError, PullbackError
from ..ir.expr import Call, Expr, TupleGetItem, const
from ..ir.types import ALL_DTYPES, Any, TensorType, TupleType
from . import elemwise as E
from . import layout as T
from .common import broadcast_shapes, numel, same_dtype, tensor_arg
from .elemwise import conj_if_complex
from .kernels import as_array, check, device, is_traced
from .nn import check_bool, check_int, field, nonzero, scalar
from .indexing import strided_slice
from .registry import FusionKind, defop, type_error, zero_flops
from .shape import concatenate
from .special import expm


@dataclass(frozen=True)
class MatmulAttrs:
    transpose_a: bool = False
    transpose_b: bool = False

    def __post_init__(self):
        check_bool(self, "transpose_a", "transpose_b")


@dataclass(frozen=True)
class BatchMatmulAttrs(MatmulAttrs):
    transpose_b: bool = True  # Relay's default for batch_matmul


def _mk(rank: int, name: str):
    def infer(arg_types, attrs):
        a, b = tensor_arg(name, arg_types, 0), tensor_arg(name, arg_types, 1)
        same_dtype(name, arg_types)
        if a.ndim != rank or b.ndim != rank:
            raise type_error(name, arg_types, f"expects two tensors of rank {rank}, got ranks {a.ndim} and {b.ndim}")
        m, ka = (a.shape[-1], a.shape[-2]) if attrs.transpose_a else a.shape[-2:]
        kb, n = (b.shape[-1], b.shape[-2]) if attrs.transpose_b else b.shape[-2:]
        if ka is not Any and kb is not Any and ka != kb:
            raise type_error(name, arg_types, f"contraction sizes differ: {ka} (a, transpose_a={attrs.transpose_a}) vs {kb} (b, transpose_b={attrs.transpose_b})")
        batch = broadcast_shapes(name, arg_types, a.shape[:-2], b.shape[:-2])
        return TensorType(batch + (m, n), a.dtype)

    def flops(arg_types, out_type, attrs):
        a = arg_types[0]
        k = a.shape[-2] if attrs.transpose_a else a.shape[-1]
        return 2 * numel(out_type.shape) * (k if isinstance(k, int) else 0)

    return infer, flops


def _matmul(xp, a, b, attrs):
    return xp.matmul(xp.matrix_transpose(a) if attrs.transpose_a else a,
                     xp.matrix_transpose(b) if attrs.transpose_b else b)


def _matmul_grad(call: Call, g: Expr):
    """C = op(A) op(B): dA = g op(B)^T (or op(B) g^T when A is transposed), likewise dB (conjugate transposes
    for complex matrices)."""
    a, b = call.args
    ta, tb = call.attrs.transpose_a, call.attrs.transpose_b
    mm, ca, cb = call.op, conj_if_complex(a), conj_if_complex(b)
    ga = mm(cb, g, tb, True) if ta else mm(g, cb, False, not tb)
    gb = mm(g, ca, True, ta) if tb else mm(ca, g, not ta, False)
    if a.checked_type.ndim == 3:  # batch dims may broadcast
        ga, gb = T.collapse_sum_like(ga, a), T.collapse_sum_like(gb, b)
    return [ga, gb]


_mi, _mf = _mk(2, "nn.matmul")
matmul = defop("nn.matmul", 2, _mi, kernel=_matmul, attrs_type=MatmulAttrs, grad=_matmul_grad,
               pattern=FusionKind.OUT_ELEMWISE_FUSABLE, flops=_mf, torch_name="mm", dtypes=ALL_DTYPES)
_bi, _bf = _mk(3, "nn.batch_matmul")
batch_matmul = defop("nn.batch_matmul", 2, _bi, kernel=_matmul, attrs_type=BatchMatmulAttrs, grad=_matmul_grad,
                     pattern=FusionKind.OUT_ELEMWISE_FUSABLE, flops=_bf, torch_name="bmm", dtypes=ALL_DTYPES)


# ------------------------------------------------------------------ triangles, factorizations and solves
#
# Square matrices in the last two axes, any number of batch axes; an operator with two operands takes them with
# the same batch axes (the importer broadcasts them first). Real floating point (float32/float64): NumPy's
# LAPACK has no half precision. The gradient rules are PyTorch's (FunctionsManual.cpp), written with these
# operators and matrix products, so they have gradients themselves.

LINALG_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class TriluAttrs:
    k: int = 0
    upper: bool = True  # Relay's default

    def __post_init__(self):
        check_int(self, "k")
        check_bool(self, "upper")


def _trilu(xp, x, attrs):
    return xp.triu(x, k=attrs.k) if attrs.upper else xp.tril(x, k=attrs.k)


def _matrices(name: str, arg_types, i: int) -> TensorType:
    """Argument ``i``: a stack of matrices (rank >= 2)."""
    t = tensor_arg(name, arg_types, i)
    if t.ndim < 2:
        raise type_error(name, arg_types, f"argument {i} must have rank 2 or more (a stack of matrices), got rank {t.ndim}")
    return t


def _trilu_infer(arg_types, attrs):
    return _matrices("trilu", arg_types, 0)


trilu = defop("trilu", 1, _trilu_infer, kernel=_trilu, attrs_type=TriluAttrs,
              grad=lambda c, g: [trilu(g, c.attrs.k, c.attrs.upper)], pattern=FusionKind.INJECTIVE,
              flops=zero_flops, torch_name="triu", dtypes=ALL_DTYPES,
              doc="The upper (``upper=True``: entries with ``j - i >= k``) or lower (``j - i <= k``) triangle "
                  "of the last two axes, zeros elsewhere (``torch.triu`` / ``torch.tril``).")


def _float_matrices(name: str, arg_types, i: int = 0) -> TensorType:
    """Argument ``i``: a stack of float32/float64 matrices (LAPACK's precisions)."""
    t = _matrices(name, arg_types, i)
    if t.dtype not in LINALG_DTYPES:
        raise type_error(name, arg_types, f"argument {i} must be float32 or float64, got {t.dtype}")
    return t


def _factored(name: str, arg_types) -> tuple:
    """``(a, batch, m, n, k)`` for a factorization of ``a`` (..., m, n) with ``k = min(m, n)``."""
    a = _float_matrices(name, arg_types)
    *batch, m, n = a.shape
    return a, tuple(batch), m, n, (Any if Any in (m, n) else min(m, n))


def _factor_flops(scale: float):
    """``scale * m n min(m, n)`` per matrix (0 when a size is dynamic)."""
    def flops(ts, out, attrs):
        m, n = ts[0].shape[-2:]
        return 0 if Any in (m, n) else int(scale * _batch(ts[0]) * m * n * min(m, n))
    return flops


def _square(name: str, arg_types, i: int = 0) -> TensorType:
    t = _float_matrices(name, arg_types, i)
    n, m = t.shape[-2:]
    if n is not Any and m is not Any and n != m:
        raise type_error(name, arg_types, f"argument {i} must be a stack of square matrices, got {n}x{m}")
    return t


def _square_infer(name: str):
    def infer(arg_types, attrs):
        return _square(name, arg_types)
    return infer


def _system_infer(name: str):
    """``(a, b)``: ``a`` square (..., n, n), ``b`` (..., n, k) (``left``) or (..., k, n) with a's batch axes."""
    def infer(arg_types, attrs):
        a, b = _square(name, arg_types, 0), _matrices(name, arg_types, 1)
        same_dtype(name, arg_types)
        left = getattr(attrs, "left", True)
        n, rows = a.shape[-1], b.shape[-2] if left else b.shape[-1]
        if n is not Any and rows is not Any and n != rows:
            side = "rows" if left else "columns"
            raise type_error(name, arg_types, f"b has {rows} {side} where a is {n}x{n}")
        if a.ndim != b.ndim or any(p is not Any and q is not Any and p != q for p, q in zip(a.shape[:-2], b.shape[:-2])):
            raise type_error(name, arg_types, f"a and b must have the same batch axes, got {a.shape[:-2]} and {b.shape[:-2]}")
        return b
    return infer


def _batch(t: TensorType) -> int:
    return numel(t.shape[:-2]) if t.ndim > 2 else 1


def _cubic_flops(scale: float):
    return lambda ts, out, attrs: int(scale * _batch(ts[0]) * numel(ts[0].shape[-1:]) ** 3)


def mT(x: Expr) -> Expr:
    """The matrices of ``x`` transposed."""
    r = x.checked_type.ndim
    return T.transpose(x, tuple(range(r - 2)) + (r - 1, r - 2))


def mm(a: Expr, b: Expr, ta: bool = False, tb: bool = False) -> Expr:
    """``op(a) @ op(b)`` for stacks of matrices with the same batch axes (any number of them)."""
    r = a.checked_type.ndim
    if r == 2:
        return matmul(a, b, ta, tb)
    if r == 3:
        return batch_matmul(a, b, ta, tb)
    *batch, m, k = a.checked_type.shape
    k2, n = b.checked_type.shape[-2:]
    if Any in (m, k, k2, n) or batch.count(Any) > 1:
        raise PullbackError(f"a matrix product over {r - 2} batch axes needs static sizes (one dynamic batch axis "
                            f"at most), got {a.checked_type} and {b.checked_type}")
    shape = tuple(-1 if d is Any else d for d in batch) + ((k if ta else m), (k2 if tb else n))
    if 0 in shape + (m, k, n):  # no entries to multiply (reshape would read a 0 as "keep this axis")
        return T.zeros(shape, a.checked_type.dtype)
    out = batch_matmul(T.reshape(a, (-1, m, k)), T.reshape(b, (-1, k2, n)), ta, tb)
    return T.reshape(out, shape)


def _scale_matrices(s: Expr, x: Expr) -> Expr:
    """``x``'s matrices times the scalars ``s`` (``x``'s batch shape)."""
    return E.multiply(T.expand_dims(s, -1, 2), x)


def _cholesky_grad(call: Call, g: Expr):
    """Murray (2016): ``A_bar = sym(L^-T Phi(L^T L_bar) L^-1)``, Phi the lower triangle with half its diagonal."""
    low = call
    p = mm(low, g, ta=True)
    phi = E.multiply(E.add(trilu(p, 0, False), trilu(p, -1, False)), scalar(0.5, low))
    x = solve_triangular(mT(low), phi, upper=True)
    ga = solve_triangular(low, x, upper=False, left=False)
    return [E.multiply(E.add(ga, mT(ga)), scalar(0.5, low))]


def _cholesky_jax(a, attrs=None):
    from jax import lax

    return lax.linalg.cholesky(a, symmetrize_input=False)


cholesky = defop("cholesky", 1, _square_infer("cholesky"), kernel=lambda xp, a, attrs=None: xp.linalg.cholesky(a),
                 impls={"jax": _cholesky_jax}, grad=_cholesky_grad, pattern=FusionKind.OPAQUE,
                 flops=_cubic_flops(1 / 3), torch_name="linalg_cholesky", dtypes=LINALG_DTYPES,
                 doc="The lower Cholesky factor ``L`` of symmetric positive-definite matrices (``A = L L^T``; "
                     "only the lower triangle of ``A`` is read; a matrix that is not positive definite is an "
                     "error on numpy and torch, NaN on jax).")


@dataclass(frozen=True)
class SolveTriangularAttrs:
    upper: bool = False
    left: bool = True
    unitriangular: bool = False

    def __post_init__(self):
        check_bool(self, "upper", "left", "unitriangular")


def _triangle(xp, a, attrs):
    """The triangle of ``a`` that ``solve_triangular`` reads, with ones on the diagonal when unitriangular."""
    if not attrs.unitriangular:
        return xp.triu(a) if attrs.upper else xp.tril(a)
    strict = xp.triu(a, k=1) if attrs.upper else xp.tril(a, k=-1)
    return strict + xp.eye(a.shape[-1], dtype=a.dtype, device=device(a))


def _solve_triangular(xp, a, b, attrs):
    t = _triangle(xp, a, attrs)
    if attrs.left:
        return xp.linalg.solve(t, b)
    return xp.matrix_transpose(xp.linalg.solve(xp.matrix_transpose(t), xp.matrix_transpose(b)))


def _solve_triangular_torch(a, b, attrs):
    import torch

    return torch.linalg.solve_triangular(a, b, upper=attrs.upper, left=attrs.left, unitriangular=attrs.unitriangular)


def _solve_triangular_jax(a, b, attrs):
    from jax import lax

    return lax.linalg.triangular_solve(a, b, left_side=attrs.left, lower=not attrs.upper,
                                       unit_diagonal=attrs.unitriangular)


def _solve_triangular_grad(call: Call, g: Expr):
    a, _ = call.args
    up, left, unit = call.attrs.upper, call.attrs.left, call.attrs.unitriangular
    gb = solve_triangular(mT(a), g, upper=not up, left=left, unitriangular=unit)
    ga = E.negative(mm(gb, call, tb=True) if left else mm(call, gb, ta=True))
    return [trilu(ga, (1 if up else -1) if unit else 0, up), gb]


solve_triangular = defop(
    "solve_triangular", 2, _system_infer("solve_triangular"), kernel=_solve_triangular,
    impls={"torch": _solve_triangular_torch, "jax": _solve_triangular_jax}, attrs_type=SolveTriangularAttrs,
    grad=_solve_triangular_grad, pattern=FusionKind.OPAQUE,
    flops=lambda ts, out, attrs: _batch(ts[0]) * numel(ts[1].shape[-2:]) * numel(ts[0].shape[-1:]),
    torch_name="linalg_solve_triangular", dtypes=LINALG_DTYPES,
    doc="``X`` with ``A X = B`` (``left``) or ``X A = B``, ``A`` triangular: only its upper or lower triangle "
        "is read, and not its diagonal when ``unitriangular`` (ones there).")


def _solve_grad(call: Call, g: Expr):
    a, _ = call.args
    gb = solve(mT(a), g)
    return [E.negative(mm(gb, call, tb=True)), gb]


solve = defop("solve", 2, _system_infer("solve"), kernel=lambda xp, a, b, attrs=None: xp.linalg.solve(a, b),
              grad=_solve_grad, pattern=FusionKind.OPAQUE,
              flops=lambda ts, out, attrs: int(_batch(ts[0]) * numel(ts[0].shape[-1:]) ** 2
                                               * (2 / 3 * numel(ts[0].shape[-1:]) + 2 * numel(ts[1].shape[-1:]))),
              torch_name="linalg_solve", dtypes=LINALG_DTYPES,
              doc="``X`` with ``A X = B`` for square ``A`` (``B``: (..., n, k) with ``A``'s batch axes; a "
                  "singular ``A`` is an error on numpy and torch).")


def _inv_grad(call: Call, g: Expr):
    return [E.negative(mm(mm(call, g, ta=True), call, tb=True))]


inv = defop("inv", 1, _square_infer("inv"), kernel=lambda xp, a, attrs=None: xp.linalg.inv(a), grad=_inv_grad,
            pattern=FusionKind.OPAQUE, flops=_cubic_flops(2), torch_name="linalg_inv", dtypes=LINALG_DTYPES,
            doc="The inverses of square matrices (a singular matrix is an error on numpy and torch).")


def _slogdet_infer(arg_types, attrs):
    a = _square("slogdet", arg_types)
    v = TensorType(a.shape[:-2], a.dtype)
    return TupleType((v, v))


def _slogdet(xp, a, attrs=None):
    sign, logabsdet = xp.linalg.slogdet(a)
    return as_array(sign), as_array(logabsdet)


def _slogdet_grad(call: Call, g: Expr):
    """d log|det A| = tr(A^-1 dA): ``A_bar = g A^-T``; the sign is piecewise constant."""
    glad = nonzero(field(g, 1))
    if glad is None:
        return [None]
    return [_scale_matrices(glad, mT(inv(call.args[0])))]


slogdet = defop("slogdet", 1, _slogdet_infer, kernel=_slogdet, grad=_slogdet_grad, pattern=FusionKind.OPAQUE,
                flops=_cubic_flops(2 / 3), torch_name="linalg_slogdet", dtypes=LINALG_DTYPES,
                doc="``a -> (sign, logabsdet)``: the sign (-1, 0 or 1) and the log of the absolute value of the "
                    "determinants (``-inf`` for a singular matrix); ``det = sign * exp(logabsdet)``.")


def _matrix_exp_grad(call: Call, g: Expr):
    """The adjoint of the Frechet derivative: the top-right block of ``exp([[A^T, G], [0, A^T]])`` (Mathias
    1996; PyTorch's rule), so the gradient has a gradient."""
    a = call.args[0]
    n = a.checked_type.shape[-1]
    if n is Any:
        raise PullbackError(f"the gradient of matrix_exp needs a static matrix size, got {a.checked_type}")
    at = mT(a)
    block = concatenate([concatenate([at, g], -1), concatenate([T.zeros_like(a), at], -1)], -2)
    return [strided_slice(matrix_exp(block), (0, n), (n, 2 * n), axes=(-2, -1))]


def _matrix_exp_jax(a, attrs=None):
    import jax.scipy.linalg

    return jax.scipy.linalg.expm(a)


def _matrix_exp_torch(a, attrs=None):
    import torch

    return torch.linalg.matrix_exp(a)


matrix_exp = defop("matrix_exp", 1, _square_infer("matrix_exp"), kernel=lambda xp, a, attrs=None: expm(a),
                   impls={"jax": _matrix_exp_jax, "torch": _matrix_exp_torch}, grad=_matrix_exp_grad,
                   pattern=FusionKind.OPAQUE, flops=_cubic_flops(12), torch_name="linalg_matrix_exp",
                   dtypes=LINALG_DTYPES,
                   doc="The matrix exponential of each matrix (SciPy on numpy; ``torch.linalg.matrix_exp``; "
                       "``jax.scipy.linalg.expm``): orthogonal parametrizations, continuous-time models.")


def _eigh_infer(arg_types, attrs):
    a = _square("eigh", arg_types)
    return TupleType((TensorType(a.shape[:-1], a.dtype), a))


def _column_signs(xp, v):
    """Per column of ``v`` (..., 1, k): the sign of its entry of largest magnitude (the first such)."""
    top = xp.take_along_axis(v, xp.argmax(xp.abs(v), axis=-2, keepdims=True), axis=-2)
    one = xp.ones_like(top)
    return xp.where(top < 0, -one, one)


def canonical_signs(xp, v):
    """``v``'s columns (eigenvectors) each times the sign of its entry of largest magnitude, so that every
    target gives the same eigenvectors (LAPACK implementations choose signs differently)."""
    return v if 0 in v.shape else v * _column_signs(xp, v)


def _eigh(xp, a, attrs=None):
    w, v = xp.linalg.eigh(a)
    return w, canonical_signs(xp, v)


def _eigh_jax(a, attrs=None):
    import jax.numpy as jnp
    from jax import lax

    v, w = lax.linalg.eigh(a, lower=True, symmetrize_input=False)
    return w, canonical_signs(jnp, v)


def _eigh_grad(call: Call, g: Expr):
    """PyTorch's rule: ``A_bar = V (diag(w_bar) + skew(V^T V_bar) / E) V^T``, ``E_ij = w_j - w_i`` (1 on the
    diagonal, where the skew part is 0); the eigenvectors' term needs distinct eigenvalues, as in PyTorch."""
    a = call.args[0]
    w, v = TupleGetItem(call, 0), TupleGetItem(call, 1)
    gw, gv = nonzero(field(g, 0)), nonzero(field(g, 1))
    if gw is None and gv is None:
        return [None]
    n = a.checked_type.shape[-1]
    if n is Any:
        raise PullbackError(f"the gradient of eigh needs a static matrix size, got {a.checked_type}")
    eye = const(np.eye(n, dtype=a.checked_type.dtype))
    inner = None
    if gv is not None:
        vgv = mm(v, gv, ta=True)
        gaps = E.add(E.subtract(T.expand_dims(w, -2), T.expand_dims(w, -1)), eye)
        inner = E.divide(E.multiply(E.subtract(vgv, mT(vgv)), scalar(0.5, a)), gaps)
    if gw is not None:
        diag = E.multiply(eye, T.expand_dims(gw, -2))
        inner = diag if inner is None else E.add(inner, diag)
    return [mm(mm(v, inner), v, tb=True)]


eigh = defop("eigh", 1, _eigh_infer, kernel=_eigh, impls={"jax": _eigh_jax}, grad=_eigh_grad,
             pattern=FusionKind.OPAQUE, flops=_cubic_flops(9), torch_name="linalg_eigh", dtypes=LINALG_DTYPES,
             doc="``a -> (eigenvalues, eigenvectors)`` of symmetric matrices (the lower triangle is read), the "
                 "eigenvalues ascending, each eigenvector's entry of largest magnitude positive (the same on "
                 "every target; eager PyTorch keeps its LAPACK's signs).")


def _svd_infer(arg_types, attrs):
    a, batch, m, n, k = _factored("svd", arg_types)
    return TupleType((TensorType(batch + (m, k), a.dtype), TensorType(batch + (k,), a.dtype),
                      TensorType(batch + (k, n), a.dtype)))


def _reduced_svd(xp, a, op: str):
    """``xp.linalg.svd(a, full_matrices=False)``; a matrix with a NaN or infinite entry is an error, as in eager
    PyTorch (OpenBLAS's SVD, NumPy's and XLA's on CPU, never returns on some matrices holding both infinities;
    traced, the check raises after the call, so the SVD runs on such a matrix zeroed and its factors are NaN)."""
    finite = xp.isfinite(a)
    check(~finite, f"{op}: the input matrix contains non-finite values (NaN or inf): its SVD does not converge")
    if not is_traced(a):
        return xp.linalg.svd(a, full_matrices=False)
    bad = ~xp.all(finite, axis=(-2, -1), keepdims=True)
    u, s, vh = xp.linalg.svd(xp.where(bad, 0, a), full_matrices=False)
    return xp.where(bad, xp.nan, u), xp.where(bad[..., 0], xp.nan, s), xp.where(bad, xp.nan, vh)


def _svd(xp, a, attrs=None):
    u, s, vh = _reduced_svd(xp, a, "svd")
    if 0 in u.shape or 0 in vh.shape:
        return u, s, vh
    signs = _column_signs(xp, u)
    return u * signs, s, vh * xp.matrix_transpose(signs)


def _svd_grad(call: Call, g: Expr):
    """PyTorch's rule (``svd_backward``), reduced factors: the off-diagonal part
    ``(skew(U^T U_bar) S + S skew(V^T V_bar)) / E`` (``E_jk = s_k^2 - s_j^2``), the singular values' cotangent on the
    diagonal, and the projections onto the complements of ``U`` and ``V`` for non-square matrices."""
    a = call.args[0]
    m, n = a.checked_type.shape[-2:]
    if Any in (m, n):
        raise PullbackError(f"the gradient of svd needs static matrix sizes, got {a.checked_type}")
    k = min(m, n)
    u, sv, vh = (TupleGetItem(call, i) for i in range(3))
    gu, gs, gvh = (nonzero(field(g, i)) for i in range(3))
    if gu is None and gs is None and gvh is None:
        return [None]
    eye = const(np.eye(k, dtype=a.checked_type.dtype))
    row, col = T.expand_dims(sv, -2), T.expand_dims(sv, -1)  # s_k along rows, s_j along columns
    inner = None
    if gu is not None or gvh is not None:
        s2 = E.multiply(sv, sv)
        gaps = E.add(E.subtract(T.expand_dims(s2, -2), T.expand_dims(s2, -1)), eye)
        terms = []
        if gu is not None:
            ugu = mm(u, gu, ta=True)
            terms.append(E.multiply(E.subtract(ugu, mT(ugu)), row))
        if gvh is not None:
            vgv = mm(vh, gvh, tb=True)  # V^T V_bar with V = Vh^T, V_bar = Vh_bar^T
            terms.append(E.multiply(col, E.subtract(vgv, mT(vgv))))
        inner = E.divide(terms[0] if len(terms) == 1 else E.add(*terms), gaps)
    if gs is not None:
        diag = E.multiply(eye, T.expand_dims(gs, -2))
        inner = diag if inner is None else E.add(inner, diag)
    if inner is None:
        inner = T.zeros_like(mm(u, u, ta=True))
    if m > k and gu is not None:  # (U inner + (I - U U^T) gU S^-1) V^T
        gus = E.divide(gu, row)
        left = E.add(mm(u, inner), E.subtract(gus, mm(u, mm(u, gus, ta=True))))
        return [mm(left, vh)]
    if n > k and gvh is not None:  # U (inner V^T + S^-1 gV^T (I - V V^T))
        gvs = E.divide(gvh, col)  # (S^-1 gV^T) = gVh / s_j by rows
        right = E.add(mm(inner, vh), E.subtract(gvs, mm(mm(gvs, vh, tb=True), vh)))
        return [mm(u, right)]
    return [mm(mm(u, inner), vh)]


svd = defop("svd", 1, _svd_infer, kernel=_svd, grad=_svd_grad, pattern=FusionKind.OPAQUE,
            flops=_factor_flops(4),
            torch_name="linalg_svd", dtypes=LINALG_DTYPES,
            doc="``a -> (U, S, Vh)``, the reduced singular value decomposition (``a = U diag(S) Vh``, ``S`` "
                "descending), each column of ``U`` with its entry of largest magnitude positive (the row of "
                "``Vh`` flipped with it), the same on every target.")


@dataclass(frozen=True)
class PinvAttrs:
    """Singular values at most ``max(atol, rtol * s_max)`` count as zero (``rtol`` None: ``eps * max(m, n)``
    when ``atol`` is 0, else 0: PyTorch's defaults)."""

    atol: float = 0.0
    rtol: Optional[float] = None

    def __post_init__(self):
        for name in ("atol", "rtol"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or v < 0):
                raise AttrError(f"attribute {name} must be a non-negative number, got {v!r}")


def _pinv_infer(arg_types, attrs):
    a = _float_matrices("pinv", arg_types)
    return TensorType(a.shape[:-2] + (a.shape[-1], a.shape[-2]), a.dtype)


def _pinv(xp, a, attrs):
    m, n = a.shape[-2:]
    if 0 in (m, n):
        return xp.zeros(a.shape[:-2] + (n, m), dtype=a.dtype)
    rtol = attrs.rtol
    if rtol is None:
        rtol = float(np.finfo(str(a.dtype).split(".")[-1]).eps) * max(m, n) if attrs.atol == 0 else 0.0
    u, s, vh = _reduced_svd(xp, a, "pinv")
    tol = xp.maximum(xp.max(s, axis=-1, keepdims=True) * rtol, xp.asarray(attrs.atol, dtype=s.dtype))
    kept = s > tol
    inv_s = xp.where(kept, 1 / xp.where(kept, s, xp.ones_like(s)), xp.zeros_like(s))
    return xp.matmul(xp.matrix_transpose(vh) * inv_s[..., None, :], xp.matrix_transpose(u))


def _pinv_grad(call: Call, g: Expr):
    """PyTorch's ``pinv_backward`` (Golub and Pereyra 1973), right where the rank is locally constant: no
    singular-value gaps, so rank-deficient matrices have a finite gradient."""
    a, p = call.args[0], call
    m, n = a.checked_type.shape[-2:]
    if m is not Any and n is not Any and m <= n:
        k = mm(g, p, ta=True)  # G^T P
        kp = mm(k, p, tb=True)  # K P^T
        ga = E.add(E.subtract(kp, mT(mm(p, k))), E.subtract(
            mm(mm(p, p, ta=True), E.subtract(mT(g), mm(k, a))), mm(mm(a, p), kp)))
    else:
        k = mm(p, g, tb=True)  # P G^T
        pk = mm(p, k, ta=True)  # P^T K
        ga = E.add(E.subtract(mm(mm(E.subtract(mT(g), mm(a, k)), p), p, tb=True), mT(mm(k, p))),
                   E.subtract(pk, mm(mm(pk, p), a)))
    return [ga]


pinv = defop("pinv", 1, _pinv_infer, kernel=_pinv, attrs_type=PinvAttrs, grad=_pinv_grad, pattern=FusionKind.OPAQUE,
             flops=_factor_flops(6),
             torch_name="linalg_pinv", dtypes=LINALG_DTYPES,
             doc="The Moore-Penrose pseudo-inverse through the SVD, singular values under the tolerance dropped; "
                 "its gradient is finite for rank-deficient matrices.")


def _qr_infer(arg_types, attrs):
    a, batch, m, n, k = _factored("qr", arg_types)
    return TupleType((TensorType(batch + (m, k), a.dtype), TensorType(batch + (k, n), a.dtype)))


def _qr(xp, a, attrs=None):
    q, r = xp.linalg.qr(a, mode="reduced")
    return q, r


def _qr_grad(call: Call, g: Expr):
    """PyTorch's rule. Square or tall (m >= n, ``R`` square): ``A_bar = (Q_bar + Q copyltu(M)) R^-T`` with
    ``M = R R_bar^T - Q_bar^T Q`` (copyltu: the lower triangle mirrored onto the upper). Wide (m < n):
    ``A = [X | Y]`` with ``X = Q R1`` square and ``R2 = Q^T Y``, so ``Y_bar = Q R2_bar`` and ``X_bar`` is the
    square rule for ``(Q_bar + Y R2_bar^T, R1_bar)``."""
    a = call.args[0]
    m, n = a.checked_type.shape[-2:]
    if Any in (m, n):
        raise PullbackError(f"the gradient of qr needs static matrix sizes, got {a.checked_type}")
    q, r = TupleGetItem(call, 0), TupleGetItem(call, 1)
    gq, gr = nonzero(field(g, 0)), nonzero(field(g, 1))
    if gq is None and gr is None:
        return [None]
    if m >= n:
        return [_qr_square_grad(q, r, gq, gr)]
    if m == 0:
        return [T.zeros_like(a)]

    def cols(x, lo, hi):
        return strided_slice(x, (lo,), (hi,), axes=(-1,))

    y = cols(a, m, n)
    gr1, gr2 = (None, None) if gr is None else (cols(gr, 0, m), cols(gr, m, n))
    gy = T.zeros_like(y) if gr2 is None else mm(q, gr2)
    if gr2 is not None:
        gq = mm(y, gr2, tb=True) if gq is None else E.add(gq, mm(y, gr2, tb=True))
    return [concatenate([_qr_square_grad(q, cols(r, 0, m), gq, gr1), gy], -1)]


def _qr_square_grad(q: Expr, r: Expr, gq: Optional[Expr], gr: Optional[Expr]) -> Expr:
    """The input gradient of ``(Q, R) = qr(A)`` with ``R`` square, from ``Q_bar``, ``R_bar`` (None: zero, not both)."""
    terms = ([mm(r, gr, tb=True)] if gr is not None else []) + ([E.negative(mm(gq, q, ta=True))] if gq is not None else [])
    big_m = terms[0] if len(terms) == 1 else E.add(*terms)
    copyltu = E.add(trilu(big_m, 0, False), mT(trilu(big_m, -1, False)))
    b = mm(q, copyltu) if gq is None else E.add(gq, mm(q, copyltu))
    return solve_triangular(mT(r), b, upper=False, left=False)


qr = defop("qr", 1, _qr_infer, kernel=_qr, grad=_qr_grad, pattern=FusionKind.OPAQUE,
           flops=_factor_flops(4),
           torch_name="linalg_qr", dtypes=LINALG_DTYPES,
           doc="``a -> (Q, R)``, the reduced QR decomposition (Householder, LAPACK's signs); tall, square and wide "
               "matrices are differentiable (wide: through the leading square block, as PyTorch).")
