"""Random well-typed programs over the registered operators (Csmith-style), for property tests.

- ``random_program(seed, ...)``: a plain seeded generator returning an ``IRModule``.
- ``programs(...)``: the same generator as a hypothesis strategy (shrinks well).
- ``random_inputs(mod, seed, edges=())``: arrays for ``@main``'s parameters (``edges``: constants,
  zeros, ties, NaN mixed in, for the tests that targets agree on edge values).

Programs have broadcasting shapes, size-1 and rank-0 tensors, shared
subexpressions, tuples and ``TupleGetItem``, ``If``, calls between global
functions, float32/float64 (and int32/bool for a few operators) and, when
``allow_any``, parameters with ``Any`` dims.

Domain safety by construction: every value carries an interval bounding its
entries (inputs are drawn in [-2, 2] for floats, [-3, 3] for ints); an operator
whose domain the operand's interval does not fit gets a domain-fixing operand
(``exp(tanh(x))`` for ``log``/``sqrt``, ``tanh(x)`` where a result would grow past ``LIMIT``). With
``smooth=True`` (gradient checks) operators are kept away from their kinks and
discontinuities, and ``If`` conditions never depend on float values.

Operators come from the registry's metadata: elementwise operators of one
and two inputs, reductions and comparisons (``unary_ops()``, ``binary_ops()``,
``reductions()``, ``comparisons()``), each with its ``domain``, ``kinks``,
``smooth``, ``dtypes`` and ``example_attrs``; the bounds of a result come from
the operator's NumPy kernel. Shape, join, linear-algebra and like-operators
have one builder each (``ACTIONS``); an operator that is not registered is
skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import weakref
from typing import Callable, Optional, Sequence

import numpy as np

from ..analysis.type_infer import infer_expr, infer_module
from ..ir.errors import PullbackError, TypeInferenceError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import transform
from ..ir.types import Any, TensorType, TupleType, Type
from ..ops.reduce import ReduceAttrs
from ..ops.registry import OpDef, get_op, has_op, list_ops

INF = math.inf
LIMIT = 60.0  # |entries| of every value stay below this
FLOAT_RANGE = (-2.0, 2.0)
INT_RANGE = (-3, 3)
MARGIN = 0.05  # distance kept from kinks in smooth mode

# concrete sizes of Any dims of generated parameters (Var -> concrete shape)
_CONCRETE: "weakref.WeakKeyDictionary[Var, tuple]" = weakref.WeakKeyDictionary()


# ------------------------------------------------------------------ choice sources


class _RandomSource:
    """Decisions from ``random.Random``."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def choice(self, seq: Sequence):
        return seq[self.int(0, len(seq) - 1)]

    def coin(self, p: float) -> bool:
        return self.int(0, 99) < int(p * 100)


class _DrawSource(_RandomSource):
    """Decisions drawn from a hypothesis ``draw`` (so failing programs shrink)."""

    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def int(self, lo: int, hi: int) -> int:
        return lo if lo >= hi else self.draw(self.st.integers(lo, hi))


# ------------------------------------------------------------------ values and intervals


@dataclasses.dataclass
class Val:
    """A generated tensor value: expression, static shape, dtype and entry bounds."""

    expr: Expr
    shape: tuple
    dtype: str
    lo: float
    hi: float

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")


@dataclasses.dataclass
class TupleVal:
    expr: Expr
    fields: list  # of Val | TupleVal


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ------------------------------------------------------------------ operators from the registry

DOMAIN_MARGIN = 0.2  # distance kept from the finite ends of an operator's domain

@dataclasses.dataclass(frozen=True)
class GenOp:
    """A registered operator as the generator calls it: attributes, the input intervals it is safe
    on (its ``domain`` less ``DOMAIN_MARGIN``), kinks, smoothness; result bounds from its NumPy kernel."""

    name: str
    attrs: object
    domains: tuple  # per input (lo, hi)
    kinks: tuple
    smooth: bool
    ints: bool  # takes int32 operands

    @property
    def call_attrs(self) -> dict:
        a = self.attrs
        return {} if a is None else {f.name: getattr(a, f.name) for f in dataclasses.fields(a)}

    def _run(self, *xs):
        with np.errstate(all="ignore"):
            return np.asarray(get_op(self.name).impl("numpy")(*xs, self.attrs), dtype="float64")

    def bounds(self, lo: float, hi: float) -> tuple:
        """Bounds of an elementwise op's result on [lo, hi]: its kernel on a dense sample (with the kinks)."""
        xs = np.concatenate([np.linspace(lo, hi, 1025), [k for k in self.kinks + (0.0,) if lo < k < hi]])
        return _extent(self._run(xs))

    def bounds2(self, a: tuple, c: tuple) -> tuple:
        """Bounds of a binary elementwise op's result on the box a x c (a grid with its corners)."""
        x, y = np.meshgrid(np.linspace(a[0], a[1], 17), np.linspace(c[0], c[1], 17))
        return _extent(self._run(x.ravel(), y.ravel()))

    def reduce_bounds(self, lo: float, hi: float, n: int) -> tuple:
        """Bounds of a reduction of ``n`` entries in [lo, hi]: symmetric reductions that are monotone,
        convex or multilinear in each entry take their extremes at the corners with k entries at lo."""
        corners = np.where(np.arange(n)[None, :] < np.arange(n + 1)[:, None], float(lo), float(hi))
        with np.errstate(all="ignore"):
            ys = get_op(self.name).impl("numpy")(corners, get_op(self.name).make_attrs(axis=1))
        return _extent(np.asarray(ys, dtype="float64"))


def _extent(ys: np.ndarray) -> tuple:
    if not ys.size or not np.all(np.isfinite(ys)):
        return (-INF, INF)
    return float(ys.min()), float(ys.max())


def _safe(interval: tuple) -> tuple:
    lo, hi = interval
    return (lo + DOMAIN_MARGIN if lo > -INF else lo, hi - DOMAIN_MARGIN if hi < INF else hi)


def _fixable(lo: float, hi: float) -> bool:
    """A domain-fixing operand (``_Builder.into``) exists for [lo, hi]: any interval (a rescaled ``tanh`` fits
    where ``tanh``, ``exp(tanh)`` and ``sigmoid + 0.5`` do not)."""
    return lo < hi


def _result_dtype(op: OpDef, dtype: str, attrs) -> Optional[str]:
    if dtype not in op.dtypes:
        return None
    try:
        t = op.infer([TensorType((), dtype)] * op.num_inputs, attrs)
    except PullbackError:
        return None
    return t.dtype if isinstance(t, TensorType) else None


_NEEDS_ATTRS = object()


def _call_attrs(op: OpDef):
    """Attributes of a generated call (defaults and ``example_attrs``); _NEEDS_ATTRS if they do not suffice."""
    if op.attrs_type is None:
        return None
    try:
        return op.make_attrs(**op.example_attrs)
    except PullbackError:
        return _NEEDS_ATTRS


def _gen_op(op: OpDef) -> Optional[GenOp]:
    """``op`` as a GenOp, or None when no call can be generated (attributes, a domain no fixer fits)."""
    attrs = _call_attrs(op)
    if attrs is _NEEDS_ATTRS:
        return None
    kinks = op.kinks
    kinks = tuple(kinks(attrs) if callable(kinks) else kinks)
    domains = tuple(_safe(op.input_domain(i)) for i in range(max(op.num_inputs, 0)))
    if not all(_fixable(*d) for d in domains):
        return None
    ints = _result_dtype(op, "int32", attrs) == "int32" and all(d == (-INF, INF) for d in domains)
    return GenOp(op.name, attrs, domains, kinks, op.smooth, ints)


def _select(pred: Callable[[OpDef], bool]) -> tuple:
    out = []
    for op in list_ops():
        if op.differentiable and pred(op):
            g = _gen_op(op)
            if g is not None:
                out.append(g)
    return tuple(out)


def _elementwise(op: OpDef, n: int, out: str) -> bool:
    """An elementwise op of ``n`` inputs giving ``out`` (``"same"``: the input's dtype) on float32."""
    if not (op.elementwise and op.num_inputs == n):
        return False
    attrs = _call_attrs(op)
    return attrs is not _NEEDS_ATTRS and _result_dtype(op, "float32", attrs) == ("float32" if out == "same" else out)


@functools.cache
def unary_ops() -> tuple:
    """Differentiable elementwise operators of one float tensor."""
    return _select(lambda op: _elementwise(op, 1, "same"))


@functools.cache
def binary_ops() -> tuple:
    """Differentiable broadcasting operators of two tensors of one dtype."""
    return _select(lambda op: _elementwise(op, 2, "same"))


@functools.cache
def reductions() -> tuple:
    """Differentiable reductions (``ReduceAttrs``: axis, keepdims)."""
    return _select(lambda op: op.num_inputs == 1 and op.attrs_type is not None and issubclass(op.attrs_type, ReduceAttrs))


@functools.cache
def comparisons() -> tuple:
    """Elementwise comparisons of two numeric tensors (bool result): names, for If/where conditions."""
    return tuple(op.name for op in list_ops() if _elementwise(op, 2, "bool") and "int32" in op.dtypes)


# ------------------------------------------------------------------ the function builder


class _Builder:
    """Builds one function: a pool of values, new parameters on demand."""

    def __init__(self, src: _RandomSource, cfg: "Config", helpers: list, name: str):
        self.src = src
        self.cfg = cfg
        self.helpers = helpers  # [(GlobalVar, Function, result Val/TupleVal)]
        self.name = name
        self.params: list[Var] = []
        self.pool: list[Val] = []
        self.tuples: list[TupleVal] = []
        self.used: set[Expr] = set()
        self.record = True
        self.mod = IRModule({gv: fn for gv, fn, _ in helpers}) if helpers else None

    # -- basics
    def typed(self, e: Expr) -> Expr:
        infer_expr(e, self.mod)
        return e

    def add(self, v):
        if self.record:
            (self.tuples if isinstance(v, TupleVal) else self.pool).append(v)
        return v

    def make(self, e: Expr, lo: float, hi: float) -> Val:
        t = self.typed(e).checked_type
        return Val(e, t.shape, t.dtype, float(lo), float(hi))

    def call(self, name: str, args: list, lo: float, hi: float, **attrs) -> Val:
        for a in args:
            self.used.add(a.expr)
        op = get_op(name)
        return self.make(Call(op, [a.expr for a in args], op.make_attrs(**attrs)), lo, hi)

    def random_shape(self, max_rank: int = 3) -> tuple:
        rank = self.src.choice((0, 1, 1, 2, 2, 2, 3, 3)[: 2 + 2 * max_rank])
        return tuple(self.src.choice((1, 2, 3, 3, 4)) for _ in range(rank))

    def new_param(self, shape: tuple, dtype: str) -> Val:
        p = Var(f"p{len(self.params)}", TensorType(shape, dtype))
        self.params.append(p)
        lo, hi = (0.0, 1.0) if dtype == "bool" else INT_RANGE if dtype.startswith("int") else FLOAT_RANGE
        return self.add(self.make(p, lo, hi))

    def new_const(self, shape: tuple, dtype: str) -> Val:
        rng = np.random.default_rng(self.src.int(0, 2**16))
        if dtype.startswith("int"):
            data = rng.integers(-2, 3, size=shape).astype(dtype)
        else:
            data = np.round(rng.uniform(-1.0, 1.0, size=shape), 2).astype(dtype)
        lo, hi = (float(data.min()), float(data.max())) if data.size else (0.0, 0.0)
        return self.make(Constant(data), lo, hi)

    def pick(self, pred: Callable[[Val], bool]) -> Optional[Val]:
        """A pool value satisfying ``pred``: unused and recent ones are preferred."""
        cands = [v for v in self.pool if pred(v)]
        if not cands:
            return None
        unused = [v for v in cands if v.expr not in self.used]
        if unused and self.src.coin(0.6):
            cands = unused
        return cands[max(0, len(cands) - 1 - self.src.int(0, 3))] if self.src.coin(0.6) else self.src.choice(cands)

    def operand(self, dtype: str, shape: Optional[tuple] = None) -> Val:
        """A value of ``dtype`` (and ``shape``): from the pool, or a new parameter or constant."""
        v = self.pick(lambda v: v.dtype == dtype and (shape is None or v.shape == shape))
        if v is not None and self.src.coin(0.85):
            return v
        shape = self.random_shape() if shape is None else shape
        if self.src.coin(0.2) and len(shape) <= 1:
            return self.new_const(shape, dtype)
        return self.new_param(shape, dtype)

    def float_dtype(self) -> str:
        return self.src.choice(self.cfg.float_dtypes)

    # -- domain fixing
    def squash(self, v: Val) -> Val:
        """``tanh(v)``: entries in [-1, 1]."""
        return self.call("tanh", [v], math.tanh(v.lo), math.tanh(v.hi))

    def positive(self, v: Val) -> Val:
        """Entries in [0.37, 2.72] (``exp(tanh(v))``) or [0.5, 1.5] (``sigmoid(v) + 0.5``)."""
        if self.src.coin(0.5) or not has_op("sigmoid"):
            s = self.squash(v)
            return self.call("exp", [s], math.exp(s.lo), math.exp(s.hi))
        s = self.call("sigmoid", [v], _sigmoid(v.lo), _sigmoid(v.hi))
        half = self.make(Constant(np.array(0.5, s.dtype)), 0.5, 0.5)
        return self.call("add", [s, half], s.lo + 0.5, s.hi + 0.5)

    def into(self, v: Val, lo: float, hi: float) -> Val:
        """``v`` made to fit [lo, hi] (a domain-fixing operand if needed)."""
        if lo <= v.lo and v.hi <= hi:
            return v
        if lo <= -1.0 and hi >= 1.0:
            return self.squash(v)
        if lo <= 0.37 and hi >= 2.72 or lo <= 0.5 and hi >= 1.5:
            return self.positive(v)
        return self.rescaled(v, lo if lo > -INF else hi - 2.0, hi if hi < INF else lo + 2.0)

    def rescaled(self, v: Val, lo: float, hi: float) -> Val:
        """``c + h * tanh(v)``: entries in [lo, hi] (acos's (-1, 1), acosh's (1, inf) less their margins)."""
        s = self.squash(v)
        c, h = (lo + hi) / 2, (hi - lo) / 2
        half = self.make(Constant(np.array(h, s.dtype)), h, h)
        s = self.call("multiply", [s, half], s.lo * h, s.hi * h)
        mid = self.make(Constant(np.array(c, s.dtype)), c, c)
        return self.call("add", [s, mid], s.lo + c, s.hi + c)

    def away_from(self, v: Val, kinks: tuple) -> Val:
        """In smooth mode: ``v`` whose interval keeps ``MARGIN`` from every kink."""
        if not self.cfg.smooth or all(k < v.lo - MARGIN or k > v.hi + MARGIN for k in kinks):
            return v
        for w in (self.squash(v), None):
            if w is None:
                w = self.positive(v)
            if all(k < w.lo - MARGIN or k > w.hi + MARGIN for k in kinks):
                return w
        s = self.squash(v)  # [-1, 1] -> [1.5, 2.5]: clear of kinks in [-1, 1]
        two = self.make(Constant(np.array(2.0, s.dtype)), 2.0, 2.0)
        s = self.call("multiply", [s, self.make(Constant(np.array(0.5, s.dtype)), 0.5, 0.5)], s.lo * 0.5, s.hi * 0.5)
        return self.call("add", [s, two], s.lo + 2.0, s.hi + 2.0)

    def bounded(self, v: Val) -> Val:
        return v if -LIMIT < v.lo and v.hi < LIMIT else self.squash(v)

    # -- broadcasting partners
    def partner_shape(self, shape: tuple) -> tuple:
        """A shape that broadcasts with ``shape``."""
        k = self.src.int(0, 5)
        if k <= 1:
            return shape
        if k == 2:
            return ()
        if k == 3:
            return shape[self.src.int(0, len(shape)):]
        if k == 4:
            return tuple(1 if self.src.coin(0.5) else d for d in shape)
        return (self.src.choice((1, 2)),) + tuple(d if d != 1 else self.src.choice((1, 3)) for d in shape)

    def partner(self, v: Val) -> Val:
        shape = self.partner_shape(v.shape)
        w = self.pick(lambda w: w.dtype == v.dtype and w is not v and _broadcastable(w.shape, v.shape))
        if w is not None and self.src.coin(0.5):
            return w
        if not shape or self.src.coin(0.3):
            return self.new_const(shape, v.dtype)
        return self.operand(v.dtype, shape)


def _broadcastable(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def _numel(shape: tuple) -> int:
    return int(np.prod(shape)) if shape else 1


# ------------------------------------------------------------------ actions


def _within(lo: float, hi: float) -> bool:
    return -LIMIT < lo and hi < LIMIT


def _apply_unary(b: _Builder, u: GenOp, v: Val) -> Optional[Val]:
    """``u(v)``, its operand fitted into u's domain and away from its kinks, squashed when the result
    would leave (-LIMIT, LIMIT)."""
    for squash in (False, True):
        w = b.away_from(b.into(b.squash(v) if squash else v, *u.domains[0]), u.kinks)
        if not w.is_float:
            return None
        lo, hi = u.bounds(w.lo, w.hi)
        if _within(lo, hi):
            return b.call(u.name, [w], lo, hi, **u.call_attrs)
    return None


def _unary_choices(b: _Builder) -> list:
    return [u for u in unary_ops() if u.smooth or not b.cfg.smooth]


def act_unary(b: _Builder) -> Optional[Val]:
    u = b.src.choice(_unary_choices(b))
    v = b.operand(b.float_dtype()) if b.src.coin(0.2) else b.pick(lambda v: v.is_float) or b.operand(b.float_dtype())
    return _apply_unary(b, u, v)


def _near(kinks: tuple, lo: float, hi: float) -> bool:
    return any(lo - MARGIN <= k <= hi + MARGIN for k in kinks)


def act_binary(b: _Builder) -> Optional[Val]:
    ints = b.cfg.allow_int and b.src.coin(0.15)
    o = b.src.choice([o for o in binary_ops() if (o.ints or not ints) and (o.smooth or not b.cfg.smooth)])
    dtype = "int32" if ints else b.float_dtype()
    a = b.pick(lambda v: v.dtype == dtype) or b.operand(dtype)
    c = b.partner(a)
    if b.src.coin(0.5):
        a, c = c, a
    if not ints:
        a, c = b.into(a, *o.domains[0]), b.into(c, *o.domains[1])
    # kinks of a binary op are values of a - c (maximum/minimum: where the operands tie)
    kinky = o.kinks and not ints and b.cfg.smooth
    if kinky and _near(o.kinks, a.lo - c.hi, a.hi - c.lo):
        c = b.call("add", [b.squash(c), b.make(Constant(np.array(3.0, c.dtype)), 3.0, 3.0)], 2.0, 4.0)
        a = b.squash(a)
    lo, hi = o.bounds2((a.lo, a.hi), (c.lo, c.hi))
    if not _within(lo, hi):
        if ints:
            return None
        a, c = (v if o.domains[i] != (-INF, INF) else b.squash(v) for i, v in enumerate((a, c)))
        lo, hi = o.bounds2((a.lo, a.hi), (c.lo, c.hi))
    if not _within(lo, hi) or kinky and _near(o.kinks, a.lo - c.hi, a.hi - c.lo):
        return None
    return b.call(o.name, [a, c], lo, hi, **o.call_attrs)


def _axes(b: _Builder, ndim: int):
    """None, an int or a tuple of distinct axes (possibly negative)."""
    if ndim == 0 or b.src.coin(0.25):
        return None
    if b.src.coin(0.5):
        return b.src.int(-ndim, ndim - 1)
    return tuple(sorted({b.src.int(0, ndim - 1) for _ in range(b.src.int(1, ndim))}))


def act_reduce(b: _Builder) -> Optional[Val]:
    r = b.src.choice([r for r in reductions() if r.smooth or not b.cfg.smooth])
    v = b.pick(lambda v: v.is_float) or b.operand(b.float_dtype())
    axis = _axes(b, len(v.shape))
    keep = b.src.coin(0.4)
    axes = range(len(v.shape)) if axis is None else [axis] if isinstance(axis, int) else axis
    n = _numel(tuple(v.shape[a] for a in axes))
    if n == 0:
        return None
    lo, hi = r.reduce_bounds(v.lo, v.hi, n)
    if not _within(lo, hi):
        v = b.squash(v)
        lo, hi = r.reduce_bounds(v.lo, v.hi, n)
        if not _within(lo, hi):
            return None
    return b.call(r.name, [v], lo, hi, axis=axis, keepdims=keep)


def _factor(b: _Builder, n: int) -> tuple:
    dims = []
    while n > 1 and len(dims) < 3:
        divs = [d for d in range(2, n + 1) if n % d == 0]
        d = b.src.choice(divs)
        dims.append(d)
        n //= d
    if n > 1:
        dims[-1] *= n
    if b.src.coin(0.3):
        dims.insert(b.src.int(0, len(dims)), 1)
    return tuple(dims)


def act_shape(b: _Builder) -> Optional[Val]:
    """reshape / transpose / expand_dims / squeeze / flip / broadcast_to / tile / repeat / strided_slice."""
    v = b.pick(lambda v: v.dtype != "bool") or b.operand(b.float_dtype())
    nd = len(v.shape)
    kind = b.src.choice(("reshape", "transpose", "expand_dims", "squeeze", "flip", "broadcast_to", "tile",
                         "repeat", "strided_slice"))
    if not has_op(kind):
        return None
    if kind == "reshape":
        shape = list(_factor(b, _numel(v.shape)))
        if shape and b.src.coin(0.3):
            shape[b.src.int(0, len(shape) - 1)] = -1
        return b.call(kind, [v], v.lo, v.hi, newshape=tuple(shape))
    if kind == "transpose":
        axes = None if b.src.coin(0.3) else _perm(b, nd)
        return b.call(kind, [v], v.lo, v.hi, axes=axes)
    if kind == "expand_dims":
        return b.call(kind, [v], v.lo, v.hi, axis=b.src.int(-nd - 1, nd), num_newaxis=b.src.int(0, 2))
    if kind == "squeeze":
        ones = [i for i, d in enumerate(v.shape) if d == 1]
        # explicit axes: squeeze(axis=None) is a type error on ? dims (the result rank would depend
        # on run-time sizes), and inlining a call can give a parameter ? dims
        axis = tuple(sorted({b.src.choice(ones) for _ in ones})) if ones else ()
        return b.call(kind, [v], v.lo, v.hi, axis=axis)
    if kind == "flip":
        return b.call(kind, [v], v.lo, v.hi, axis=b.src.int(0, nd - 1)) if nd else None
    if kind == "broadcast_to":
        shape = tuple(d if d != 1 else b.src.choice((1, 2, 3)) for d in v.shape)
        return b.call(kind, [v], v.lo, v.hi, shape=(2,) * b.src.int(0, 1) + shape)
    if kind == "tile":
        return b.call(kind, [v], v.lo, v.hi, reps=tuple(b.src.int(1, 2) for _ in range(b.src.int(1, max(nd, 1)))))
    if kind == "repeat":
        return b.call(kind, [v], v.lo, v.hi, repeats=b.src.int(1, 3), axis=b.src.int(-nd, nd - 1)) if nd else None
    if nd == 0:
        return None
    ax = b.src.int(0, nd - 1)
    begin = b.src.int(0, v.shape[ax] - 1) if v.shape[ax] else 0
    return b.call(kind, [v], v.lo, v.hi, begin=(begin,), end=(v.shape[ax],), axes=(ax,))


def _perm(b: _Builder, nd: int) -> tuple:
    rest = list(range(nd))
    out = []
    while rest:
        out.append(rest.pop(b.src.int(0, len(rest) - 1)))
    return tuple(out)


def act_join(b: _Builder) -> Optional[Val]:
    """concatenate / stack of two values; split into a tuple."""
    kind = b.src.choice(("concatenate", "stack", "split"))
    if not has_op(kind):
        return None
    v = b.pick(lambda v: v.is_float and len(v.shape) >= 1) or b.operand(b.float_dtype(), (2, 3))
    nd = len(v.shape)
    ax = b.src.int(0, nd - 1)
    if kind == "split":
        d = v.shape[ax]
        secs = [s for s in (2, 3) if d % s == 0 and d >= s]
        if not secs:
            return None
        s = b.src.choice(secs)
        sp = Call(get_op("split"), [v.expr], get_op("split").make_attrs(s, ax))
        b.used.add(v.expr)
        t = b.typed(sp).checked_type
        fields = [Val(TupleGetItem(sp, i), f.shape, f.dtype, v.lo, v.hi) for i, f in enumerate(t.fields)]
        b.add(TupleVal(sp, fields))
        i = b.src.int(0, s - 1)
        return b.make(fields[i].expr, v.lo, v.hi)
    if kind == "stack":
        w = b.operand(v.dtype, v.shape)
        return b.call(kind, [v, w], min(v.lo, w.lo), max(v.hi, w.hi), axis=b.src.int(0, nd))
    shape = v.shape[:ax] + (b.src.int(1, 3),) + v.shape[ax + 1:]
    w = b.operand(v.dtype, shape)
    lst = [v, w] if b.src.coin(0.5) else [w, v, w]
    for a in lst:
        b.used.add(a.expr)
    op = get_op("concatenate")
    e = Call(op, [a.expr for a in lst], op.make_attrs(axis=ax - nd if b.src.coin(0.3) else ax))
    return b.make(e, min(v.lo, w.lo), max(v.hi, w.hi))


def act_linalg(b: _Builder) -> Optional[Val]:
    """nn.dense / nn.matmul / nn.batch_matmul / softmax / log_softmax."""
    kind = b.src.choice(("nn.dense", "nn.matmul", "nn.batch_matmul", "nn.softmax", "nn.log_softmax"))
    if not has_op(kind):
        return None
    dt = b.float_dtype()
    if kind in ("nn.softmax", "nn.log_softmax"):
        v = b.pick(lambda v: v.dtype == dt and len(v.shape) >= 1) or b.operand(dt, (2, 3))
        v = b.bounded(v)
        lo = 0.0 if kind == "nn.softmax" else -(v.hi - v.lo) - math.log(max(v.shape[-1], 1)) - 1
        return b.call(kind, [v], lo, 1.0 if kind == "nn.softmax" else 0.0, axis=b.src.int(-len(v.shape), len(v.shape) - 1))
    want = 3 if kind == "nn.batch_matmul" else 2
    v = b.pick(lambda v: v.dtype == dt and (len(v.shape) == want or kind == "nn.dense" and len(v.shape) >= 1))
    if v is None:
        v = b.operand(dt, (2,) * (want - 2) + (b.src.int(1, 3), b.src.int(1, 4)))
    v = b.squash(v) if max(abs(v.lo), abs(v.hi)) > 2 else v
    k = v.shape[-1]
    n = b.src.int(1, 3)
    if kind == "nn.dense":
        w = b.squash(b.operand(dt, (n, k)))
        return b.call(kind, [v, w], -k * 2.0, k * 2.0)
    if kind == "nn.matmul":
        w = b.squash(b.operand(dt, (k, n)))
        return b.call(kind, [v, w], -k * 2.0, k * 2.0)
    w = b.squash(b.operand(dt, (v.shape[0], n, k)))
    return b.call(kind, [v, w], -k * 2.0, k * 2.0)


def act_like(b: _Builder) -> Optional[Val]:
    """The operators AD leaves behind, and identities ``x + 0`` / ``x * 1`` for the clean-up passes."""
    v = b.pick(lambda v: v.is_float) or b.operand(b.float_dtype())
    kind = b.src.choice(("zeros_like", "ones_like", "broadcast_to_like", "collapse_sum_like", "reshape_like",
                         "cast_like", "x+0", "x*1", "x*1.0"))
    if kind in ("zeros_like", "ones_like") and has_op(kind):
        c = 0.0 if kind == "zeros_like" else 1.0
        return b.call(kind, [v], c, c)
    if kind == "broadcast_to_like" and has_op(kind):
        big = b.pick(lambda w: w.dtype == v.dtype and w is not v and np.broadcast_shapes(v.shape, w.shape) == w.shape if _broadcastable(v.shape, w.shape) else False)
        return b.call(kind, [v, big], v.lo, v.hi) if big is not None else None
    if kind == "collapse_sum_like" and has_op(kind):
        small = b.pick(lambda w: w.dtype == v.dtype and w is not v and _broadcastable(w.shape, v.shape) and np.broadcast_shapes(v.shape, w.shape) == v.shape)
        if small is None:
            return None
        n = _numel(v.shape) // max(_numel(small.shape), 1)
        v = b.bounded(v)
        return b.call(kind, [v, small], v.lo * n, v.hi * n)
    if kind == "reshape_like" and has_op(kind):
        other = b.pick(lambda w: w is not v and _numel(w.shape) == _numel(v.shape))
        return b.call(kind, [v, other], v.lo, v.hi) if other is not None else None
    if kind == "cast_like" and has_op(kind) and len(b.cfg.float_dtypes) > 1:
        other = b.pick(lambda w: w.is_float and w.dtype != v.dtype)
        return b.call(kind, [v, other], v.lo, v.hi) if other is not None else None
    if kind == "x+0" and has_op("zeros_like"):
        return b.call("add", [v, b.call("zeros_like", [v], 0.0, 0.0)], v.lo, v.hi)
    if kind == "x*1" and has_op("ones"):
        one = b.make(Call(get_op("ones"), [], get_op("ones").make_attrs(shape=v.shape, dtype=v.dtype)), 1.0, 1.0)
        return b.call("multiply", [one, v] if b.src.coin(0.5) else [v, one], v.lo, v.hi)
    if kind == "x*1.0":
        return b.call("multiply", [v, b.make(Constant(np.array(1.0, v.dtype)), 1.0, 1.0)], v.lo, v.hi)
    return None


def act_cast(b: _Builder) -> Optional[Val]:
    """float32 <-> float64, int32 -> float."""
    if not has_op("cast"):
        return None
    if b.cfg.allow_int and b.src.coin(0.4):
        v = b.pick(lambda v: v.dtype == "int32") or b.new_param(b.random_shape(), "int32")
        return b.call("cast", [v], v.lo, v.hi, dtype=b.float_dtype())
    if len(b.cfg.float_dtypes) < 2:
        return None
    v = b.pick(lambda v: v.is_float) or b.operand(b.float_dtype())
    other = [d for d in b.cfg.float_dtypes if d != v.dtype]
    return b.call("cast", [v], v.lo, v.hi, dtype=b.src.choice(other))


def condition(b: _Builder) -> Val:
    """A bool scalar: a bool parameter, or a comparison of two reduced scalars
    (int values in smooth mode, so gradients never cross a branch switch)."""
    if b.src.coin(0.4) or not has_op("greater"):
        v = b.pick(lambda v: v.dtype == "bool" and v.shape == ())
        return v if v is not None else b.new_param((), "bool")
    dtype = "int32" if b.cfg.smooth or not b.cfg.float_dtypes else b.src.choice(("int32",) + b.cfg.float_dtypes)
    sides = []
    for _ in range(2):
        v = b.pick(lambda v: v.dtype == dtype) or b.operand(dtype)
        sides.append(b.call("sum", [v], -INF, INF) if v.shape else v)
    return b.call(b.src.choice(comparisons()), sides, 0.0, 1.0)


def act_where(b: _Builder) -> Optional[Val]:
    if not has_op("where"):
        return None
    a = b.pick(lambda v: v.is_float) or b.operand(b.float_dtype())
    c = b.partner(a)
    cond = condition(b)
    if b.src.coin(0.5) and has_op("greater") and (not b.cfg.smooth or b.cfg.allow_int):
        dt = "int32" if b.cfg.smooth else b.float_dtype()
        shape = b.partner_shape(np.broadcast_shapes(a.shape, c.shape))
        x = b.pick(lambda v: v.dtype == dt and v.shape == shape) or b.operand(dt, shape)
        cond = b.call("greater", [x, b.make(Constant(np.array(0, dt)), 0, 0)], 0, 1)
    return b.call("where", [cond, a, c], min(a.lo, c.lo), max(a.hi, c.hi))


def act_tuple(b: _Builder) -> Optional[Val]:
    """A tuple of values (sometimes nested), then one field of some tuple."""
    if b.tuples and b.src.coin(0.5):
        t = b.src.choice(b.tuples)
    else:
        fields = [b.pick(lambda v: True) or b.operand(b.float_dtype()) for _ in range(b.src.int(1, 3))]
        if b.tuples and b.src.coin(0.3):
            fields.append(b.src.choice(b.tuples))
        for f in fields:
            b.used.add(f.expr)
        t = b.add(TupleVal(b.typed(Tuple([f.expr for f in fields])), fields))
    b.used.add(t.expr)
    while True:
        i = b.src.int(0, len(t.fields) - 1)
        f = t.fields[i]
        e = b.typed(TupleGetItem(t.expr, i))
        if isinstance(f, TupleVal):
            t = TupleVal(e, f.fields)
            continue
        return Val(e, f.shape, f.dtype, f.lo, f.hi)


def _branch(b: _Builder, v: Val) -> Val:
    """A shape-preserving chain of 0..2 unary operators on ``v``, built outside the pool."""
    record, b.record = b.record, b.src.coin(0.15)
    try:
        for _ in range(b.src.int(0, 2)):
            w = _apply_unary(b, b.src.choice(_unary_choices(b)), v) if v.is_float else None
            if w is None:
                break
            v = w
    finally:
        b.record = record
    return v


def act_if(b: _Builder) -> Optional[Val]:
    if not b.cfg.allow_if:
        return None
    cond = condition(b)
    v = b.pick(lambda v: v.is_float) or b.operand(b.float_dtype())
    w = b.pick(lambda w: w.dtype == v.dtype and w.shape == v.shape) or v
    t, f = _branch(b, v), _branch(b, w)
    if b.src.coin(0.25):  # tuple-valued If
        t2, f2 = _branch(b, w), _branch(b, v)
        e = If(cond.expr, Tuple([t.expr, t2.expr]), Tuple([f.expr, f2.expr]))
        b.used.update({cond.expr, v.expr, w.expr})
        b.typed(e)
        fields = [Val(TupleGetItem(e, 0), t.shape, t.dtype, min(t.lo, f.lo), max(t.hi, f.hi)),
                  Val(TupleGetItem(e, 1), t2.shape, t2.dtype, min(t2.lo, f2.lo), max(t2.hi, f2.hi))]
        tv = b.add(TupleVal(e, fields))
        i = b.src.int(0, 1)
        return b.make(TupleGetItem(tv.expr, i), fields[i].lo, fields[i].hi)
    b.used.update({cond.expr, v.expr, w.expr})
    return b.make(If(cond.expr, t.expr, f.expr), min(t.lo, f.lo), max(t.hi, f.hi))


def act_call(b: _Builder) -> Optional[Val]:
    """A call to an earlier global function; float arguments squashed into its input range."""
    if not b.helpers:
        return None
    gv, fn, res = b.src.choice(b.helpers)
    args = []
    for p in fn.params:
        t = p.type_annotation
        v = b.pick(lambda v, t=t: v.dtype == t.dtype and v.shape == t.shape)
        if v is None or v.dtype.startswith("int") and not (INT_RANGE[0] <= v.lo and v.hi <= INT_RANGE[1]):
            v = b.operand(t.dtype, t.shape) if t.dtype == "bool" else b.new_param(t.shape, t.dtype)
        elif v.is_float and not (FLOAT_RANGE[0] <= v.lo and v.hi <= FLOAT_RANGE[1]):
            v = b.squash(v)
        args.append(v)
        b.used.add(v.expr)
    e = b.typed(Call(gv, [a.expr for a in args]))
    if isinstance(res, TupleVal):
        tv = b.add(TupleVal(e, [dataclasses.replace(f, expr=TupleGetItem(e, i)) for i, f in enumerate(res.fields)]))
        i = b.src.int(0, len(tv.fields) - 1)
        f = tv.fields[i]
        if isinstance(f, TupleVal):
            return None
        return b.make(f.expr, f.lo, f.hi)
    return b.make(e, res.lo, res.hi)


# action table: (name, weight, builder)
ACTIONS: list[tuple[str, int, Callable]] = [
    ("unary", 6, act_unary),
    ("binary", 7, act_binary),
    ("reduce", 2, act_reduce),
    ("shape", 3, act_shape),
    ("join", 1, act_join),
    ("linalg", 1, act_linalg),
    ("like", 2, act_like),
    ("cast", 1, act_cast),
    ("where", 1, act_where),
    ("tuple", 1, act_tuple),
    ("if", 1, act_if),
    ("call", 2, act_call),
]


# ------------------------------------------------------------------ programs


@dataclasses.dataclass(frozen=True)
class Config:
    max_nodes: int = 12
    float_dtypes: tuple = ("float32",)
    allow_int: bool = True
    allow_if: bool = True
    allow_calls: bool = True
    allow_any: bool = True
    smooth: bool = False


def _config(max_nodes, dtypes, allow_if, allow_calls, allow_any, smooth) -> Config:
    dtypes = tuple(dtypes)
    floats = tuple(d for d in dtypes if d in ("float32", "float64"))
    if not floats:
        raise PullbackError(f"programs: dtypes must include float32 or float64, got {dtypes}")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise PullbackError(f"programs: max_nodes must be a positive int, got {max_nodes!r}")
    return Config(max_nodes, floats, "int32" in dtypes, allow_if, allow_calls, allow_any, smooth)


def _weighted(actions: list, k: int) -> Callable:
    """The builder of the action that the ``k``-th unit of total weight falls into."""
    for _, w, f in actions:
        if k < w:
            return f
        k -= w
    raise PullbackError(f"generator: weight index {k} out of range")


def _function(src: _RandomSource, cfg: Config, helpers: list, name: str, budget: int) -> tuple[Function, object]:
    b = _Builder(src, cfg, helpers, name)
    b.new_param(b.random_shape(), b.float_dtype())
    actions = [(n, w, f) for n, w, f in ACTIONS if n != "call" or cfg.allow_calls]
    weights = [w for _, w, _ in actions]
    total = sum(weights)
    steps = 0
    for _ in range(budget * 3):
        if steps >= budget:
            break
        v = _weighted(actions, src.int(0, total - 1))(b)
        if v is not None:
            b.add(v)
            steps += 1
    floats = [v for v in b.pool if v.is_float and not isinstance(v.expr, (Var, Constant))] or [v for v in b.pool if v.is_float]
    last = floats[-1]
    unused = [v for v in floats if v.expr not in b.used and v is not last]
    if src.coin(0.35) and (unused or len(floats) > 1):
        extra = (unused or floats)[-src.int(1, min(2, len(unused or floats))):]
        fields = [last] + [v for v in extra if v is not last]
        res: object = TupleVal(Tuple([f.expr for f in fields]), fields)
        if src.coin(0.2):
            res = TupleVal(Tuple([res.expr, last.expr]), [res, last])
        body = res.expr
    else:
        res, body = last, last.expr
    fn = Function(b.params, body)
    return fn, res


def _generate(src: _RandomSource, cfg: Config) -> IRModule:
    helpers: list = []
    if cfg.allow_calls:
        for k in range(src.int(0, 2)):
            fn, res = _function(src, dataclasses.replace(cfg, allow_calls=k > 0), helpers, f"f{k}", max(2, cfg.max_nodes // 3))
            helpers.append((GlobalVar(f"f{k}"), fn, res))
    main, _ = _function(src, cfg, helpers, "main", cfg.max_nodes)
    funcs = {gv: fn for gv, fn, _ in helpers}
    funcs[GlobalVar("main")] = main
    mod = IRModule(funcs)
    if cfg.allow_any:
        mod = _erase_dims(src, mod)
    infer_module(mod)
    return mod


def _erase_dims(src: _RandomSource, mod: IRModule) -> IRModule:
    """Replace some static dims of ``@main``'s tensor parameters by ``Any`` (kept only where
    type inference still succeeds); the concrete sizes are remembered for ``random_inputs``."""
    main = mod["main"]
    erased = {}
    for p in main.params:
        t = p.type_annotation
        picks = [i for i in range(len(t.shape)) if src.coin(0.3)]
        if picks:
            erased[p] = picks
    if not erased:
        return mod

    def attempt(choice: dict) -> Optional[IRModule]:
        new_vars = {}
        for p, dims in choice.items():
            t = p.type_annotation
            v = Var(p.name_hint, TensorType(tuple(Any if i in dims else d for i, d in enumerate(t.shape)), t.dtype))
            _CONCRETE[v] = t.shape
            new_vars[id(p)] = v
        fn = transform(main, lambda old, new: new_vars.get(id(old)), into_functions=True)
        cand = mod.with_function("main", fn)
        try:
            infer_module(cand)
        except TypeInferenceError:
            return None
        return cand

    out = attempt(erased)
    if out is not None:
        return out
    kept: dict = {}
    for p, dims in erased.items():
        for d in dims:
            trial = dict(kept)
            trial[p] = kept.get(p, []) + [d]
            if attempt(trial) is not None:
                kept = trial
    return attempt(kept) if kept else mod


def random_program(
    seed: int,
    max_nodes: int = 12,
    dtypes: Sequence[str] = ("float32", "int32"),
    allow_if: bool = True,
    allow_calls: bool = True,
    allow_any: bool = True,
    smooth: bool = False,
) -> IRModule:
    """A random well-typed ``IRModule`` (``@main`` and maybe helpers), determined by ``seed``.

    ``max_nodes`` bounds the number of generated operations per function; ``dtypes``
    lists the float dtypes to use (``"int32"`` enables integer/bool values);
    ``smooth=True`` keeps every operator away from kinks (for finite differences).
    """
    return _generate(_RandomSource(seed), _config(max_nodes, dtypes, allow_if, allow_calls, allow_any, smooth))


def programs(
    max_nodes: int = 12,
    dtypes: Sequence[str] = ("float32", "int32"),
    allow_if: bool = True,
    allow_calls: bool = True,
    allow_any: bool = True,
    smooth: bool = False,
):
    """A hypothesis strategy of random well-typed ``IRModule``s (see ``random_program``)."""
    from hypothesis import strategies as st

    cfg = _config(max_nodes, dtypes, allow_if, allow_calls, allow_any, smooth)

    @st.composite
    def strategy(draw):
        return _generate(_DrawSource(draw), cfg)

    return strategy()


EDGES = ("constant", "zeros", "ties", "nan")
"""Edge inputs of ``random_inputs(edges=...)``: every entry equal (std/variance of a constant),
all zeros (integer division by zero, a zero std), values repeating (ties of max/min/maximum),
some entries NaN (max/min over NaN)."""


def _input(t: Type, rng: np.random.Generator, concrete: Optional[tuple], edges: tuple = ()):
    if isinstance(t, TupleType):
        return tuple(_input(f, rng, None, edges) for f in t.fields)
    shape = concrete or tuple(1 if d is Any else d for d in t.shape)
    if t.dtype == "bool":
        return rng.random(shape) < 0.5
    is_int = t.dtype.startswith("int") or t.dtype == "uint8"
    if is_int:
        out = rng.integers(INT_RANGE[0], INT_RANGE[1] + 1, size=shape).astype(t.dtype)
    else:
        out = rng.uniform(*FLOAT_RANGE, size=shape).astype(t.dtype)
    edge = edges[rng.integers(len(edges))] if edges and rng.random() < 0.75 else None
    if edge == "constant":
        out[...] = out.reshape(-1)[0] if out.size else 0
    elif edge == "zeros":
        out[...] = 0
    elif edge == "ties":
        out = np.round(out) if not is_int else out
    elif edge == "nan" and not is_int and out.size:
        out.reshape(-1)[rng.integers(out.size)] = np.nan
    return out


def random_inputs(mod: IRModule, seed: int = 0, func: str = "main", edges: Sequence[str] = ()) -> list:
    """Arrays for ``mod[func]``'s parameters, in the ranges generated programs are safe on
    (floats in [-2, 2], ints in [-3, 3]); ``Any`` dims of generated parameters get their
    original sizes (other ``Any`` dims get 1). ``edges`` (names of ``EDGES``): most inputs get
    one of these edge values instead."""
    unknown = [e for e in edges if e not in EDGES]
    if unknown:
        raise PullbackError(f"random_inputs: unknown edges {unknown}; expected some of {', '.join(EDGES)}")
    rng = np.random.default_rng(seed)
    return [_input(p.type_annotation, rng, _CONCRETE.get(p), tuple(edges)) for p in mod[func].params]


def _leaves(value, path: str = "") -> list:
    out, stack = [], [(path, value)]
    while stack:
        p, v = stack.pop()
        if isinstance(v, (tuple, list)):
            stack.extend((f"{p}.{i}", f) for i, f in reversed(list(enumerate(v))))
        else:
            out.append((p, np.asarray(v)))
    return out


def assert_outputs_close(got, want, what: str = "outputs", rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Same tuple structure, shapes and dtypes; floats within ``rtol``/``atol``, others equal."""
    a, b = _leaves(got), _leaves(want)
    if [p for p, _ in a] != [p for p, _ in b]:
        raise AssertionError(f"{what}: tuple structure differs: {[p for p, _ in a]} vs {[p for p, _ in b]}")
    for (p, x), (_, y) in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            raise AssertionError(f"{what}{p}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"{what}{p}")
        else:
            np.testing.assert_array_equal(x, y, err_msg=f"{what}{p}")


__all__ = ["programs", "random_program", "random_inputs", "EDGES", "assert_outputs_close", "Config", "GenOp", "unary_ops",
           "binary_ops", "reductions", "comparisons", "ACTIONS"]
