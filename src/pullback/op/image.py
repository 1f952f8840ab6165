"""Image operator builders: ``pullback.op.image.resize2d(x, size=(64, 64))``."""

from __future__ import annotations

from .nn import _names, _op_getattr

__getattr__ = _op_getattr("image.", "pullback.op.image", globals())


def __dir__():
    return _names("image.")
