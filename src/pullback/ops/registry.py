"""The operator registry: one typed ``OpDef`` per operator, no string-keyed attributes.

Each operator carries, next to its definition: an attrs dataclass, a type
relation ``infer``, one ``kernel(xp, *arrays, attrs)`` written against an array
namespace (``numpy``, ``jax.numpy`` or array-api-compat's ``torch``), per-target
overrides in ``impls`` only where a backend genuinely differs, a gradient rule
``grad`` (or ``differentiable=False`` with a reason), a fusion ``pattern`` and a
``flops`` estimate. ``op.impl(target)`` is what an executor calls:
``fn(*arrays, attrs)``. Builders follow Relay: ``op.reshape(x, (6, 2, 2))``
passes tensor arguments first, then attributes positionally or by keyword.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import math
from typing import Any as _Any
from typing import Callable, Optional, Sequence

import numpy as np

from ..ir.errors import AttrError, PullbackError, TypeInferenceError
from ..ir.expr import Call, Expr, Op, as_expr
from ..ir.types import COMPLEX_DTYPES, DTYPES, TensorType, Type


class FusionKind(enum.IntEnum):
    """Relay's fusion kinds."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


class Recompute(enum.IntEnum):
    """What recomputing an op's result in the backward costs (``PartitionForwardBackward(policy="min_cut")``
    turns a class into nanoseconds per element per target: ``transform.partition.RECOMPUTE_NS``).

    ``VIEW``: layout only, a view of the input on NumPy and torch (reshape, transpose, squeeze);
    ``CHEAP``: one pass over memory (arithmetic, comparisons, exp/log/tanh/sqrt, copies, slices: 0.4-1 ns per
    float32 element on NumPy and torch); ``SPECIAL``: a special function or a kernel of several passes
    (erf, gelu, sigmoid, silu, inverse trigonometry, mod: 5-40 ns per element on NumPy); ``NEVER``: GEMMs,
    convolutions, reductions, normalisations, softmax and opaque ops are never recomputed. The default
    follows ``pattern``: ELEMWISE, BROADCAST and INJECTIVE ops are ``CHEAP``, every other kind ``NEVER``.
    """

    VIEW = 0
    CHEAP = 1
    SPECIAL = 2
    NEVER = 3


_RECOMPUTABLE_KINDS = (FusionKind.ELEMWISE, FusionKind.BROADCAST, FusionKind.INJECTIVE)


InferFn = Callable[[list, _Any], Type]
ComputeFn = Callable[..., _Any]  # fn(*arrays, attrs) on one target's arrays
KernelFn = Callable[..., _Any]  # kernel(xp, *arrays, attrs) on any array namespace

# target name -> module path of its array namespace (imported on first use)
NAMESPACES = {"numpy": "numpy", "jax": "jax.numpy", "torch": "array_api_compat.torch"}


@functools.cache
def array_namespace(target: str):
    """The array namespace kernels receive as ``xp`` on ``target`` (imported lazily)."""
    try:
        path = NAMESPACES[target]
    except KeyError:
        raise PullbackError(f"unknown kernel target {target!r} (targets: {', '.join(NAMESPACES)})") from None
    try:
        return importlib.import_module(path)
    except ImportError as e:
        raise PullbackError(f"target {target!r} needs {path.split('.')[0]}: {e}") from None
GradFn = Callable[[Call, Expr], list]
FlopsFn = Callable[[list, Type, _Any], int]


def _default_flops(arg_types: list, out_type: Type, attrs) -> int:
    """One operation per output element."""
    if isinstance(out_type, TensorType) and out_type.is_static:
        return int(math.prod(out_type.shape))
    return 0


def zero_flops(arg_types: list, out_type: Type, attrs) -> int:
    return 0


def _real_operands(name: str, infer: InferFn) -> InferFn:
    """``infer`` behind a check that no operand is a complex tensor (operators take complex tensors only when
    their ``dtypes`` say so: their gradient rules follow the conjugate convention)."""

    def checked(arg_types, attrs):
        for i, t in enumerate(arg_types):
            if type(t) is TensorType and t.dtype in COMPLEX_DTYPES:
                raise type_error(name, arg_types, f"argument {i} is a {t.dtype} tensor; {name} takes no complex tensors")
        return infer(arg_types, attrs)

    return checked


class OpDef(Op):
    """An operator definition. Calling it builds a ``Call``.

    ``num_inputs`` is the number of tensor operands (-1: variadic, given as a list), ``optional_inputs``
    how many more it may take (an attention's bias): ``op(q, k, v)`` or ``op(q, k, v, bias)``. Extra
    positional arguments fill the attrs dataclass fields in order.

    Running it: ``kernel(xp, *arrays, attrs)`` written once against an array
    namespace; ``impls`` maps a target (``numpy``, ``jax``, ``torch``) to an
    override ``fn(*arrays, attrs)`` where that backend genuinely differs;
    ``ufunc`` is a NumPy ufunc computing exactly the kernel on float arrays of
    one dtype (fused NumPy groups call it with ``out=``).

    What it accepts (read by tests and the program generator):
    ``dtypes`` the dtypes of its tensor inputs (type inference rejects complex operands of an
    operator whose ``dtypes`` has no complex dtype); ``elementwise`` True when it
    maps entries one by one with NumPy broadcasting among its inputs;
    ``domain`` per input an open interval ``(lo, hi)`` of float values on
    which it is finite with finite derivatives, or None for the whole line
    (conservative where the true domain has a hole: ``reciprocal`` says
    ``(0, inf)``); ``kinks`` the points where it is not differentiable, of
    the input (unary) or of the difference of the inputs (binary), a tuple or
    ``fn(attrs) -> tuple``; ``smooth=False`` when it is not differentiable on
    a set that ``kinks`` cannot describe (steps, ties, constant slices);
    ``example_attrs`` attributes to use where its attrs have no defaults.

    ``expand(call) -> Expr``: the call written in other operators, which AD differentiates in place of an operator
    that has no rule of its own (``grad=None``; an LSTM's gradient, for second derivatives).

    ``pattern`` is its Relay fusion kind; ``recompute`` what recomputing it in the backward costs
    (a :class:`Recompute` class, by default derived from ``pattern``); ``type_only`` the positions of the
    operands it reads only for their shape and dtype (the like-operators' templates): its result never shares
    their memory (the executor's buffer reuse reads it).
    """

    def __init__(
        self,
        name: str,
        num_inputs: int,
        infer: InferFn,
        compute: Optional[ComputeFn] = None,
        *,
        optional_inputs: int = 0,
        kernel: Optional[KernelFn] = None,
        impls: Optional[dict] = None,
        ufunc=None,
        dtypes: Sequence[str] = DTYPES,
        elementwise: bool = False,
        domain: tuple = (),
        kinks=(),
        smooth: bool = True,
        example_attrs: Optional[dict] = None,
        attrs_type: Optional[type] = None,
        grad: Optional[GradFn] = None,
        grad_sees_wanted: bool = False,
        expand: Optional[Callable[[Call], Expr]] = None,
        differentiable: bool = True,
        nondiff_reason: str = "",
        pattern: FusionKind = FusionKind.OPAQUE,
        recompute: Optional[Recompute] = None,
        type_only: tuple = (),
        flops: FlopsFn = _default_flops,
        torch_name: Optional[str] = None,
        half_native: bool = False,
        doc: str = "",
    ):
        self.name = name
        self.num_inputs = num_inputs
        self.optional_inputs = optional_inputs
        self.dtypes = tuple(dtypes)
        self.infer = infer if any(d in COMPLEX_DTYPES for d in self.dtypes) else _real_operands(name, infer)
        self.kernel = kernel
        self.impls: dict[str, ComputeFn] = dict(impls or {})
        if compute is not None:  # a NumPy-only kernel: the numpy target's implementation
            self.impls.setdefault("numpy", compute)
        self.ufunc = ufunc  # a NumPy ufunc computing the op on float arrays (fused groups use out=)
        self.elementwise = elementwise
        self.domain = tuple(domain)
        self.kinks = kinks
        self.smooth = smooth
        self.example_attrs = dict(example_attrs or {})
        self._impl_cache: dict[str, ComputeFn] = {}
        self.attrs_type = attrs_type
        self.grad = grad
        # the rule takes ``wanted=`` (one bool per argument: does AD want its gradient) and may choose by it
        self.grad_sees_wanted = grad_sees_wanted
        self.expand = expand  # the call in other operators: AD differentiates that where there is no rule
        self.differentiable = differentiable
        self.nondiff_reason = nondiff_reason
        self.pattern = FusionKind(pattern)
        if recompute is None:
            recompute = Recompute.CHEAP if self.pattern in _RECOMPUTABLE_KINDS else Recompute.NEVER
        self.recompute = Recompute(recompute)
        self.type_only = tuple(type_only)
        self.flops = flops
        self.torch_name = torch_name
        # the kernel rounds bfloat16 as ATen does itself: the targets give it bfloat16 operands as they are, not
        # widened to float32 ("opmath", runtime.opmath)
        self.half_native = half_native
        self.__doc__ = doc or f"The ``{name}`` operator."
        if differentiable and grad is None:
            # allowed while a rule is being written; the registry test reports it
            pass
        if not differentiable and not nondiff_reason:
            raise PullbackError(f"op {name}: differentiable=False needs a reason")

    # -- running
    def impl(self, target: str = "numpy") -> ComputeFn:
        """``fn(*arrays, attrs)`` computing this op on ``target``'s arrays: the target's override
        from ``impls``, else the shared ``kernel`` bound to the target's array namespace."""
        fn = self._impl_cache.get(target)
        if fn is None:
            fn = self.impls.get(target)
            if fn is None:
                if self.kernel is None:
                    raise PullbackError(f"op {self.name} has no kernel for target {target!r}")
                fn = functools.partial(self.kernel, array_namespace(target))
            self._impl_cache[target] = fn
        return fn

    @property
    def compute(self) -> ComputeFn:
        """The NumPy implementation ``fn(*arrays, attrs)`` (``impl("numpy")``)."""
        return self.impl("numpy")

    def input_domain(self, i: int) -> tuple:
        """The open interval ``(lo, hi)`` of values input ``i`` may take (the whole line if undeclared)."""
        d = self.domain[i] if i < len(self.domain) else None
        return (-math.inf, math.inf) if d is None else tuple(d)

    # -- building calls
    def make_attrs(self, *args, **kwargs):
        """Validated attrs from positional/keyword values; errors name the op."""
        if self.attrs_type is None:
            if args or kwargs:
                given = ", ".join(list(map(repr, args)) + list(kwargs))
                raise AttrError(f"op {self.name} takes no attributes, got {given}")
            return None
        names = [f.name for f in dataclasses.fields(self.attrs_type)]
        if len(args) > len(names):
            raise AttrError(f"op {self.name}: too many positional attributes ({len(args)} > {len(names)}: {', '.join(names)})")
        values = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise AttrError(f"op {self.name} has no attribute {k!r} (attributes: {', '.join(names) or 'none'})")
            if k in values:
                raise AttrError(f"op {self.name}: attribute {k!r} given twice")
            values[k] = v
        try:
            return self.attrs_type(**values)
        except AttrError as e:
            raise AttrError(f"op {self.name}: {e}") from None
        except TypeError as e:
            raise AttrError(f"op {self.name}: bad attributes: {e}") from None

    def __call__(self, *args, **kwargs) -> Call:
        n = self.num_inputs
        if n == len(args) and not kwargs:  # the common case, expressions and no attributes: no conversions
            for a in args:
                if not isinstance(a, Expr):
                    break
            else:
                return Call(self, args, self.make_attrs() if self.attrs_type is not None else None)
        if n < 0:
            if not args or not isinstance(args[0], (list, tuple)):
                raise PullbackError(f"op {self.name} takes a list of tensors as its first argument")
            tensors, rest = list(args[0]), args[1:]
        else:
            if len(args) < n:
                raise PullbackError(f"op {self.name} expects {self.arity('tensor argument')}, got {len(args)}")
            for a in args[n:n + self.optional_inputs]:  # optional operands: the expressions and arrays that follow
                if not isinstance(a, (Expr, np.ndarray)):
                    break
                n += 1
            tensors, rest = list(args[:n]), args[n:]
        exprs = [as_expr(t, tensors) for t in tensors]  # a Python scalar takes the dtype of the tensors it meets
        return Call(self, exprs, self.make_attrs(*rest, **kwargs))

    def takes(self, nargs: int) -> bool:
        """Does it take ``nargs`` operands?"""
        n = self.num_inputs
        return n < 0 or n <= nargs <= n + self.optional_inputs

    def arity(self, noun: str = "argument") -> str:
        """How many operands it takes, in words: ``3 arguments``, ``3 or 4 arguments``."""
        n, more = self.num_inputs, self.optional_inputs
        count = f"{n} to {n + more}" if more > 1 else f"{n} or {n + 1}" if more else str(n)
        return f"{count} {noun}{'s' if n + more != 1 else ''}"

    def check_arity(self, nargs: int) -> None:
        if not self.takes(nargs):
            raise TypeInferenceError(f"op {self.name} expects {self.arity()}, got {nargs}")

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add ``opdef`` to the registry (names are unique)."""
    if opdef.name in _REGISTRY:
        raise PullbackError(f"op {opdef.name} is already registered")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    """The operator called ``name`` (Relay's name, e.g. ``nn.dense``)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PullbackError(f"unknown operator {name!r}") from None


def has_op(name: str) -> bool:
    return name in _REGISTRY


def list_ops() -> list[OpDef]:
    """Every registered operator, sorted by name."""
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def defop(name: str, num_inputs: int, infer: InferFn, compute: Optional[ComputeFn] = None, **kw) -> OpDef:
    """Define and register an operator in one step."""
    return register(OpDef(name, num_inputs, infer, compute, **kw))


def is_call_to(expr: Expr, names) -> bool:
    """``expr`` is a Call to one of the operators ``names`` (a name or a collection)."""
    if not isinstance(expr, Call) or not isinstance(expr.op, OpDef):
        return False
    return expr.op.name == names if isinstance(names, str) else expr.op.name in names


def value_args(call: Call) -> tuple:
    """The arguments whose values ``call`` reads: all but those its operator reads only for their type and
    dtype (``OpDef.type_only``: the like-operators' templates)."""
    op = call.op
    if isinstance(op, OpDef) and op.type_only:
        return tuple(a for i, a in enumerate(call.args) if i not in op.type_only)
    return tuple(call.args)


def seq_of_int(value, what: str, allow_none: bool = False, allow_negative: bool = True) -> Optional[tuple]:
    """Normalise an int or sequence of ints to a tuple (for axis/shape attrs)."""
    if value is None:
        if allow_none:
            return None
        raise AttrError(f"{what} is required")
    if isinstance(value, bool):
        raise AttrError(f"{what} must be an int or a sequence of ints, got {value!r}")
    if isinstance(value, int) or hasattr(value, "__index__") and not isinstance(value, (list, tuple)):
        value = (value,)
    if not isinstance(value, (list, tuple)) and hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise AttrError(f"{what} must be an int or a sequence of ints, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not (isinstance(v, int) or hasattr(v, "__index__")):
            raise AttrError(f"{what} must contain ints, got {v!r}")
        v = int(v)
        if not allow_negative and v < 0:
            raise AttrError(f"{what} must not contain negative values, got {tuple(value)}")
        out.append(v)
    return tuple(out)


def type_error(op: str, arg_types: Sequence[Type], message: str) -> TypeInferenceError:
    """A TypeInferenceError that names the op and its argument types."""
    args = ", ".join(repr(t) for t in arg_types)
    return TypeInferenceError(f"{op}: {message} (argument types: {args})")
