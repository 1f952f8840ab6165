"""Bitwise operators on integer and bool tensors (``&``, ``|``, ``^``, ``~``; on bools the logical ones), and the
greatest common divisor and least common multiple of integer tensors (``torch.gcd``, ``torch.lcm``, ``np.lcm``).

They carry no gradient: their operands are integers or booleans.
"""

from __future__ import annotations

from ..ir.types import INT_DTYPES, TensorType
from .common import broadcast_shapes, numel, same_dtype, tensor_arg
from .registry import FusionKind, defop, type_error

_NO_GRAD = "integer and boolean operands carry no gradient"
_DTYPES = tuple(INT_DTYPES) + ("bool",)
_KINDS = set(_DTYPES)


def _check(name: str, arg_types, i: int, kinds=_KINDS) -> TensorType:
    t = tensor_arg(name, arg_types, i)
    if t.dtype not in kinds:
        what = "an integer or bool" if "bool" in kinds else "an integer"
        raise type_error(name, arg_types, f"argument {i} must be {what} tensor, got {t.dtype}")
    return t


def _flops(arg_types, out_type, attrs):
    return numel(out_type.shape)


def _binary(name: str, fn_name: str, dtypes: tuple = _DTYPES, doc: str = ""):
    kinds = set(dtypes)

    def infer(arg_types, attrs):
        a, b = _check(name, arg_types, 0, kinds), _check(name, arg_types, 1, kinds)
        return TensorType(broadcast_shapes(name, arg_types, a.shape, b.shape), same_dtype(name, arg_types))

    def kernel(xp, a, b, attrs=None):
        return getattr(xp, fn_name)(a, b)

    return defop(name, 2, infer, kernel=kernel, differentiable=False, nondiff_reason=_NO_GRAD, pattern=FusionKind.BROADCAST,
                 flops=_flops, torch_name=name, dtypes=dtypes, elementwise=True,
                 doc=doc or f"Elementwise ``{name}`` of integer or bool tensors (broadcasting).")


bitwise_and = _binary("bitwise_and", "bitwise_and")
bitwise_or = _binary("bitwise_or", "bitwise_or")
bitwise_xor = _binary("bitwise_xor", "bitwise_xor")
gcd = _binary("gcd", "gcd", tuple(INT_DTYPES), "Elementwise greatest common divisor of integer tensors (non-negative; "
              "``gcd(0, 0) = 0``), broadcasting.")
lcm = _binary("lcm", "lcm", tuple(INT_DTYPES), "Elementwise least common multiple of integer tensors (non-negative; "
              "0 when either is 0), broadcasting.")


def _not_infer(arg_types, attrs):
    return _check("bitwise_not", arg_types, 0)


bitwise_not = defop("bitwise_not", 1, _not_infer, kernel=lambda xp, x, attrs=None: xp.bitwise_invert(x), differentiable=False,
                    nondiff_reason=_NO_GRAD, pattern=FusionKind.ELEMWISE, flops=_flops, torch_name="bitwise_not",
                    dtypes=_DTYPES, elementwise=True,
                    doc="``~x`` of an integer or bool tensor (logical not on bools).")

__all__ = ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "gcd", "lcm"]
