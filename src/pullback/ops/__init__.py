"""Operator definitions. Importing this package registers every operator."""

from ..ir.expr import install_arith
from . import elemwise, layout, nn, reduce  # noqa: F401  (registration)
from . import indexing, shape  # noqa: F401  (registration)
from . import activation, attention, conv, linalg, loss, norm, pool, quant  # noqa: F401  (nn.* registration)
from . import autodiff, bitwise, math, scan, scatter, sorting  # noqa: F401  (operators the PyTorch importer needs)
from . import complex  # noqa: F401  (complex tensors and Fourier transforms)
from . import grouped  # noqa: F401  (mixture-of-experts GEMMs)
from . import image  # noqa: F401  (bilinear resizing)
from . import elman, gru, lstm  # noqa: F401  (recurrent layers)
from .registry import FusionKind, OpDef, Recompute, defop, get_op, has_op, is_call_to, list_ops, register

for _name in ("add", "subtract", "multiply", "divide", "negative"):
    install_arith(_name, get_op(_name))

__all__ = ["FusionKind", "OpDef", "Recompute", "defop", "get_op", "has_op", "is_call_to", "list_ops", "register"]
