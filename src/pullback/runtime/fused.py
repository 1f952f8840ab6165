"""Fused groups as single kernels.

``compile_group(fn)`` turns a primitive Function (``Primitive=1``, made by
FuseOps) into one closure ``kernel(*args, attrs)``. Its body is a flat list of
steps over integer slots. Elementwise float steps call the op's NumPy ufunc
(``OpDef.ufunc``) with ``out=``: the result goes into an operand's buffer when that operand (a) was
allocated inside this call of the group, (b) dies at this step and (c) has the
result's static shape and dtype; otherwise NumPy allocates a new buffer, which
the group then owns. Parameters, constants and results of other kernels that
may alias them are never written. Steps that are not elementwise call the op's
kernel. A chain ``tanh -> multiply -> subtract`` therefore runs in one buffer.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..ir.expr import Call, Constant, Function, Tuple, TupleGetItem, Var
from ..ir.traversal import post_order
from ..ir.types import Any, TensorType
from ..ops.registry import OpDef

# ------------------------------------------------------------------ fused groups

UFUNC_STEP, KERNEL_STEP, TUPLE_STEP, GET_STEP = range(4)


def _static_float(t) -> bool:
    return isinstance(t, TensorType) and t.dtype.startswith("float") and all(d is not Any for d in t.shape)


def group_label(fn: Function) -> str:
    """``fused(op+op+...)``: the profile row name of a group."""
    names = [n.op.name for n in post_order(fn.body) if isinstance(n, Call) and isinstance(n.op, OpDef)]
    return "fused(" + "+".join(names) + ")"


def compile_group(fn: Function, kernel_of: Optional[Callable[[Call], Callable]] = None) -> Callable:
    """One closure ``kernel(*args, attrs)`` running the primitive Function ``fn`` (typed); a call that is not
    an elementwise ufunc runs ``kernel_of(call)`` (default: its operator's NumPy kernel)."""
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
        if not (isinstance(n, Call) and isinstance(n.op, OpDef) and n.op.ufunc is not None):
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
        uf = n.op.ufunc  # computes the op exactly like its kernel on float arrays of one dtype
        if uf is not None and _static_float(ty) and all(isinstance(a.checked_type, TensorType)
                                                      and a.checked_type.dtype == ty.dtype for a in n.args):
            # operands whose buffer may take the result: call results dying here, same shape and dtype
            cands = tuple(k for k, a in zip(args, n.args) if isinstance(a, Call) and last.get(k) == i
                          and k != result and k not in escaped and tuple(a.checked_type.shape) == tuple(ty.shape))
            steps.append((UFUNC_STEP, uf, args, out, cands))
        else:
            steps.append((KERNEL_STEP, (n.op.compute if kernel_of is None else kernel_of(n), n.attrs), args, out, ()))
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


__all__ = ["compile_group", "group_label"]
