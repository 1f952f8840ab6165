"""Operator builders by Relay name: ``pullback.op.add(x, y)``, ``pullback.op.nn.dense(x, w)``,
``pullback.op.image.resize2d(x, size)``.

Each attribute is the registered ``OpDef``; calling it builds a ``Call``.
"""

from __future__ import annotations

from .. import ops as _ops  # noqa: F401 (registers every operator)
from ..ops.registry import list_ops as _list_ops
from . import image, nn  # noqa: F401
from .nn import _op_getattr

__getattr__ = _op_getattr("", "pullback.op", globals())


def __dir__():
    return sorted([o.name for o in _list_ops() if "." not in o.name] + ["image", "nn"])
