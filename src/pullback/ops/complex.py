"""Complex numbers: ``view_as_real`` / ``view_as_complex``, ``conj``, ``complex_abs`` and the discrete Fourier
transforms of ATen (``fft_r2c``, ``fft_c2r``, ``fft_c2c``, with ATen's attributes).

Complex tensors (``complex64``, ``complex128``) are accepted only by the operators that say so: these, the
arithmetic ``add``/``subtract``/``multiply``/``divide``/``negative``, ``cast`` and the shape operators.
Gradients follow PyTorch's convention: the cotangent of a complex ``z`` is ``dL/dRe(z) + i dL/dIm(z)`` for a
real loss ``L``, so the vector-Jacobian product of a complex-linear map is its conjugate transpose.

A transform's ``normalization`` is ATen's: 0 no scaling, 1 by ``1/sqrt(n)``, 2 by ``1/n``, where ``n`` is the
number of points of the transformed axes (of the real signal for ``fft_c2r``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr, const
from ..ir.types import COMPLEX_DTYPES, Any, TensorType, complex_of, is_complex, real_of
from . import layout as T
from .common import normalize_axes, numel, tensor_arg
from .kernels import dtype, dtype_name
from .nn import on_device
from .registry import FusionKind, defop, get_op, type_error

# ------------------------------------------------------------------ real and imaginary parts


def _complex_arg(op: str, arg_types, i: int = 0) -> TensorType:
    t = tensor_arg(op, arg_types, i)
    if not is_complex(t.dtype):
        raise type_error(op, arg_types, f"argument {i} must be a complex tensor, got {t.dtype}")
    return t


def _view_as_real_infer(arg_types, attrs):
    x = _complex_arg("view_as_real", arg_types)
    return TensorType(x.shape + (2,), real_of(x.dtype))


view_as_real = defop(
    "view_as_real", 1, _view_as_real_infer,
    kernel=lambda xp, x, attrs=None: xp.stack([xp.real(x), xp.imag(x)], axis=-1),
    grad=lambda c, g: [view_as_complex(g)], dtypes=COMPLEX_DTYPES, pattern=FusionKind.INJECTIVE,
    torch_name="view_as_real",
    doc="The real and imaginary parts of a complex tensor along a new last axis of 2 (``torch.view_as_real``).",
)


def _view_as_complex_infer(arg_types, attrs):
    x = tensor_arg("view_as_complex", arg_types, 0)
    if x.dtype not in ("float32", "float64"):
        raise type_error("view_as_complex", arg_types, f"argument 0 must be a float32 or float64 tensor, got {x.dtype}")
    if not x.shape or x.shape[-1] not in (2, Any):
        raise type_error("view_as_complex", arg_types, f"the last axis must have size 2 (real, imaginary), got shape {x.shape}")
    return TensorType(x.shape[:-1], complex_of(x.dtype))


def _view_as_complex_numpy(x, attrs=None):
    out = np.empty(x.shape[:-1], dtype=complex_of(x.dtype.name))
    out.real, out.imag = x[..., 0], x[..., 1]
    return out


def _view_as_complex_torch(x, attrs=None):
    import torch

    return torch.complex(x[..., 0], x[..., 1])


def _view_as_complex_jax(x, attrs=None):
    import jax

    return jax.lax.complex(x[..., 0], x[..., 1])


view_as_complex = defop(
    "view_as_complex", 1, _view_as_complex_infer,
    impls={"numpy": _view_as_complex_numpy, "torch": _view_as_complex_torch, "jax": _view_as_complex_jax},
    grad=lambda c, g: [view_as_real(g)], dtypes=("float32", "float64"), pattern=FusionKind.INJECTIVE,
    torch_name="view_as_complex",
    doc="The complex tensor whose real and imaginary parts are the last axis (of size 2) of ``x``.",
)


def _complex_unary_infer(name: str, real_result: bool):
    def infer(arg_types, attrs):
        x = _complex_arg(name, arg_types)
        return TensorType(x.shape, real_of(x.dtype)) if real_result else x

    return infer


conj = defop("conj", 1, _complex_unary_infer("conj", False), kernel=lambda xp, x, attrs=None: xp.conj(x),
             grad=lambda c, g: [conj(g)], dtypes=COMPLEX_DTYPES, elementwise=True, pattern=FusionKind.ELEMWISE,
             torch_name="conj_physical", doc="The complex conjugate.")


def _complex_abs_grad(call: Call, g: Expr):
    """PyTorch's ``grad * sgn(z)``: ``z / |z|``, 0 where ``z`` is 0."""
    z = call.args[0]
    cd = z.checked_type.dtype
    safe = get_op("where")(get_op("equal")(call, const(0.0, real_of(cd))), const(1.0, real_of(cd)), call)
    return [get_op("multiply")(get_op("cast")(g, cd), get_op("divide")(z, get_op("cast")(safe, cd)))]


complex_abs = defop("complex_abs", 1, _complex_unary_infer("complex_abs", True),
                    kernel=lambda xp, x, attrs=None: xp.abs(x), grad=_complex_abs_grad, dtypes=COMPLEX_DTYPES,
                    elementwise=True, pattern=FusionKind.ELEMWISE, flops=lambda ts, out, a: 3 * numel(out.shape),
                    torch_name="abs", doc="The magnitude ``|z|`` of a complex tensor (a real tensor).")

# ------------------------------------------------------------------ Fourier transforms

_FORWARD_NORM = ("backward", "ortho", "forward")  # ATen normalization 0/1/2 as NumPy's norm= of a forward transform
_INVERSE_NORM = ("forward", "ortho", "backward")  # ... and of an inverse one


def _check_fft_attrs(attrs) -> None:
    try:
        axes = tuple(int(a) for a in attrs.axes)
    except TypeError:
        raise AttrError(f"attribute axes must be a sequence of ints, got {attrs.axes!r}") from None
    if not axes:
        raise AttrError("attribute axes must name at least one axis")
    object.__setattr__(attrs, "axes", axes)
    if attrs.normalization not in (0, 1, 2):
        raise AttrError(f"attribute normalization must be 0 (none), 1 (1/sqrt(n)) or 2 (1/n), got {attrs.normalization!r}")


@dataclass(frozen=True)
class FftR2CAttrs:
    """``onesided``: keep the ``n // 2 + 1`` non-redundant entries of the last transformed axis."""

    axes: tuple
    normalization: int = 0
    onesided: bool = True

    def __post_init__(self):
        _check_fft_attrs(self)


@dataclass(frozen=True)
class FftC2RAttrs:
    """``last_size``: the length of the real signal along the last transformed axis."""

    axes: tuple
    normalization: int = 0
    last_size: int = 1

    def __post_init__(self):
        _check_fft_attrs(self)
        if isinstance(self.last_size, bool) or not isinstance(self.last_size, (int, np.integer)) or self.last_size < 1:
            raise AttrError(f"attribute last_size must be a positive int, got {self.last_size!r}")


@dataclass(frozen=True)
class FftC2CAttrs:
    """``forward``: the forward transform (``exp(-2 pi i jk/n)``); False: the inverse one, unscaled but for
    ``normalization``."""

    axes: tuple
    normalization: int = 0
    forward: bool = True

    def __post_init__(self):
        _check_fft_attrs(self)


def _fft_axes(op: str, x: TensorType, attrs, arg_types) -> tuple:
    normalize_axes(op, attrs.axes, x.ndim, arg_types)  # in range, none repeated
    return tuple(a % x.ndim for a in attrs.axes)  # in the order given: the last one is the one-sided axis


def _r2c_infer(arg_types, attrs):
    x = tensor_arg("fft_r2c", arg_types, 0)
    if x.dtype not in ("float32", "float64"):
        raise type_error("fft_r2c", arg_types, f"argument 0 must be a float32 or float64 tensor, got {x.dtype}")
    last = _fft_axes("fft_r2c", x, attrs, arg_types)[-1]
    shape = list(x.shape)
    if attrs.onesided and shape[last] is not Any:
        shape[last] = shape[last] // 2 + 1
    elif attrs.onesided:
        shape[last] = Any
    return TensorType(tuple(shape), complex_of(x.dtype))


def _c2r_infer(arg_types, attrs):
    x = _complex_arg("fft_c2r", arg_types)
    last = _fft_axes("fft_c2r", x, attrs, arg_types)[-1]
    if x.shape[last] is not Any and x.shape[last] != attrs.last_size // 2 + 1:
        raise type_error("fft_c2r", arg_types, f"axis {last} holds {x.shape[last]} entries; a one-sided spectrum of "
                         f"last_size={attrs.last_size} holds {attrs.last_size // 2 + 1}")
    shape = list(x.shape)
    shape[last] = attrs.last_size
    return TensorType(tuple(shape), real_of(x.dtype))


def _c2c_infer(arg_types, attrs):
    x = _complex_arg("fft_c2c", arg_types)
    _fft_axes("fft_c2c", x, attrs, arg_types)
    return x


def _empty_batch(xp, x, axes, last: int, dtype_out):
    """The (empty) result of a transform of ``x`` when ``x`` holds no element but its transformed axes do (an
    empty batch), ``last`` entries along the last transformed axis; None otherwise. MKL's FFT (torch) refuses
    such a batch where NumPy and XLA return it empty."""
    if math.prod(x.shape) or not all(x.shape[a] for a in axes):
        return None
    shape = list(x.shape)
    shape[axes[-1] % x.ndim] = last
    return xp.zeros(tuple(shape), dtype=dtype_out, **on_device(xp, x))


def _r2c_kernel(xp, x, attrs):
    out_dtype = dtype(xp, complex_of(dtype_name(x)))
    n = x.shape[attrs.axes[-1]]
    empty = _empty_batch(xp, x, attrs.axes, n // 2 + 1 if attrs.onesided else n, out_dtype)
    if empty is not None:
        return empty
    norm = _FORWARD_NORM[attrs.normalization]
    out = (xp.fft.rfftn if attrs.onesided else xp.fft.fftn)(x, axes=attrs.axes, norm=norm)
    return xp.astype(out, out_dtype)


def _c2r_kernel(xp, x, attrs):
    out_dtype = dtype(xp, real_of(dtype_name(x)))
    empty = _empty_batch(xp, x, attrs.axes, attrs.last_size, out_dtype)
    if empty is not None:
        return empty
    s = [x.shape[a] for a in attrs.axes[:-1]] + [attrs.last_size]
    out = xp.fft.irfftn(x, s=s, axes=attrs.axes, norm=_INVERSE_NORM[attrs.normalization])
    return xp.astype(out, out_dtype)


def _c2c_kernel(xp, x, attrs):
    empty = _empty_batch(xp, x, attrs.axes, x.shape[attrs.axes[-1]], x.dtype)
    if empty is not None:
        return empty
    fn, norm = (xp.fft.fftn, _FORWARD_NORM) if attrs.forward else (xp.fft.ifftn, _INVERSE_NORM)
    return xp.astype(fn(x, axes=attrs.axes, norm=norm[attrs.normalization]), x.dtype)


def _r2c_grad(call: Call, g: Expr):
    """The real part of the inverse transform of the cotangent, zero-padded to the full length when one-sided."""
    x, a = call.args[0], call.attrs
    full = g
    if a.onesided:
        last = a.axes[-1]
        n, have = x.checked_type.shape[last], call.checked_type.shape[last]
        if n != have:
            shape = list(call.checked_type.shape)
            shape[last] = n - have
            full = get_op("concatenate")([g, T.zeros(tuple(shape), call.checked_type.dtype)], last)
    return [get_op("cast")(fft_c2c(full, a.axes, a.normalization, False), x.checked_type.dtype)]


def _c2r_grad(call: Call, g: Expr):
    """The one-sided forward transform of the cotangent, entries ``1 .. n - (n//2 + 1)`` doubled (they stand for
    their conjugate-symmetric partners too)."""
    x, a = call.args[0], call.attrs
    gx = fft_r2c(g, a.axes, a.normalization, True)
    half = x.checked_type.shape[a.axes[-1]]
    double = a.last_size - half
    if double > 0:
        scale = np.ones(half, dtype=x.checked_type.dtype)
        scale[1:1 + double] = 2
        ndim = x.checked_type.ndim
        scale = scale.reshape([half if k == a.axes[-1] else 1 for k in range(ndim)])
        gx = get_op("multiply")(gx, const(scale))
    return [gx]


def _fft_flops(ts, out, attrs) -> int:
    n = math.prod(d for d in (out.shape or (1,)) if d is not Any)
    points = max(math.prod(ts[0].shape[a] for a in attrs.axes if ts[0].shape[a] is not Any), 2)
    return int(5 * n * math.log2(points))


_FFT = dict(pattern=FusionKind.OPAQUE, flops=_fft_flops)
fft_r2c = defop("fft_r2c", 1, _r2c_infer, kernel=_r2c_kernel, attrs_type=FftR2CAttrs, grad=_r2c_grad,
                dtypes=("float32", "float64"), torch_name="_fft_r2c", **_FFT,
                doc="The DFT of a real tensor over ``axes`` (ATen's ``_fft_r2c``): complex, one-sided by default.")
fft_c2r = defop("fft_c2r", 1, _c2r_infer, kernel=_c2r_kernel, attrs_type=FftC2RAttrs, grad=_c2r_grad,
                dtypes=COMPLEX_DTYPES, torch_name="_fft_c2r", **_FFT,
                doc="The real inverse DFT of a one-sided spectrum over ``axes`` (ATen's ``_fft_c2r``).")
fft_c2c = defop("fft_c2c", 1, _c2c_infer, kernel=_c2c_kernel, attrs_type=FftC2CAttrs,
                grad=lambda c, g: [fft_c2c(g, c.attrs.axes, c.attrs.normalization, not c.attrs.forward)],
                dtypes=COMPLEX_DTYPES, torch_name="_fft_c2c", **_FFT,
                doc="The complex DFT over ``axes`` (ATen's ``_fft_c2c``), forward or inverse.")

__all__ = ["FftC2CAttrs", "FftC2RAttrs", "FftR2CAttrs", "complex_abs", "conj", "fft_c2c", "fft_c2r",
           "fft_r2c", "view_as_complex", "view_as_real"]
