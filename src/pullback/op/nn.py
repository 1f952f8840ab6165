"""Neural-network operator builders: ``pullback.op.nn.dense(x, w)`` and friends."""

from __future__ import annotations

from ..ops.registry import get_op as _get_op
from ..ops.registry import list_ops as _list_ops


def _op_getattr(prefix: str, where: str, namespace: dict):
    """A module ``__getattr__`` (PEP 562) giving the operator named ``prefix + name``, kept in the module's
    ``namespace`` once found (operator names are never re-registered), so later lookups are plain."""
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            found = _get_op(prefix + name)
        except Exception:
            raise AttributeError(f"{where} has no operator {name!r}") from None
        namespace[name] = found
        return found
    return __getattr__


def _names(prefix: str) -> list:
    """The names after ``prefix`` of the operators named ``prefix + name`` (a namespace's ``__dir__``)."""
    return sorted(o.name[len(prefix):] for o in _list_ops() if o.name.startswith(prefix))


__getattr__ = _op_getattr("nn.", "pullback.op.nn", globals())


def __dir__():
    return _names("nn.")
