"""Operators about differentiation itself: ``stop_gradient`` (PyTorch's ``detach``, JAX's ``lax.stop_gradient``).

``stop_gradient(x)`` is ``x`` in the forward and passes no gradient back: its rule returns no gradient
(None), so everything upstream of it sees a zero contribution through this use.
"""

from __future__ import annotations

from ..ir.expr import Call, Expr
from ..ir.types import ALL_DTYPES
from .common import tensor_arg
from .registry import FusionKind, defop, zero_flops


def _infer(arg_types, attrs):
    return tensor_arg("stop_gradient", arg_types, 0)


def _grad(call: Call, g: Expr):
    return [None]


# elementwise, any dtype; smooth=False: its derivative is zero by definition (finite differences see 1), so
# generated programs use it where values are checked, not gradients
stop_gradient = defop("stop_gradient", 1, _infer, kernel=lambda xp, x, attrs=None: x, grad=_grad, pattern=FusionKind.ELEMWISE,
                      flops=zero_flops, torch_name="detach", elementwise=True, smooth=False,
                      dtypes=ALL_DTYPES, doc="``x`` unchanged in the forward, no gradient in the backward (``Tensor.detach``).")

__all__ = ["stop_gradient"]
