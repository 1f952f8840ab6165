"""Symbolic zeros: a cotangent known to be zero is carried as ``Zero(type)``, never built.

Like JAX's ``ad_util.Zero``: a rule that returns no gradient (``None``) or an
explicit ``zeros``/``zeros_like`` contributes a ``Zero``, and adding a ``Zero``
is dropping it. A cotangent is materialised (``ZeroFill``, JAX's
``instantiate_zeros``) only where a value is really needed: the gradient of a
parameter nothing reaches, a field of a tuple-valued cotangent, a field of a
gradient ``If`` that only one branch contributes to, the other side of a
widened forward ``If``.

``ZeroFill`` builds one node per type: ``zeros(shape, dtype)`` per static
tensor type, one ``Tuple`` per tuple type object (so the zeros of a nested
residual bundle reuse the zeros of the bundles inside it), ``zeros_like(value)``
for a dynamic shape.
"""

from __future__ import annotations

from typing import Optional

from ...ir.expr import Call, Expr, Tuple
from ...ir.types import TensorType, TupleType, Type
from ...ops.registry import get_op
from .common import Path, at_path, build_struct, static_type, typed_as

_ZERO_OPS = tuple(get_op(n) for n in ("zeros", "zeros_like"))
_zeros, _zeros_like = _ZERO_OPS


class Zero:
    """The symbolic zero cotangent of a value of type ``type``."""

    __slots__ = ("type",)

    def __init__(self, ty: Type):
        self.type = ty

    def __repr__(self) -> str:
        return f"Zero({self.type!r})"


def is_zero(ct) -> bool:
    """``ct`` adds nothing: ``None``, a ``Zero``, or a call to ``zeros``/``zeros_like``."""
    return ct is None or type(ct) is Zero or (type(ct) is Call and ct.op in _ZERO_OPS)


class ZeroFill:
    """Materialised zeros, shared: one node per static tensor type and per tuple type object."""

    def __init__(self):
        self._tensors: dict[TensorType, Expr] = {}
        self._tuples: dict[int, tuple[Type, Expr]] = {}  # id(type) -> (type kept alive, its zeros)

    def tensor(self, ty: TensorType, like: Optional[Expr] = None) -> Expr:
        """Zeros of tensor type ``ty``; ``like`` (a value of that type) is needed when ``ty`` is dynamic."""
        if not ty.is_static:
            return _zeros_like(like)
        node = self._tensors.get(ty)
        if node is None:
            node = self._tensors[ty] = _zeros(ty.shape, ty.dtype)
        return node

    def static(self, ty: Type) -> Expr:
        """Zeros of a static (tuple) type, typed ``ty`` itself; nested tuple types reuse their zeros."""
        if isinstance(ty, TensorType):
            return self.tensor(ty)
        stack = [(ty, False)]
        tuples = self._tuples
        while stack:
            t, ready = stack.pop()
            if id(t) in tuples:
                continue
            if not ready:
                stack.append((t, True))
                stack.extend((f, False) for f in t.fields if isinstance(f, TupleType) and id(f) not in tuples)
                continue
            fields = [tuples[id(f)][1] if isinstance(f, TupleType) else self.tensor(f) for f in t.fields]
            tuples[id(t)] = (t, typed_as(Tuple(fields), t))
        return tuples[id(ty)][1]

    def instantiate(self, node: Expr, ct, path: Path = ()) -> Expr:
        """The cotangent ``ct`` of ``node`` at ``path`` as a value: ``ct`` is a ``Zero`` or per-leaf
        cotangents ``{leaf path (relative to path): expression}``; zeros on every leaf without one."""
        leaves = {} if type(ct) is Zero else ct
        if () in leaves:
            return leaves[()]
        ty = node.checked_type
        for i in path:
            ty = ty.fields[i]
        if not leaves and static_type(ty):
            return self.static(ty)
        return build_struct(ty, lambda p, t: leaves[p] if p in leaves else self.tensor(t, None if t.is_static else at_path(node, path + p)))
