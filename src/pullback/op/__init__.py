"""Operator builders by Relay name: ``pullback.op.add(x, y)``, ``pullback.op.nn.dense(x, w)``.

Each attribute is the registered ``OpDef``; calling it builds a ``Call``.
"""

from __future__ import annotations

from .. import ops as _ops
from ..ops.registry import get_op as _get_op
from ..ops.registry import list_ops as _list_ops
from . import nn  # noqa: F401


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return _get_op(name)
    except Exception:
        raise AttributeError(f"pullback.op has no operator {name!r}") from None


def __dir__():
    return sorted([o.name for o in _list_ops() if "." not in o.name] + ["nn"])


_ = _ops
