"""Gradient checks against central finite differences, in float64.

- ``to_float64(fn_or_mod)``: the same program computing in float64.
- ``check_grad(fn_or_mod, inputs, wrt=None)``: the vjp built by
  ``FirstOrderGradient`` with a random cotangent versus central finite
  differences of ``<ct, f(x)>``; returns the largest absolute error. Complex
  values are pairs of reals: ``<a, b> = Re(sum(conj(a) * b))`` and a complex
  input's gradient is ``ds/dRe + i ds/dIm`` (PyTorch's convention).
- ``check_second_order(fn_or_mod, inputs, wrt=None)``: Hessian-vector products
  by AD of ``grad(s) . v`` versus finite differences of ``grad(s)``.

Typical use in an operator test::

    x = pb.var("x", shape=(3, 4))
    check_grad(pb.Function([x], op.tanh(x)), [np.random.randn(3, 4)])
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Union

import numpy as np

from ..ir.errors import PullbackError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import transform
from ..ir.types import FLOAT_DTYPES, TensorType, TupleType, Type, is_complex, is_inexact
from ..transform.ad.common import build_struct, leaf_paths

_LOW = tuple(d for d in FLOAT_DTYPES if d != "float64")
_WIDE = {**{d: "float64" for d in _LOW}, "complex64": "complex128"}  # what to_float64 widens

# ------------------------------------------------------------------ float64


def _type64(ty: Optional[Type]) -> Optional[Type]:
    """``ty`` with every low-precision float tensor made float64 (iterative over nesting)."""
    if ty is None:
        return None
    out: dict = {}
    stack = [((), ty, False)]
    while stack:
        path, t, done = stack.pop()
        if isinstance(t, TupleType):
            if done:
                fields = tuple(out.pop(path + (i,)) for i in range(len(t.fields)))
                out[path] = t if all(a is b for a, b in zip(fields, t.fields)) else TupleType(fields)
            else:
                stack.append((path, t, True))
                stack.extend((path + (i,), f, False) for i, f in enumerate(t.fields))
        elif isinstance(t, TensorType) and t.dtype in _WIDE:
            out[path] = TensorType(t.shape, _WIDE[t.dtype])
        else:
            out[path] = t  # int/bool tensors, function types stay
    return out[()]


def _fn64(fn: Function, gvars: dict) -> Function:
    def convert(old: Expr, new: Expr):
        if isinstance(new, Var):
            t = _type64(new.type_annotation)
            return new if t is new.type_annotation else Var(new.name_hint, t)
        if isinstance(new, Constant):
            return Constant(new.data.astype(_WIDE[new.data.dtype.name])) if new.data.dtype.name in _WIDE else new
        if isinstance(new, Call):
            attrs = new.attrs
            if dataclasses.is_dataclass(attrs) and getattr(attrs, "dtype", None) in _WIDE:
                attrs = dataclasses.replace(attrs, dtype=_WIDE[attrs.dtype])
            op = gvars.get(new.op.name_hint, new.op) if isinstance(new.op, GlobalVar) else new.op
            return new.replace(op=op, attrs=attrs)
        if isinstance(new, GlobalVar):
            return gvars.get(new.name_hint, new)
        if isinstance(new, Function):
            t = _type64(new.ret_type)
            return new if t is new.ret_type else new.replace(ret_type=t)
        return None

    return transform(fn, convert, into_functions=True)


def to_float64(fn_or_mod: Union[Function, IRModule]) -> Union[Function, IRModule]:
    """The same program in float64: float16/float32 parameters, constants and ``dtype`` attributes
    (zeros, ones, full, cast, ...) become float64 (complex64 ones complex128). Returns the same kind it was given."""
    if isinstance(fn_or_mod, Function):
        return _fn64(fn_or_mod, {})
    if not isinstance(fn_or_mod, IRModule):
        raise PullbackError(f"to_float64 expects a Function or an IRModule, got {type(fn_or_mod).__name__}")
    # fresh GlobalVars: a GlobalVar caches its callee's (float32) type
    gvars = {name: GlobalVar(name) for name in fn_or_mod}
    return IRModule({gvars[name]: _fn64(fn, gvars) for name, fn in fn_or_mod.items()})


# ------------------------------------------------------------------ values


def _get(value, path: tuple):
    for i in path:
        value = value[i]
    return value


def _set(value, path: tuple, leaf):
    """``value`` (nested tuples) with the leaf at ``path`` replaced (copies along the path only)."""
    if not path:
        return leaf
    parents = [value]
    for i in path[:-1]:
        parents.append(parents[-1][i])
    new = leaf
    for parent, i in zip(reversed(parents), reversed(path)):
        items = list(parent)
        items[i] = new
        new = tuple(items)
    return new


def _dtype64(t: TensorType) -> str:
    return _WIDE.get(t.dtype, t.dtype)


def _convert64(value, ty: Type):
    """Inputs as arrays, float leaves in float64 (nested tuples kept)."""
    return build_struct(ty, lambda path, t: np.asarray(_get(value, path), dtype=_dtype64(t)), pack=tuple)


def _random_like(ty: Type, rng: np.random.Generator, like=None):
    """A random value of type ``ty``: standard normal float leaves (both parts of complex ones), zero int/bool
    leaves.

    Shapes come from ``like`` (a value of type ``ty``, needed when ``ty`` has ``Any`` dims)."""
    def leaf(path, t):
        shape = np.shape(_get(like, path)) if like is not None else tuple(int(d) for d in t.shape)
        if is_complex(t.dtype):
            value = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) if t.dtype in FLOAT_DTYPES else np.zeros(shape, t.dtype)
        return np.asarray(value, dtype=_dtype64(t))
    return build_struct(ty, leaf, pack=tuple)


def _dot(a, b, ty: Type) -> float:
    """Sum over float and complex leaves of ``Re(sum(conj(a) * b))``."""
    return float(sum(np.sum(np.real(np.conj(_get(a, p)) * _get(b, p))) for p, t in leaf_paths(ty) if is_inexact(t.dtype)))


def _prepare(fn_or_mod, func: str, wrt, inputs: Sequence):
    """(float64 module, positions of wrt params, converted inputs)."""
    from ..analysis import infer_module
    from ..transform.first_order_gradient import resolve_wrt

    if isinstance(fn_or_mod, Function):
        fn_or_mod = IRModule.from_expr(fn_or_mod)
    if not isinstance(fn_or_mod, IRModule):
        raise PullbackError(f"expected a Function or an IRModule, got {type(fn_or_mod).__name__}")
    fn = fn_or_mod[func]
    infer_module(fn_or_mod)
    params, problems = resolve_wrt(fn, wrt, func)
    if problems:
        raise PullbackError("; ".join(problems))
    positions = [next(i for i, q in enumerate(fn.params) if q is p) for p in params]
    if len(inputs) != len(fn.params):
        raise PullbackError(f"@{func} takes {len(fn.params)} inputs, got {len(inputs)}")
    mod = infer_module(to_float64(fn_or_mod))
    fn64 = mod[func]
    xs = [_convert64(v, p.type_annotation) for v, p in zip(inputs, fn64.params)]
    return mod, positions, xs


def _coords(shape: tuple, max_coords: int, rng: np.random.Generator) -> list:
    size = int(np.prod(shape)) if shape else 1
    flat = np.arange(size) if size <= max_coords else np.sort(rng.choice(size, max_coords, replace=False))
    return [np.unravel_index(int(k), shape) if shape else () for k in flat]


class _Worst:
    """The entry with the largest error relative to its tolerance."""

    def __init__(self, rtol: float, atol: float):
        self.rtol, self.atol = rtol, atol
        self.max_err = 0.0
        self.ratio = -1.0
        self.entry = None
        self.count = 0

    def add(self, label: str, analytic: float, numeric: float) -> None:
        err = abs(analytic - numeric)
        if not np.isfinite(analytic) or not np.isfinite(numeric):
            err = np.inf
        tol = self.atol + self.rtol * abs(numeric)
        self.count += 1
        self.max_err = max(self.max_err, err)
        if err / tol > self.ratio:
            self.ratio = err / tol
            self.entry = (label, analytic, numeric, err, tol)

    def check(self, what: str) -> float:
        if self.ratio > 1.0:
            label, a, n, err, tol = self.entry
            raise AssertionError(
                f"{what}: mismatch at {label}: analytic {a!r}, numeric {n!r} (error {err:.3g} > tolerance {tol:.3g}; "
                f"{self.count} entries checked)"
            )
        return self.max_err


def _label(param: Var, path: tuple, index: tuple) -> str:
    field = "".join(f".{i}" for i in path)
    return f"%{param.name_hint}{field}[{', '.join(map(str, index))}]"


# ------------------------------------------------------------------ checks


def check_grad(fn_or_mod: Union[Function, IRModule], inputs: Sequence, wrt=None, eps: float = 1e-6, rtol: float = 1e-5,
               atol: float = 1e-6, seed: int = 0, func: str = "main", max_coords: int = 30) -> float:
    """Check ``FirstOrderGradient`` on ``fn_or_mod`` at ``inputs`` against central finite differences.

    The program is converted to float64; the vjp with a random cotangent ``ct`` is
    compared, entry by entry, with ``(s(x + eps e_i) - s(x - eps e_i)) / (2 eps)`` for
    ``s(x) = <ct, f(x)>`` (at most ``max_coords`` random entries per input leaf).
    Raises AssertionError naming the worst entry (parameter, index, analytic, numeric);
    returns the largest absolute error.
    """
    from ..runtime import build
    from ..transform.first_order_gradient import FirstOrderGradient

    mod, positions, xs = _prepare(fn_or_mod, func, wrt, inputs)
    fn = mod[func]
    params = [fn.params[i] for i in positions]
    gmod = FirstOrderGradient(func, wrt=params, mode="vjp", name=f"{func}_vjp")(mod)
    exe = build(gmod)
    rng = np.random.default_rng(seed)
    ret_t = fn.checked_type.ret_type
    ct = _random_like(ret_t, rng, like=exe[func](*xs))
    _, grads = exe[f"{func}_vjp"](*xs, ct)

    def s(args) -> float:
        return _dot(ct, exe[func](*args), ret_t)

    worst = _Worst(rtol, atol)
    for k, (pos, param) in enumerate(zip(positions, params)):
        for path, t in leaf_paths(param.type_annotation):
            if not is_inexact(t.dtype):
                continue
            base = _get(xs[pos], path)
            analytic = np.asarray(_get(grads[k], path))
            parts = ((1.0, np.real, ""), (1j, np.imag, ".imag")) if is_complex(t.dtype) else ((1.0, np.real, ""),)
            for idx in _coords(base.shape, max_coords, rng):
                for unit, part, suffix in parts:
                    vals = []
                    for sign in (1.0, -1.0):
                        leaf = np.array(base, copy=True)
                        leaf[idx] += sign * eps * unit
                        args = list(xs)
                        args[pos] = _set(xs[pos], path, leaf)
                        vals.append(s(args))
                    worst.add(_label(param, path, idx) + suffix, float(part(analytic[idx])), (vals[0] - vals[1]) / (2 * eps))
    return worst.check(f"check_grad of @{func}")


def check_second_order(fn_or_mod: Union[Function, IRModule], inputs: Sequence, wrt=None, eps: float = 1e-6,
                       rtol: float = 1e-5, atol: float = 1e-6, seed: int = 0, func: str = "main") -> float:
    """Check second derivatives: the Hessian-vector product ``H v`` of ``s(x) = <ct, f(x)>``
    obtained by ``FirstOrderGradient`` applied to ``x -> grad(s)(x) . v`` (built from the
    generated ``@..._grad``) versus ``(grad s(x + eps v) - grad s(x - eps v)) / (2 eps)``.
    Random ``ct`` and ``v``; returns the largest absolute error."""
    from ..ops.registry import get_op
    from ..runtime import build
    from ..transform.first_order_gradient import FirstOrderGradient

    mod, positions, xs = _prepare(fn_or_mod, func, wrt, inputs)
    fn = mod[func]
    ret_t = fn.checked_type.ret_type
    leaves = [t for p in fn.params for _, t in leaf_paths(p.type_annotation)] + [t for _, t in leaf_paths(ret_t)]
    if any(isinstance(t, TensorType) and is_complex(t.dtype) for t in leaves):
        raise PullbackError(f"check_second_order of @{func}: complex parameters or results are not supported "
                            f"(check_grad checks their first derivatives)")
    rng = np.random.default_rng(seed)
    ct = _random_like(ret_t, rng, like=build(mod)[func](*xs))
    mul, total, add = get_op("multiply"), get_op("sum"), get_op("add")

    def dot_const(value: Expr, ty: Type, const) -> Expr:
        terms = []
        for path, t in leaf_paths(ty):
            if t.dtype in FLOAT_DTYPES:
                leaf = value
                for i in path:
                    leaf = TupleGetItem(leaf, i)
                terms.append(total(mul(leaf, Constant(np.asarray(_get(const, path), dtype=t.dtype)))))
        acc = terms[0]
        for t in terms[1:]:
            acc = add(acc, t)
        return acc

    def fresh(f: Function) -> list[Var]:
        return [Var(p.name_hint, p.type_annotation) for p in f.params]

    sp = fresh(fn)
    s_fn = Function(sp, dot_const(Call(mod.get_global_var(func), sp), ret_t, ct))
    mod = mod.with_function("__s", s_fn)
    mod = FirstOrderGradient("__s", wrt=[sp[i] for i in positions], mode="grad", name="__s_grad")(mod)
    grads_t = mod["__s_grad"].ret_type.fields[1]
    v = _random_like(grads_t, rng, like=tuple(xs[i] for i in positions))
    hp = fresh(fn)
    grads = TupleGetItem(Call(mod.get_global_var("__s_grad"), hp), 1)
    mod = mod.with_function("__hv", Function(hp, dot_const(grads, grads_t, v)))
    mod = FirstOrderGradient("__hv", wrt=[hp[i] for i in positions], mode="grad", name="__hv_grad")(mod)
    exe = build(mod)
    _, hv = exe["__hv_grad"](*xs)

    def grad_at(sign: float):
        args = list(xs)
        for k, pos in enumerate(positions):
            for path, t in leaf_paths(fn.params[pos].type_annotation):
                if t.dtype in FLOAT_DTYPES:
                    leaf = _get(args[pos], path) + sign * eps * _get(v[k], path)
                    args[pos] = _set(args[pos], path, leaf)
        return exe["__s_grad"](*args)[1]

    plus, minus = grad_at(1.0), grad_at(-1.0)
    worst = _Worst(rtol, atol)
    for k, pos in enumerate(positions):
        param = fn.params[pos]
        for path, t in leaf_paths(param.type_annotation):
            if t.dtype not in FLOAT_DTYPES:
                continue
            numeric = (np.asarray(_get(plus[k], path)) - np.asarray(_get(minus[k], path))) / (2 * eps)
            analytic = np.asarray(_get(hv[k], path))
            for idx in np.ndindex(*numeric.shape):
                worst.add(_label(param, path, idx), float(analytic[idx]), float(numeric[idx]))
    return worst.check(f"check_second_order of @{func}")


__all__ = ["to_float64", "check_grad", "check_second_order"]
