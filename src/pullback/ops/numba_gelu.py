"""The numba loops behind ``numba_kernels`` (importing this module imports numba).

Module-level functions, so that numba's disk cache (``cache=True``) finds them again in the next
process (closures get a new cache entry every time). Every helper is written out so the loops
vectorise: erf by the NumPy kernel's rational approximation (``special._ERF_P/_ERF_Q``), exp by
Cephes' ``expf`` polynomial times an exact power of two, and the tanh form of GELU through
``(1 + tanh u) / 2 = 1 / (1 + exp(-2u))`` and ``1 - tanh^2 = 4 s (1 - s)``, which do not cancel where
tanh is near +-1.
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
ZERO, ONE, TWO, HALF, FOUR, LO85 = f32(0.0), f32(1.0), f32(2.0), f32(0.5), f32(4.0), f32(-85.0)
R2, RPI = f32(1.0 / math.sqrt(2.0)), f32(1.0 / math.sqrt(2.0 * math.pi))
K, C = f32(math.sqrt(2.0 / math.pi)), f32(0.044715)
K3C = f32(3 * math.sqrt(2.0 / math.pi) * 0.044715)

FLAGS = {"contract", "arcp", "reassoc", "nsz"}  # no "nnan"/"ninf": NaN and inf inputs keep IEEE results
# one core (no ``parallel=True``: a third thread pool beside OpenBLAS's and PyTorch's made a transformer step
# slower); error_model="numpy": no zero-division branch, so the loops vectorise
jit = numba.njit(fastmath=FLAGS, nogil=True, cache=True, error_model="numpy")
inline = numba.njit(inline="always", fastmath=FLAGS, error_model="numpy", cache=True)


@inline
def erf(v):  # +-1 beyond +-4, as the NumPy kernel
    z = min(max(v, -FOUR), FOUR)
    z2 = z * z
    p = ((((((EP0 * z2 + EP1) * z2 + EP2) * z2 + EP3) * z2 + EP4) * z2 + EP5) * z2 + EP6) * z
    q = (((EQ0 * z2 + EQ1) * z2 + EQ2) * z2 + EQ3) * z2 + EQ4
    return p / q


@inline
def exp_neg(v):  # exp(v) for v <= 0 (0 below -85)
    w = v
    v = max(v, LO85)
    n = np.floor(v * LOG2E + HALF)
    r = v - n * LN2_HI - n * LN2_LO
    y = (((((XP0 * r + XP1) * r + XP2) * r + XP3) * r + XP4) * r + XP5) * r * r + r + ONE
    m = np.int32(-n)  # 0..123; 2^-m = (2^-(m >> 3))^8 2^-(m & 7), each power of two exact
    s = ONE / np.float32(np.int32(1) << (m >> 3))
    s = s * s
    s = s * s
    y = y * (s * s) / np.float32(np.int32(1) << (m & 7))
    return y if w >= LO85 else ZERO


@inline
def sigmoid2(u):  # (1 + tanh u) / 2 = 1 / (1 + exp(-2u)), without the cancellation of 1 + tanh u near -1
    e = exp_neg(-TWO * abs(u))
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
        out[i] = g[i] * (HALF * (ONE + erf(v * R2)) + v * exp_neg(-HALF * v * v) * RPI)


@jit
def gelu_grad_tanh(g, x, out):
    for i in range(x.size):
        v = x[i]
        v2 = v * v
        u = v * (K + K * C * v2)
        s, s1 = sigmoid2(u), sigmoid2(-u)  # 1 - tanh^2 = 4 s (1 - s)
        out[i] = g[i] * (s + TWO * v * s * s1 * (K + K3C * v2))


KERNELS = {("gelu", "none"): gelu_erf, ("gelu", "tanh"): gelu_tanh,
           ("gelu_grad", "none"): gelu_grad_erf, ("gelu_grad", "tanh"): gelu_grad_tanh}
