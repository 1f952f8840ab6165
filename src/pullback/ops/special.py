"""Special functions shared by operator kernels (erf for ``erf`` and ``nn.gelu``; the log-gamma family).

``erf`` is NumPy's: float32/float16 by a vectorised rational approximation (a few
ulp); float64 by SciPy's ``erf`` when SciPy is installed (extra ``pullback[fast]``),
otherwise libm's ``math.erf`` element by element (exact, slower). Results keep the
input's dtype. ``erf_of(xp)`` is the erf of any array namespace (jax's and torch's
own on those targets). ``lgamma`` is SciPy's ``gammaln`` (else libm's ``lgamma`` element
by element); ``polygamma`` (``digamma`` at ``n = 0``) needs SciPy.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..ir.errors import ExecutionError
from .npfast import blockwise

_erf_scalar = np.frompyfunc(math.erf, 1, 1)


@lru_cache(maxsize=None)
def _scipy_special():
    try:
        import scipy.special  # type: ignore
    except ImportError:
        return None
    return scipy.special


def _scipy_erf():
    sp = _scipy_special()
    return None if sp is None else sp.erf


def erf64(x: np.ndarray) -> np.ndarray:
    """Exact elementwise erf, computed in float64 and returned in x's dtype."""
    fast = _scipy_erf()
    if fast is not None:
        return np.asarray(fast(x.astype(np.float64, copy=False)), dtype=x.dtype)
    return np.asarray(_erf_scalar(x.astype(np.float64)), dtype=x.dtype)


# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (+-1 beyond, in float32): Eigen's/XLA's float32 rational
# approximation, max relative error 4.5e-7 (a few ulp); 10x faster than SciPy's double-precision loop.
_ERF_P = tuple(np.float32(v) for v in (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                        -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                        -1.60960333262415e-02))
_ERF_Q = tuple(np.float32(v) for v in (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                        -7.37332916720468e-03, -1.42647390514189e-02))


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf in x's dtype: float32/float16 by the rational approximation above (on blocks
    that stay in the cache), float64 exactly (SciPy when installed, else libm element by element)."""
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float16):
        return erf64(x)
    return blockwise(_erf32, x)


def _horner(coefs: tuple, v: np.ndarray) -> np.ndarray:
    """``coefs[0] v^n + ... + coefs[n]`` in a new array, two in-place passes per coefficient after the first two."""
    p = np.multiply(v, coefs[0])
    p += coefs[1]
    for c in coefs[2:]:
        p *= v
        p += c
    return p


def _erf32(x: np.ndarray) -> np.ndarray:
    x32 = np.clip(x, np.float32(-4.0), np.float32(4.0), dtype=np.float32)
    x2 = np.multiply(x32, x32)
    p, q = _horner(_ERF_P, x2), _horner(_ERF_Q, x2)
    p *= x32
    p /= q
    return p.astype(x.dtype, copy=False)



def erf_of(xp):
    """Elementwise erf for arrays of namespace ``xp``: ``erf`` above on NumPy, ``jax.scipy.special.erf``
    on ``jax.numpy``, ``torch.erf`` on array-api-compat's torch."""
    if xp is np:
        return erf
    if xp.__name__ == "jax.numpy":
        from jax.scipy.special import erf as jax_erf

        return jax_erf
    return xp.erf


_erfc_scalar = np.frompyfunc(math.erfc, 1, 1)


def erfc(x: np.ndarray) -> np.ndarray:
    """``1 - erf(x)`` elementwise in x's dtype, accurate in the tail where ``1 - erf`` cancels (SciPy's ``erfc``,
    else libm's element by element)."""
    x = np.asarray(x)
    sp = _scipy_special()
    if sp is not None:
        return np.asarray(sp.erfc(x), dtype=x.dtype)
    return np.asarray(_erfc_scalar(x.astype(np.float64)), dtype=x.dtype)


def _lgamma1(v: float) -> float:
    return math.inf if v == -math.inf or v <= 0 and v == math.floor(v) else math.lgamma(v)  # poles, -inf: +inf


_lgamma_scalar = np.frompyfunc(_lgamma1, 1, 1)


def lgamma(x: np.ndarray) -> np.ndarray:
    """``log |Gamma(x)|`` elementwise in x's dtype (SciPy's ``gammaln``, else libm's element by element); +inf at
    -inf as libm, ATen and XLA give (SciPy's ``gammaln(-inf)`` is -inf)."""
    x = np.asarray(x)
    sp = _scipy_special()
    if sp is not None:
        return np.asarray(np.where(np.isneginf(x), np.inf, sp.gammaln(x)), dtype=x.dtype)
    return np.asarray(_lgamma_scalar(x.astype(np.float64)), dtype=x.dtype)


def polygamma(n: int, x: np.ndarray) -> np.ndarray:
    """The ``n``-th derivative of digamma elementwise in x's dtype (SciPy's ``digamma``/``polygamma``)."""
    x = np.asarray(x)
    sp = _scipy_special()
    if sp is None:
        raise ExecutionError("digamma and polygamma on the numpy target need SciPy: pip install scipy (or the "
                             "pullback[fast] extra)")
    return np.asarray(sp.digamma(x) if n == 0 else sp.polygamma(n, x), dtype=x.dtype)


def scipy_special(name: str):
    """SciPy's ``scipy.special.<name>`` as a kernel returning x's dtype (the numpy target's special functions:
    ``erfinv``, ``ndtri``, ``log_ndtr``, the Bessel functions ``i0``, ``i0e``, ``i1``, ``i1e``)."""
    def kernel(x, attrs=None):
        sp = _scipy_special()
        if sp is None:
            raise ExecutionError(f"{name} on the numpy target needs SciPy: pip install scipy (or the pullback[fast] extra)")
        x = np.asarray(x)
        return np.asarray(getattr(sp, name)(x), dtype=x.dtype)

    return kernel


def expm(a: np.ndarray) -> np.ndarray:
    """The matrix exponential of each matrix of ``a`` (SciPy's ``expm``: scaling and squaring, Pade), computed
    in float64."""
    try:
        import scipy.linalg  # type: ignore
    except ImportError:
        raise ExecutionError("matrix_exp on the numpy target needs SciPy: pip install scipy (or the pullback[fast] "
                             "extra)") from None
    return np.asarray(scipy.linalg.expm(a.astype(np.float64)), dtype=a.dtype)  # its float32 path was 4e-3 off on an OpInfo sample


# B_2j / (2j)! for j = 1..9: the Euler-Maclaurin tail of the Hurwitz zeta function
_ZETA_TAIL = (1 / 12, -1 / 720, 1 / 30240, -1 / 1209600, 1 / 47900160, -691 / 1307674368000, 1 / 74724249600,
              -3617 / 10670622842880000, 43867 / 5109094217170944000)
_SHIFT_TO = 12.0  # arguments below this are shifted up by the recurrence first


def polygamma_series(xp, n: int, x):
    """``polygamma(n, x)`` (n >= 1) in array namespace ``xp``: ``(-1)^(n+1) n! zeta(n+1, x)``, the Hurwitz zeta
    by the recurrence up to ``x >= 12`` and its Euler-Maclaurin expansion there: float64 to a few ulp for
    x > 0 (PyTorch 2.13's own ``polygamma(1, x)`` is 4e-10 relative off in float64); ``xp.polygamma`` at other
    points (poles, negative arguments, inf and nan)."""
    s = n + 1
    positive = (x > 0) & (x < math.inf)
    z, acc = xp.where(positive, x, xp.full_like(x, _SHIFT_TO)), xp.zeros_like(x)
    for _ in range(max(int(math.ceil(_SHIFT_TO - float(xp.min(z)))), 0) if math.prod(x.shape) else 0):
        small = z < _SHIFT_TO
        acc = acc + xp.where(small, z ** -s, xp.zeros_like(z))
        z = xp.where(small, z + 1, z)
    zeta = acc + z ** (1 - s) / (s - 1) + z ** -s / 2
    rising, zk = float(s), z ** (-s - 1)  # s (s+1) ... (s+2j-2) and z^(-s-2j+1)
    for j, c in enumerate(_ZETA_TAIL, start=1):
        zeta = zeta + c * rising * zk
        rising *= (s + 2 * j - 1) * (s + 2 * j)
        zk = zk / (z * z)
    # elsewhere (x <= 0, inf, nan) the namespace's own polygamma
    return xp.where(positive, (-1) ** (n + 1) * math.factorial(n) * zeta, xp.polygamma(n, x))
