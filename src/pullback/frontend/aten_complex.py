"""ATen converters for complex tensors: the Fourier transforms (``_fft_r2c``, ``_fft_c2r``, ``_fft_c2c``),
``view_as_real`` / ``view_as_complex``, conjugation, ``abs`` and ``angle`` of a complex tensor, ``complex`` and
``polar``. Registered in
``aten_table.ATEN_TABLE``; ``torch.fft.*``, ``Tensor.real``/``.imag`` and complex arithmetic reach the importer
as these (and the promoting arithmetic of ``aten_table``) after decomposition.
"""

from __future__ import annotations

import math

from ..ir.types import is_complex, real_of
from .aten_table import ATEN_TABLE, _op, aten, cast, expand_to, scalar


@aten("aten._fft_r2c.default")
def _fft_r2c(cx, x, dim, normalization, onesided):
    return _op("fft_r2c")(x, tuple(dim), int(normalization), bool(onesided))


@aten("aten._fft_c2r.default")
def _fft_c2r(cx, x, dim, normalization, last_dim_size):
    return _op("fft_c2r")(x, tuple(dim), int(normalization), int(last_dim_size))


@aten("aten._fft_c2c.default")
def _fft_c2c(cx, x, dim, normalization, forward):
    return _op("fft_c2c")(x, tuple(dim), int(normalization), bool(forward))


@aten("aten.view_as_real.default")
def _view_as_real(cx, x):
    return _op("view_as_real")(x)


@aten("aten.view_as_complex.default")
def _view_as_complex(cx, x):
    return _op("view_as_complex")(x)


@aten("aten._conj.default", "aten.conj_physical.default", "aten._conj_physical.default", "aten.conj.default")
def _conj(cx, x):
    """The conjugate (PyTorch's lazy ``_conj`` as a value); a real tensor is its own conjugate."""
    return _op("conj")(x) if is_complex(cx.dtype_of(x)) else x


@aten("aten.resolve_conj.default", "aten.resolve_neg.default")
def _resolve(cx, x):
    """Materialising a lazy conjugate or negation: the value is already what the lazy view reads."""
    return x


_real_abs = ATEN_TABLE["aten.abs.default"]


@aten("aten.abs.default")
def _abs(cx, x):
    """``|z|`` of a complex tensor (a real tensor); real tensors as before."""
    return _op("complex_abs")(x) if is_complex(cx.dtype_of(x)) else _real_abs(cx, x)



def _from_parts(cx, re, im):
    """The complex tensor ``re + i im`` (broadcast to the result's shape, in its real dtype)."""
    dt, shape = real_of(cx.out_dtype), tuple(cx.out_shape)
    parts = [expand_to(cx, cast(cx, v, dt), shape) for v in (re, im)]
    return _op("view_as_complex")(_op("stack")(parts, axis=len(shape)))


@aten("aten.complex.default")
def _complex(cx, re, im):
    return _from_parts(cx, re, im)


@aten("aten.polar.default")
def _polar(cx, r, theta):
    """``r (cos theta + i sin theta)``."""
    return _from_parts(cx, _op("multiply")(r, _op("cos")(theta)), _op("multiply")(r, _op("sin")(theta)))


@aten("aten.angle.default")
def _angle(cx, x):
    """``atan2(imag, real)`` of a complex tensor; of a real one, pi where it is negative, 0 elsewhere, NaN at NaN
    (no gradient, as in PyTorch)."""
    if is_complex(cx.dtype_of(x)):
        parts = _op("view_as_real")(x)
        n = len(cx.shape_of(x))
        im, re = (_op("squeeze")(_op("strided_slice")(parts, (k,), (k + 1,), (1,), (n,)), (n,)) for k in (1, 0))
        return _op("atan2")(im, re)
    dt = cx.out_dtype
    x = cast(cx, x, dt)
    sign = _op("where")(_op("less")(x, scalar(0, dt)), scalar(math.pi, dt), scalar(0, dt))
    return _op("stop_gradient")(_op("where")(_op("isnan")(x), x, sign))
