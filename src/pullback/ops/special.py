"""Special functions shared by operator kernels (erf for ``erf`` and ``nn.gelu``).

SciPy's vectorised ``erf`` is used when SciPy is installed (extra ``pullback[fast]``);
otherwise libm's ``math.erf`` element by element (exact, slower). Results keep
the input's floating dtype.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

_erf_scalar = np.frompyfunc(math.erf, 1, 1)


@lru_cache(maxsize=None)
def _scipy_erf():
    try:
        from scipy.special import erf  # type: ignore
    except ImportError:
        return None
    return erf


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf of a float array, in its dtype (float16 computed in float32)."""
    x = np.asarray(x)
    fast = _scipy_erf()
    if fast is not None:
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        return np.asarray(fast(work), dtype=x.dtype)
    return np.asarray(_erf_scalar(x.astype(np.float64)), dtype=x.dtype)
