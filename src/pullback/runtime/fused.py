"""Fused groups as single kernels, and fast float32 kernels for slow reference ops.

``compile_group(fn)`` turns a primitive Function (``Primitive=1``, made by
FuseOps) into one closure ``kernel(*args, attrs)``. Its body is a flat list of
steps over integer slots. Elementwise float steps call a NumPy ufunc with
``out=``: the result goes into an operand's buffer when that operand (a) was
allocated inside this call of the group, (b) dies at this step and (c) has the
result's static shape and dtype; otherwise NumPy allocates a new buffer, which
the group then owns. Parameters, constants and results of other kernels that
may alias them are never written. Steps that are not elementwise call the op's
kernel. A chain ``tanh -> multiply -> subtract`` therefore runs in one buffer.

``fast_kernel(op)`` is the kernel the executor runs for ``op``: the reference
``op.compute``, except for the ops in ``FAST`` (erf, gelu) whose reference
kernels compute in float64 through Python scalars; their float32 versions are
vectorised (Abramowitz-Stegun 7.1.26, absolute error < 1.5e-7).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ir.expr import Call, Constant, Function, Tuple, TupleGetItem, Var
from ..ir.traversal import post_order
from ..ir.types import Any, TensorType
from ..ops.registry import OpDef

# ------------------------------------------------------------------ fast float32 kernels

_P, _A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_FAST_DTYPES = (np.dtype("float32"),)  # float16 would lose digits to cancellation: reference kernel


def erf32(x: np.ndarray) -> np.ndarray:
    """erf of float32 ``x`` in float32, vectorised; absolute error < 1.5e-7 + rounding."""
    dt = x.dtype
    ax = np.abs(x)
    t = ax * dt.type(_P)
    t += dt.type(1.0)
    np.reciprocal(t, out=t)
    poly = t * dt.type(_A[4])
    for a in _A[3::-1]:
        poly += dt.type(a)
        poly *= t
    np.square(ax, out=ax)
    np.negative(ax, out=ax)
    np.exp(ax, out=ax)
    poly *= ax
    np.subtract(dt.type(1.0), poly, out=poly)
    return np.copysign(poly, x, out=poly)


def _erf_fast(x, attrs=None):
    return erf32(x)


def _gelu_fast(x, attrs):
    if attrs.approximate == "tanh":
        return None
    out = erf32(x * x.dtype.type(1.0 / math.sqrt(2.0)))
    out += x.dtype.type(1.0)
    out *= x
    out *= x.dtype.type(0.5)
    return out


# op name -> kernel for float32/16 data (returns None to defer to the reference kernel)
FAST: dict[str, Callable] = {"erf": _erf_fast, "nn.gelu": _gelu_fast}


def fast_kernel(op: OpDef) -> Callable:
    """The kernel to run for ``op``: its ``compute``, or a vectorised float32 version from ``FAST``."""
    fast = FAST.get(op.name)
    if fast is None:
        return op.compute
    ref = op.compute

    def kernel(x, attrs=None):
        if getattr(x, "dtype", None) in _FAST_DTYPES:
            out = fast(x, attrs)
            if out is not None:
                return out
        return ref(x, attrs)

    kernel.__name__ = f"fast_{op.name}"
    return kernel


# ------------------------------------------------------------------ fused groups

# op name -> ufunc computing it exactly like the op's kernel on float tensors
UFUNCS: dict[str, np.ufunc] = {
    "negative": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "log2": np.log2, "log1p": np.log1p,
    "sqrt": np.sqrt, "square": np.square, "reciprocal": np.reciprocal, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "tanh": np.tanh, "floor": np.floor, "ceil": np.ceil,
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power,
}
UFUNC_STEP, KERNEL_STEP, TUPLE_STEP, GET_STEP = range(4)


def _static_float(t) -> bool:
    return isinstance(t, TensorType) and t.dtype.startswith("float") and all(d is not Any for d in t.shape)


def group_label(fn: Function) -> str:
    """``fused(op+op+...)``: the profile row name of a group."""
    names = [n.op.name for n in post_order(fn.body) if isinstance(n, Call) and isinstance(n.op, OpDef)]
    return "fused(" + "+".join(names) + ")"


def compile_group(fn: Function) -> Callable:
    """One closure ``kernel(*args, attrs)`` running the primitive Function ``fn`` (typed)."""
    order = post_order(fn.body)
    slot: dict[int, int] = {id(p): i for i, p in enumerate(fn.params)}
    template: list = [None] * len(fn.params)
    for n in order:
        if id(n) in slot:
            continue
        slot[id(n)] = len(template)
        template.append(n.data if isinstance(n, Constant) else None)
    last: dict[int, int] = {}  # slot -> index of the step that uses it last
    nodes = [n for n in order if not isinstance(n, (Var, Constant))]
    for i, n in enumerate(nodes):
        for c in n.children():
            last[slot[id(c)]] = i
    result = slot[id(fn.body)]
    steps: list = []
    escaped: set = set()  # slots another kernel or a tuple has seen: a view of them may live on
    for i, n in enumerate(nodes):
        out = slot[id(n)]
        if not (isinstance(n, Call) and isinstance(n.op, OpDef) and n.op.name in UFUNCS):
            escaped.update(slot[id(c)] for c in n.children())
        if isinstance(n, Tuple):
            steps.append((TUPLE_STEP, None, tuple(slot[id(f)] for f in n.fields), out, ()))
            continue
        if isinstance(n, TupleGetItem):
            steps.append((GET_STEP, n.index, (slot[id(n.tuple_value)],), out, ()))
            continue
        if not isinstance(n, Call) or not isinstance(n.op, OpDef):
            raise TypeError(f"compile_group: unexpected {type(n).__name__} in a primitive function")
        args = tuple(slot[id(a)] for a in n.args)
        ty = n.checked_type
        uf = UFUNCS.get(n.op.name)
        if uf is not None and _static_float(ty) and all(isinstance(a.checked_type, TensorType)
                                                      and a.checked_type.dtype == ty.dtype for a in n.args):
            # operands whose buffer may take the result: call results dying here, same shape and dtype
            cands = tuple(k for k, a in zip(args, n.args) if isinstance(a, Call) and last.get(k) == i
                          and k != result and k not in escaped and tuple(a.checked_type.shape) == tuple(ty.shape))
            steps.append((UFUNC_STEP, uf, args, out, cands))
        else:
            steps.append((KERNEL_STEP, (fast_kernel(n.op), n.attrs), args, out, ()))
    frees: list = [[] for _ in steps]
    for k, i in last.items():
        if k >= len(fn.params) and template[k] is None and k != result:
            frees[i].append(k)
    code = [s + (tuple(f),) for s, f in zip(steps, frees)]
    nparams = len(fn.params)
    protected = [k for k in range(len(template)) if k < nparams or template[k] is not None]

    def kernel(*args):
        vals = template.copy()
        vals[:nparams] = args[:nparams]
        owned = [False] * len(vals)
        outside = [vals[k] for k in protected]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            for kind, f, a, out, cands, dead in code:
                if kind == UFUNC_STEP:
                    dst = None
                    for c in cands:
                        if owned[c]:
                            dst = vals[c]
                            break
                    if len(a) == 1:
                        v = f(vals[a[0]], out=dst) if dst is not None else f(vals[a[0]])
                    else:
                        v = f(vals[a[0]], vals[a[1]], out=dst) if dst is not None else f(vals[a[0]], vals[a[1]])
                    owned[out] = isinstance(v, np.ndarray)
                elif kind == KERNEL_STEP:
                    v = f[0](*[vals[k] for k in a], f[1])
                    owned[out] = (isinstance(v, np.ndarray) and v.base is None and v.flags.writeable
                                  and not any(v is x for x in outside))
                elif kind == TUPLE_STEP:
                    v = tuple([vals[k] for k in a])
                else:
                    v = vals[a[0]][f]
                vals[out] = v
                for k in dead:
                    vals[k] = None
                    owned[k] = False
        return vals[result]

    kernel.__name__ = group_label(fn)
    return kernel


__all__ = ["compile_group", "fast_kernel", "group_label", "erf32", "FAST", "UFUNCS"]
