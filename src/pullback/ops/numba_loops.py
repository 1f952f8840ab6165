"""The numba loops behind ``numba_kernels`` (importing this module imports numba).

Module-level functions, so that numba's disk cache (``cache=True``) finds them again in the next
process (closures get a new cache entry every time). Every helper is written out so the loops
vectorise: erf by the NumPy kernel's rational approximation (``special._ERF_P/_ERF_Q``), exp by
Cephes' ``expf`` polynomial times an exact power of two, and the tanh form of GELU through
``(1 + tanh u) / 2 = 1 / (1 + exp(-2u))`` and ``1 - tanh^2 = 4 s (1 - s)``, which do not cancel where
tanh is near +-1. Row loops (softmax, layer norm and their gradients) take C-contiguous 2-D float32
arrays, the reduced axis last, and sum in float32 lanes (as NumPy's pairwise sums do, in another order).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .special import _ERF_P, _ERF_Q

f32 = np.float32
EP0, EP1, EP2, EP3, EP4, EP5, EP6 = (f32(v) for v in _ERF_P)
EQ0, EQ1, EQ2, EQ3, EQ4 = (f32(v) for v in _ERF_Q)
# exp(r) = 1 + r + r^2 P(r) on [-ln 2 / 2, ln 2 / 2] (Cephes' expf)
XP0, XP1, XP2, XP3, XP4, XP5 = (f32(v) for v in (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                                                    4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
LOG2E, LN2_HI, LN2_LO = f32(1.0 / math.log(2.0)), f32(0.693359375), f32(-2.12194440e-4)
ZERO, ONE, TWO, HALF, FOUR, INF = f32(0.0), f32(1.0), f32(2.0), f32(0.5), f32(4.0), f32(np.inf)
LO87, HI88 = f32(-87.0), f32(88.72)
R2, RPI = f32(1.0 / math.sqrt(2.0)), f32(1.0 / math.sqrt(2.0 * math.pi))
K, C = f32(math.sqrt(2.0 / math.pi)), f32(0.044715)
K3C = f32(3 * math.sqrt(2.0 / math.pi) * 0.044715)

FLAGS = {"contract", "arcp", "reassoc", "nsz"}  # no "nnan"/"ninf": NaN and inf inputs keep IEEE results
# one core (no ``parallel=True``: a third thread pool beside OpenBLAS's and PyTorch's made a transformer step
# slower); error_model="numpy": no zero-division branch, so the loops vectorise
jit = numba.njit(fastmath=FLAGS, nogil=True, cache=True, error_model="numpy")
inline = numba.njit(inline="always", fastmath=FLAGS, error_model="numpy", cache=True)
exact = numba.njit(inline="always", fastmath={"contract", "nsz"}, error_model="numpy", cache=True)  # in this order


@inline
def erf(v):  # +-1 beyond +-4, as the NumPy kernel
    z = min(max(v, -FOUR), FOUR)
    z2 = z * z
    p = ((((((EP0 * z2 + EP1) * z2 + EP2) * z2 + EP3) * z2 + EP4) * z2 + EP5) * z2 + EP6) * z
    q = (((EQ0 * z2 + EQ1) * z2 + EQ2) * z2 + EQ3) * z2 + EQ4
    return p / q


@exact
def exp(v):  # float32 exp: 0 below -87, inf above 88.7, NaN for NaN
    w = min(max(v, LO87), HI88)
    n = np.floor(w * LOG2E + HALF)
    r = w - n * LN2_HI - n * LN2_LO
    y = (((((XP0 * r + XP1) * r + XP2) * r + XP3) * r + XP4) * r + XP5) * r * r + r + ONE
    a = np.int32(abs(n))  # 0..128; 2^a = (2^(a >> 3))^8 2^(a & 7), exact powers of two below 2^128
    p = np.float32(np.int32(1) << (min(a, np.int32(127)) >> 3))
    p = p * p
    p = p * p
    p = p * p * np.float32(np.int32(1) << (min(a, np.int32(127)) & 7))
    y = y * p * (TWO if a > 127 else ONE) if n >= ZERO else y / p
    y = ZERO if v < LO87 else y
    y = INF if v > HI88 else y
    return y if v == v else v


@inline
def sigmoid2(u):  # (1 + tanh u) / 2 = 1 / (1 + exp(-2u)), without the cancellation of 1 + tanh u near -1
    e = exp(-TWO * abs(u))
    hi = ONE / (ONE + e)
    return hi if u >= ZERO else e * hi


@jit
def gelu_erf(x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = HALF * v * (ONE + erf(v * R2))


@jit
def gelu_tanh(x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = v * sigmoid2(K * (v + C * v * v * v))


@jit
def gelu_grad_erf(g, x, out):
    for i in range(x.size):
        v = x[i]
        out[i] = g[i] * (HALF * (ONE + erf(v * R2)) + v * exp(-HALF * v * v) * RPI)


@jit
def gelu_grad_tanh(g, x, out):
    for i in range(x.size):
        v = x[i]
        v2 = v * v
        u = v * (K + K * C * v2)
        s, s1 = sigmoid2(u), sigmoid2(-u)  # 1 - tanh^2 = 4 s (1 - s)
        out[i] = g[i] * (s + TWO * v * s * s1 * (K + K3C * v2))


@inline
def exp_row(x, i, out):  # out[i] = exp(x[i] - max x[i]); returns (the max, the sum of out[i])
    m = x[i, 0]
    for j in range(1, x.shape[1]):
        m = max(m, x[i, j])
    s = ZERO
    for j in range(x.shape[1]):
        e = exp(x[i, j] - m)
        out[i, j] = e
        s += e
    return m, s


@jit
def softmax_rows(x, out):
    for i in range(x.shape[0]):
        inv = ONE / exp_row(x, i, out)[1]
        for j in range(x.shape[1]):
            out[i, j] *= inv


@jit
def log_softmax_rows(x, out):
    for i in range(x.shape[0]):
        m, s = exp_row(x, i, out)
        shift = m + np.log(s)
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] - shift


@jit
def softmax_grad_rows(g, y, out):  # y (g - sum(g y))
    for i in range(y.shape[0]):
        d = ZERO
        for j in range(y.shape[1]):
            d += g[i, j] * y[i, j]
        for j in range(y.shape[1]):
            out[i, j] = y[i, j] * (g[i, j] - d)


@jit
def log_softmax_grad_rows(g, y, out):  # g - exp(y) sum(g)
    for i in range(y.shape[0]):
        s = ZERO
        for j in range(y.shape[1]):
            s += g[i, j]
        for j in range(y.shape[1]):
            out[i, j] = g[i, j] - exp(y[i, j]) * s


@inline
def row_stats(x, i, eps):  # (mean, 1 / sqrt(var + eps)) of row i, the variance about the mean (two passes)
    n = x.shape[1]
    s = ZERO
    for j in range(n):
        s += x[i, j]
    mean = s / np.float32(n)
    q = ZERO
    for j in range(n):
        d = x[i, j] - mean
        q += d * d
    return mean, ONE / np.sqrt(q / np.float32(n) + eps)


@jit
def layer_norm_rows(x, gamma, beta, eps, scale, center, out, mean_out, rstd_out):
    """out = (x - mean) rstd (times gamma, plus beta) by rows; each row's mean and rstd into ``mean_out``/``rstd_out``."""
    for i in range(x.shape[0]):
        mean, rstd = row_stats(x, i, eps)
        mean_out[i] = mean
        rstd_out[i] = rstd
        for j in range(x.shape[1]):
            v = (x[i, j] - mean) * rstd
            v = v * gamma[j] if scale else v
            out[i, j] = v + beta[j] if center else v


@inline
def layer_norm_grad_row(g, x, gamma, i, mean, rstd, scale, dx, dgamma, dbeta):
    """Row i of dx = rstd (gx - mean(gx) - xhat mean(gx xhat)), gx = g gamma; dgamma += g xhat and dbeta += g
    (float64 accumulators ``dgamma``/``dbeta``)."""
    n = np.float32(x.shape[1])
    m1 = ZERO
    m2 = ZERO
    for j in range(x.shape[1]):
        xh = (x[i, j] - mean) * rstd
        gx = g[i, j] * gamma[j] if scale else g[i, j]
        m1 += gx
        m2 += gx * xh
        dgamma[j] += g[i, j] * xh
        dbeta[j] += g[i, j]
    m1 /= n
    m2 /= n
    for j in range(x.shape[1]):
        xh = (x[i, j] - mean) * rstd
        gx = g[i, j] * gamma[j] if scale else g[i, j]
        dx[i, j] = rstd * (gx - m1 - xh * m2)


@jit
def layer_norm_grad_rows(g, x, gamma, eps, scale, dx, dgamma, dbeta):
    """The layer norm gradient by rows, each row's statistics recomputed."""
    for i in range(x.shape[0]):
        mean, rstd = row_stats(x, i, eps)
        layer_norm_grad_row(g, x, gamma, i, mean, rstd, scale, dx, dgamma, dbeta)


@jit
def layer_norm_grad_saved_rows(g, x, gamma, mean, rstd, scale, dx, dgamma, dbeta):
    """The layer norm gradient by rows with the rows' statistics given (``mean``, ``rstd``: one per row)."""
    for i in range(x.shape[0]):
        layer_norm_grad_row(g, x, gamma, i, mean[i], rstd[i], scale, dx, dgamma, dbeta)


# exact IEEE additions in the order written (no fastmath): the sums of np.add.at, bit for bit
ordered = numba.njit(nogil=True, cache=True)


@ordered
def add_rows(out, idx, u):
    """``out[a, idx[i], b] += u[a, i, b]`` for each ``i`` in order, as ``np.add.at`` adds; a negative index counts
    from the end. Returns -1, or (nothing added) the first ``i`` whose index is out of range."""
    n = out.shape[1]
    for i in range(idx.shape[0]):
        if idx[i] < -n or idx[i] >= n:
            return i
    for i in range(idx.shape[0]):
        r = idx[i] + n if idx[i] < 0 else idx[i]
        for a in range(u.shape[0]):
            for b in range(u.shape[2]):
                out[a, r, b] += u[a, i, b]
    return -1


KERNELS = {"add_rows": add_rows, "gelu/none": gelu_erf, "gelu/tanh": gelu_tanh, "gelu_grad/none": gelu_grad_erf, "gelu_grad/tanh": gelu_grad_tanh,
           "softmax": softmax_rows, "log_softmax": log_softmax_rows, "softmax_grad": softmax_grad_rows,
           "log_softmax_grad": log_softmax_grad_rows, "layer_norm": layer_norm_rows, "layer_norm_grad": layer_norm_grad_rows,
           "layer_norm_grad_saved": layer_norm_grad_saved_rows}
