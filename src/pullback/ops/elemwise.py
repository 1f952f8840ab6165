"""Elementwise operators: unary math, broadcasting binaries, comparisons, where.

Gradient conventions (as in PyTorch): piecewise-constant ops (sign, floor, ceil,
round) have a zero gradient; ``abs`` uses ``sign(x)`` (0 at 0); ``clip`` passes
the gradient where ``a_min <= x <= a_max``; ``maximum``/``minimum`` split the
gradient evenly between the two inputs where they tie; ``power`` gives the
exponent a zero gradient where the base is not positive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir.errors import AttrError
from ..ir.expr import Call, Expr, as_expr
from ..ir.types import ALL_DTYPES, DTYPES, FLOAT_DTYPES, TensorType, is_complex, is_inexact
from . import layout as T
from . import special
from .common import broadcast_shapes, numel, same_dtype, tensor_arg
from .kernels import as_array, check_divisor, is_integer, numpy_quiet, rounded_once
from .registry import FusionKind, Recompute, defop, get_op, type_error

# ------------------------------------------------------------------ helpers


def scalar_like(value: float, like: Expr) -> Expr:
    """A rank-0 constant with the dtype of ``like`` (whose type must be known)."""
    return as_expr(value, like)


def unbroadcast(grad: Expr, arg: Expr) -> Expr:
    """Sum ``grad`` back to the shape of ``arg`` (a no-op that SimplifyExpr removes when shapes match)."""
    return T.collapse_sum_like(grad, arg)


def is_float_expr(e: Expr) -> bool:
    """A real or complex floating-point tensor (one that carries a gradient)."""
    t = e.checked_type
    return isinstance(t, TensorType) and is_inexact(t.dtype)


def _flops_per_elem(k: int):
    def flops(arg_types, out_type, attrs):
        return k * numel(out_type.shape)

    return flops


def _float_grads(rule):
    """Wrap a gradient rule so integer/bool arguments get None."""

    def grad(call: Call, g: Expr):
        return [r if r is not None and is_float_expr(a) else None for r, a in zip(rule(call, g), call.args)]

    return grad


# ------------------------------------------------------------------ unary

_KIND = {FLOAT_DTYPES: "floating-point", ("bool",): "bool"}


def _checked_arg(name: str, arg_types, i: int, dtypes: tuple) -> TensorType:
    t = tensor_arg(name, arg_types, i)
    if t.dtype not in dtypes:
        raise type_error(name, arg_types, f"argument {i} must be a {_KIND.get(dtypes, '/'.join(dtypes))} tensor, got {t.dtype}")
    return t


def _unary_infer(name: str, dtypes: tuple, out_dtype):
    def infer(arg_types, attrs):
        t = _checked_arg(name, arg_types, 0, dtypes)
        return TensorType(t.shape, out_dtype) if out_dtype else t

    return infer


def _named_kernel(fn: str, nargs: int):
    """``kernel(xp, *arrays, attrs)`` calling ``xp.<fn>``, and NumPy's ``fn`` if it is a ufunc."""
    if nargs == 1:
        def kernel(xp, x, attrs=None):
            return as_array(getattr(xp, fn)(x))
    else:
        def kernel(xp, a, b, attrs=None):
            return as_array(getattr(xp, fn)(a, b))
    uf = getattr(np, fn, None)
    return kernel, (uf if isinstance(uf, np.ufunc) else None)


def unary(name: str, grad=None, *, fn: str = "", kernel=None, dtypes: tuple = FLOAT_DTYPES, out_dtype=None,
          domain=None, flops_per_elem: int = 1, attrs_type=None, **kw):
    """Define an elementwise unary operator. Its kernel is ``xp.<fn>(x)`` (``fn`` defaults to ``name``) and
    its ufunc ``np.<fn>`` when NumPy's is one, unless ``kernel(xp, x, attrs)`` is given; ``dtypes`` are the
    input dtypes it accepts, ``domain`` the open interval of its input (see ``OpDef``)."""
    if kernel is None:
        kernel, ufunc = _named_kernel(fn or name, 1)
        kw.setdefault("ufunc", ufunc)
    dtypes = tuple(dtypes)
    if grad is not None and dtypes != FLOAT_DTYPES:
        grad = _float_grads(grad)
    return defop(name, 1, _unary_infer(name, dtypes, out_dtype), kernel=kernel, grad=grad, attrs_type=attrs_type,
                 dtypes=dtypes, elementwise=True, domain=(domain,) if domain else (),
                 pattern=kw.pop("pattern", FusionKind.ELEMWISE), flops=_flops_per_elem(flops_per_elem), **kw)


def _zero_grad(c: Call, g: Expr):
    return [T.zeros_like(g)]


_NO_GRAD_BOOL = "the result is boolean: it carries no gradient"
_LN2 = math.log(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_POSITIVE = (0.0, math.inf)  # reciprocal/divide: also defined below 0, one side suffices (see OpDef.domain)


def _cl(v, c):  # a scalar constant with the dtype of call/arg ``c``
    return scalar_like(v, c)


def _scaled(x: Expr, value: float) -> Expr:
    """``ops.math.scaled``: ``x * value`` rounded as PyTorch rounds it (``ops.math`` builds on this module)."""
    from .math import scaled

    return scaled(x, value)


negative = unary("negative", lambda c, g: [negative(g)], dtypes=ALL_DTYPES, torch_name="neg")
abs = unary("abs", lambda c, g: [multiply(g, sign(c.args[0]))], dtypes=DTYPES, kinks=(0.0,), torch_name="abs")  # noqa: A001
sign = unary("sign", _zero_grad, dtypes=DTYPES, smooth=False, torch_name="sign")
exp = unary("exp", lambda c, g: [multiply(g, c)], torch_name="exp")
log = unary("log", lambda c, g: [divide(g, c.args[0])], domain=_POSITIVE, torch_name="log")
log2 = unary("log2", lambda c, g: [divide(g, _scaled(c.args[0], _LN2))], domain=_POSITIVE, torch_name="log2")
log1p = unary("log1p", lambda c, g: [divide(g, add(c.args[0], _cl(1.0, c)))], domain=(-1.0, math.inf),
              torch_name="log1p")
sqrt = unary("sqrt", lambda c, g: [divide(multiply(g, _cl(0.5, c)), c)], domain=_POSITIVE, torch_name="sqrt")
def _rsqrt_torch(x, attrs=None):
    import torch

    return torch.rsqrt(x)  # eager's bits: 1 / sqrt(x) rounds otherwise on ~14% of float32 elements (1 ulp)


rsqrt = unary("rsqrt", lambda c, g: [multiply(g, multiply(_cl(-0.5, c), multiply(c, multiply(c, c))))],
              kernel=lambda xp, x, attrs=None: as_array(1 / xp.sqrt(x)), domain=_POSITIVE, flops_per_elem=2,
              impls={"torch": _rsqrt_torch}, torch_name="rsqrt")
square = unary("square", lambda c, g: [multiply(g, multiply(c.args[0], _cl(2.0, c)))], dtypes=DTYPES,
               torch_name="square")
reciprocal = unary("reciprocal", lambda c, g: [negative(multiply(g, multiply(c, c)))], domain=_POSITIVE,
                   torch_name="reciprocal")
sin = unary("sin", lambda c, g: [multiply(g, cos(c.args[0]))], torch_name="sin")
cos = unary("cos", lambda c, g: [negative(multiply(g, sin(c.args[0])))], torch_name="cos")
tan = unary("tan", lambda c, g: [multiply(g, add(_cl(1.0, c), multiply(c, c)))], domain=(-math.pi / 2, math.pi / 2),
            torch_name="tan")
# their gradients are one kernel each, from the result (``activation.tanh_grad`` / ``sigmoid_grad``: ATen's
# tanh_backward / sigmoid_backward), looked up when the rule runs
tanh = unary("tanh", lambda c, g: [get_op("tanh_grad")(g, c)], flops_per_elem=4, torch_name="tanh")


def sigmoid_kernel(xp, x, attrs=None):
    """1 / (1 + e^-x), as ATen computes it, float16 in float32: e^-x overflows to inf below about -88 (float32),
    giving 0, the limit (NumPy: run it quiet). The exp(-|x|) form with a ``where`` took 10 ms on 1M float32 elements
    on NumPy, this 0.7."""
    w = xp.astype(x, xp.float32) if x.dtype == xp.float16 else x
    out = as_array(1.0 / (1.0 + xp.exp(-w)))  # NumPy makes a scalar of a 0-d array
    return out if out.dtype == x.dtype else xp.astype(out, x.dtype)


def _erf_jax(x, attrs=None):
    from jax.scipy.special import erf as jax_erf

    return jax_erf(x)


def _sigmoid_torch(x, attrs=None):
    import torch

    return torch.sigmoid(x)  # one pass where the shared kernel takes six (Llama's SwiGLU: 3.2 -> 0.3 ms)


sigmoid = unary("sigmoid", lambda c, g: [get_op("sigmoid_grad")(g, c)], kernel=sigmoid_kernel,
                impls={"torch": _sigmoid_torch, "numpy": numpy_quiet(sigmoid_kernel, over="ignore")}, flops_per_elem=4,
                torch_name="sigmoid", recompute=Recompute.SPECIAL)


def _erf_slope(c: Call) -> Expr:
    """``erf'(x) = 2 / sqrt(pi) * exp(-x^2)`` of call ``c``'s argument (the factor unrounded in bfloat16, as in
    PyTorch's formula)."""
    return _scaled(exp(negative(square(c.args[0]))), _TWO_OVER_SQRT_PI)


erf = unary("erf", lambda c, g: [multiply(g, _erf_slope(c))],
            kernel=lambda xp, x, attrs=None: xp.erf(x),  # torch.erf; NumPy and jax.numpy have none
            impls={"numpy": lambda x, attrs=None: special.erf(x), "jax": _erf_jax}, flops_per_elem=8, torch_name="erf",
            recompute=Recompute.SPECIAL)


@dataclass(frozen=True)
class PolygammaAttrs:
    n: int

    def __post_init__(self):
        if isinstance(self.n, bool) or not isinstance(self.n, (int, np.integer)) or self.n < 1:
            raise AttrError(f"attribute n must be an int >= 1 (n = 0 is digamma), got {self.n!r}")
        object.__setattr__(self, "n", int(self.n))


def _scipy_jax(name: str):
    """``jax.scipy.special.<name>``; float16 and bfloat16 computed in float32 and rounded once (some, as ``ndtri``
    and ``log_ndtr``, refuse half types), as the numpy and torch targets compute them."""
    def kernel(x, attrs=None):
        import jax.scipy.special as jsp

        fn = (lambda v: jsp.polygamma(attrs.n, v)) if name == "polygamma" else getattr(jsp, name)
        return rounded_once(fn, x)

    return kernel


lgamma = unary("lgamma", lambda c, g: [multiply(g, digamma(c.args[0]))], kernel=lambda xp, x, attrs=None: xp.lgamma(x),
               impls={"numpy": lambda x, attrs=None: special.lgamma(x), "jax": _scipy_jax("gammaln")}, domain=_POSITIVE,
               flops_per_elem=20, torch_name="lgamma", recompute=Recompute.SPECIAL,
               doc="``log |Gamma(x)|`` (``torch.lgamma``; the log-probabilities of Gamma, Beta, Poisson, Dirichlet).")
digamma = unary("digamma", lambda c, g: [multiply(g, polygamma(c.args[0], n=1))],
                kernel=lambda xp, x, attrs=None: xp.digamma(x),
                impls={"numpy": lambda x, attrs=None: special.polygamma(0, x), "jax": _scipy_jax("digamma")},
                domain=_POSITIVE, flops_per_elem=20, torch_name="digamma", recompute=Recompute.SPECIAL,
                doc="The derivative of ``lgamma``.")
polygamma = unary("polygamma", lambda c, g: [multiply(g, polygamma(c.args[0], n=c.attrs.n + 1))],
                  kernel=lambda xp, x, a: special.polygamma_series(xp, a.n, x), attrs_type=PolygammaAttrs,
                  example_attrs={"n": 1},
                  impls={"numpy": lambda x, a: special.polygamma(a.n, x), "jax": _scipy_jax("polygamma")},
                  domain=_POSITIVE, flops_per_elem=40, torch_name="polygamma", recompute=Recompute.SPECIAL,
                  doc="``polygamma(x, n)``: the ``n``-th derivative of ``digamma`` (n >= 1).")
erfc = unary("erfc", lambda c, g: [negative(multiply(g, _erf_slope(c)))],
             kernel=lambda xp, x, attrs=None: xp.erfc(x),
             impls={"numpy": lambda x, attrs=None: special.erfc(x), "jax": _scipy_jax("erfc")}, flops_per_elem=8,
             torch_name="erfc", recompute=Recompute.SPECIAL, doc="``1 - erf(x)``, accurate where ``erf(x)`` is near 1.")


def _special_fn(name: str, grad, doc: str, **kw):
    """An operator computed by SciPy (numpy), ``jax.scipy.special`` and ``torch.special`` under one name."""
    def torch_kernel(x, attrs=None):
        import torch

        return getattr(torch.special, name)(x)

    numpy_kernel = special.scipy_special(name)
    return unary(name, grad, kernel=lambda xp, x, attrs=None: numpy_kernel(x),
                 impls={"jax": _scipy_jax(name), "torch": torch_kernel}, flops_per_elem=30,
                 torch_name=f"special_{name}", recompute=Recompute.SPECIAL, doc=doc, **kw)


def _at_zero(x: Expr, value: float, f) -> Expr:
    """``f(x)`` with ``x = 0`` replaced by 1 inside it, and ``value`` where ``x`` is 0 (a removable singularity)."""
    zero = equal(x, 0.0)
    return where(zero, value, f(where(zero, 1.0, x)))


_SQRT_PI_2, _SQRT_2PI = math.sqrt(math.pi) / 2, math.sqrt(2 * math.pi)
erfinv = _special_fn("erfinv", lambda c, g: [multiply(g, multiply(exp(square(c)), _SQRT_PI_2))], domain=(-1.0, 1.0),
                     doc="The inverse of ``erf`` on (-1, 1) (``torch.erfinv``; a normal's quantiles).")
ndtri = _special_fn("ndtri", lambda c, g: [multiply(g, multiply(exp(multiply(square(c), 0.5)), _SQRT_2PI))],
                    domain=(0.0, 1.0), doc="The standard normal's quantile function, the inverse of its CDF.")
log_ndtr = _special_fn(
    "log_ndtr", lambda c, g: [multiply(g, divide(exp(subtract(multiply(square(c.args[0]), -0.5), c)), _SQRT_2PI))],
    doc="The log of the standard normal's CDF, accurate far in the left tail.")
i0 = _special_fn("i0", lambda c, g: [multiply(g, i1(c.args[0]))],
                 doc="The modified Bessel function of the first kind of order 0 (von Mises distributions).")
i1 = _special_fn("i1", lambda c, g: [multiply(g, _at_zero(c.args[0], 0.5, lambda x: subtract(i0(x), divide(i1(x), x))))],
                 doc="The modified Bessel function of the first kind of order 1.")
i0e = _special_fn("i0e", lambda c, g: [multiply(g, subtract(i1e(c.args[0]), multiply(sign(c.args[0]), c)))],
                  doc="``exp(-|x|) i0(x)``, without overflow.")
i1e = _special_fn(
    "i1e", lambda c, g: [multiply(g, _at_zero(c.args[0], 0.5, lambda x: subtract(
        i0e(x), multiply(i1e(x), add(sign(x), reciprocal(x))))))],
    doc="``exp(-|x|) i1(x)``, without overflow.")
floor = unary("floor", _zero_grad, smooth=False, torch_name="floor")
ceil = unary("ceil", _zero_grad, smooth=False, torch_name="ceil")
round = unary("round", _zero_grad, smooth=False, torch_name="round",  # noqa: A001
              doc="Round half to even (NumPy/PyTorch); zero gradient.")
copy = unary("copy", lambda c, g: [g], kernel=lambda xp, x, attrs=None: xp.asarray(x, copy=True), dtypes=ALL_DTYPES,
             flops_per_elem=0, torch_name="clone")
logical_not = unary("logical_not", dtypes=("bool",), differentiable=False, nondiff_reason=_NO_GRAD_BOOL,
                    torch_name="logical_not")
isnan = unary("isnan", out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL, torch_name="isnan")
isfinite = unary("isfinite", out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL,
                 torch_name="isfinite")
signbit = unary("signbit", out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL, torch_name="signbit",
                doc="True where the sign bit is set: negative numbers, ``-0.0`` and NaNs with the bit set.")


@dataclass(frozen=True)
class ClipAttrs:
    a_min: float
    a_max: float

    def __post_init__(self):
        for f in ("a_min", "a_max"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise AttrError(f"attribute {f} must be a number, got {v!r}")
            object.__setattr__(self, f, float(v))
        if self.a_min > self.a_max:
            raise AttrError(f"attribute a_min ({self.a_min}) must not exceed attribute a_max ({self.a_max})")


def _clip_grad(c: Call, g: Expr):
    x = c.args[0]  # one kernel (``nn.clip_grad``: ATen's hardtanh_backward on the torch target); integers: none
    return [get_op("nn.clip_grad")(g, x, c.attrs.a_min, c.attrs.a_max) if is_float_expr(x) else None]


def _clip(xp, x, a):
    out = as_array(xp.clip(x, a.a_min, a.a_max))
    return out if out.dtype == x.dtype else xp.astype(out, x.dtype)  # integers: float bounds, then truncated


clip = unary("clip", _clip_grad, kernel=_clip, dtypes=DTYPES, attrs_type=ClipAttrs, flops_per_elem=2,
             kinks=lambda a: (a.a_min, a.a_max), example_attrs={"a_min": -1.0, "a_max": 1.0}, torch_name="clamp",
             doc="Clamp to [a_min, a_max]; the gradient passes where a_min <= x <= a_max (PyTorch's rule).")

# ------------------------------------------------------------------ binary


def _infer_binary(name, out_dtype, dtypes):
    def infer(arg_types, attrs):
        a = tensor_arg(name, arg_types, 0)
        b = tensor_arg(name, arg_types, 1)
        dtype = same_dtype(name, arg_types)
        if dtype not in dtypes:
            raise type_error(name, arg_types, f"arguments must be {_KIND.get(dtypes, '/'.join(dtypes))} tensors, got {dtype}")
        return TensorType(broadcast_shapes(name, arg_types, a.shape, b.shape), out_dtype or dtype)

    return infer


def binary(name: str, grad=None, *, fn: str = "", kernel=None, out_dtype=None, dtypes: tuple = DTYPES, **kw):
    """Define a broadcasting binary operator: kernel ``xp.<fn>(a, b)`` (``fn`` defaults to ``name``) and
    ufunc ``np.<fn>`` unless ``kernel`` is given; integer/bool arguments get no gradient. Arithmetic
    runs on NumPy without divide/invalid warnings (jax and torch give inf/nan silently)."""
    if kernel is None:
        kernel, ufunc = _named_kernel(fn or name, 2)
        kw.setdefault("ufunc", ufunc)
    if out_dtype != "bool":
        kw["impls"] = {"numpy": numpy_quiet(kernel), **kw.get("impls", {})}
    pattern = kw.pop("pattern", FusionKind.BROADCAST)
    return defop(name, 2, _infer_binary(name, out_dtype, tuple(dtypes)), kernel=kernel, dtypes=dtypes,
                 elementwise=True, grad=_float_grads(grad) if grad is not None else None, pattern=pattern, **kw)


def conj_if_complex(e: Expr) -> Expr:
    """The conjugate of a complex ``e`` (PyTorch's gradient convention), ``e`` itself when real."""
    return get_op("conj")(e) if is_complex(e.checked_type.dtype) else e


add = binary("add", lambda c, g: [unbroadcast(g, c.args[0]), unbroadcast(g, c.args[1])], dtypes=ALL_DTYPES,
             torch_name="add")
subtract = binary(
    "subtract", lambda c, g: [unbroadcast(g, c.args[0]), unbroadcast(negative(g), c.args[1])], dtypes=ALL_DTYPES,
    torch_name="sub"
)
multiply = binary(
    "multiply",
    lambda c, g: [unbroadcast(multiply(g, conj_if_complex(c.args[1])), c.args[0]),
                  unbroadcast(multiply(g, conj_if_complex(c.args[0])), c.args[1])],
    dtypes=ALL_DTYPES, torch_name="mul",
)


def _divide_grad(call: Call, g: Expr):
    """``g / b`` and ``-g * ((a / b) / b)``: PyTorch's formulas (``div_tensor_other_backward``), so a float32
    gradient rounds as eager's does."""
    a, b = call.args
    gb = negative(multiply(g, conj_if_complex(divide(call, b))))
    return [unbroadcast(divide(g, conj_if_complex(b)), a), unbroadcast(gb, b)]


def _divide(xp, a, b, attrs=None):
    if is_integer(xp, a):
        check_divisor(xp, "divide", b)
        return as_array(xp.floor_divide(a, b))
    return as_array(xp.divide(a, b))


def _checked_division(name: str, fn: str):
    """``xp.<fn>(a, b)`` with integer division by zero an error on every target (PyTorch's rule)."""

    def kernel(xp, a, b, attrs=None):
        check_divisor(xp, name, b)
        return as_array(getattr(xp, fn)(a, b))

    return kernel


divide = binary("divide", _divide_grad, kernel=_divide, ufunc=np.divide, domain=(None, _POSITIVE), dtypes=ALL_DTYPES,
                torch_name="div",
                doc="a / b; integer division floors (like floor_divide).")


def _power_grad(call: Call, g: Expr):
    a, b = call.args
    ga = multiply(g, multiply(b, power(a, subtract(b, _cl(1.0, b)))))
    pos = greater(a, _cl(0.0, a))
    safe_a = where(pos, a, T.ones_like(a))  # log(1) = 0: no exponent gradient where a <= 0
    gb = multiply(g, multiply(call, log(safe_a)))
    return [unbroadcast(ga, a), unbroadcast(gb, b)]


_power_kernel = _named_kernel("pow", 2)[0]
_power_quiet = numpy_quiet(_power_kernel)


def _power_numpy(a, b, attrs=None):
    """``np.power``; a float array to a scalar exponent 2 or 3 (of its dtype) by multiplication: ``powf`` per
    element is 20-40x slower (GPT-2's tanh GELU cubes its activations, its gradient squares them)."""
    if b.size == 1 and 0 < a.ndim and b.ndim <= a.ndim and a.dtype.kind == "f" and b.dtype == a.dtype:
        e = b.item()
        if e == 2.0:
            return np.multiply(a, a)
        if e == 3.0:
            out = np.multiply(a, a)
            out *= a
            return out
    return _power_quiet(a, b, attrs)


def _power_jax(a, b, attrs=None):
    """``jnp.power`` keeping C ``pow``'s exact cases ``x ** 0 = 1`` and ``1 ** y = 1`` (NaN and inf included):
    XLA rewrites ``pow(exp(u), v)`` to ``exp(u * v)``, which gives NaN there (``0 * inf``, ``nan * 0``)."""
    import jax.numpy as jnp

    p = jnp.power(a, b)
    return jnp.where((a == 1) | (b == 0), jnp.ones((), p.dtype), p)


power = binary("power", _power_grad, kernel=_power_kernel, ufunc=np.power, impls={"numpy": _power_numpy, "jax": _power_jax},
               domain=(_POSITIVE, None), flops=_flops_per_elem(4), torch_name="pow",
               doc="a ** b; the exponent gets a zero gradient where a <= 0.")


def _minmax_grad(pick, lose):
    """The share of ``a``: 1 where it wins, 0 where it loses, 1/2 on a tie, NaN where an operand is
    NaN (the result is NaN, and so is the gradient of both operands: the rule of max/min over a
    slice holding NaN; PyTorch would give both operands the whole gradient there)."""

    def grad(call: Call, g: Expr):
        a, b = call.args
        wins = where(pick(a, b), _cl(1.0, a), where(lose(a, b), _cl(0.0, a), where(equal(a, b), _cl(0.5, a), _cl(math.nan, a))))
        return [unbroadcast(multiply(g, wins), a), unbroadcast(multiply(g, subtract(_cl(1.0, a), wins)), b)]

    return grad


maximum = binary("maximum", _minmax_grad(lambda a, b: greater(a, b), lambda a, b: less(a, b)), kinks=(0.0,),
                 torch_name="maximum", doc="Elementwise max; ties split the gradient evenly (PyTorch's rule).")
minimum = binary("minimum", _minmax_grad(lambda a, b: less(a, b), lambda a, b: greater(a, b)), kinks=(0.0,),
                 torch_name="minimum", doc="Elementwise min; ties split the gradient evenly (PyTorch's rule).")

_NO_GRAD_STEP = "piecewise constant in its inputs; the gradient is zero or undefined"
floor_divide = binary("floor_divide", kernel=_checked_division("floor_divide", "floor_divide"), ufunc=np.floor_divide,
                      differentiable=False, nondiff_reason=_NO_GRAD_STEP, torch_name="floor_divide",
                      recompute=Recompute.SPECIAL)
# ``mod`` (truncated remainder) and ``remainder`` (floored) are defined with their gradients in ``ops.math``

_CMP = {"equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge"}
for _name, _tn in _CMP.items():
    globals()[_name] = binary(_name, out_dtype="bool", differentiable=False, nondiff_reason=_NO_GRAD_BOOL, torch_name=_tn)
equal, not_equal, less, less_equal, greater, greater_equal = (globals()[n] for n in _CMP)
logical_and = binary("logical_and", out_dtype="bool", dtypes=("bool",), differentiable=False,
                     nondiff_reason=_NO_GRAD_BOOL, torch_name="logical_and")
logical_or = binary("logical_or", out_dtype="bool", dtypes=("bool",), differentiable=False,
                    nondiff_reason=_NO_GRAD_BOOL, torch_name="logical_or")

# ------------------------------------------------------------------ where


def _infer_where(arg_types, attrs):
    c = tensor_arg("where", arg_types, 0)
    x = tensor_arg("where", arg_types, 1)
    y = tensor_arg("where", arg_types, 2)
    if c.dtype != "bool":
        raise type_error("where", arg_types, f"the condition must be bool, got {c.dtype}")
    if x.dtype != y.dtype:
        raise type_error("where", arg_types, f"branches have different dtypes {x.dtype} and {y.dtype}")
    return TensorType(broadcast_shapes("where", arg_types, c.shape, x.shape, y.shape), x.dtype)


def _where_grad(call: Call, g: Expr):
    c, x, y = call.args
    zero = _cl(0, g)  # 0-d: g has the result's shape, so each select keeps it
    return [None, unbroadcast(where(c, g, zero), x), unbroadcast(where(c, zero, g), y)]


_UINT_OF = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits_zero(a) -> bool:
    """True when every element of float array ``a`` is +0.0 (bit pattern 0; the first element is checked first)."""
    bits = a.view(_UINT_OF[a.dtype.itemsize])
    return bits.size > 0 and not bits.flat[0] and not bits.any()


def select_or_zero(cond: np.ndarray, value: np.ndarray, out=None) -> np.ndarray:
    """``np.where(cond, value, +0.0)`` for a float ``value`` as a bitwise AND (same bits, NaN/inf included).

    ``cond`` (bool) and ``value`` must broadcast to ``out``'s shape when ``out`` is given, else to ``cond``'s."""
    ut = _UINT_OF[value.dtype.itemsize]
    mask = cond.astype(ut)
    np.negative(mask, out=mask)  # all ones where cond
    if out is None:
        return np.bitwise_and(value.view(ut), mask, out=mask).view(value.dtype)
    np.bitwise_and(value.view(ut), mask, out=out.view(ut))
    return out


def _where_compute(c, x, y, attrs=None):
    """``np.where``; for float branches, bitwise with the condition as a mask: the same bits as ``np.where`` (NaN
    and inf included), an order of magnitude faster. Where one branch is +0.0 everywhere (a relu/clip/where
    gradient), an AND; where the condition has the result's shape, ``y ^ ((x ^ y) & mask)`` (NumPy's ``where``
    branches element by element: 4.0 ms on 1M float32 elements with a random condition, this 0.5)."""
    if (type(x) is np.ndarray and type(y) is np.ndarray and type(c) is np.ndarray and x.dtype == y.dtype
            and x.dtype.kind == "f" and x.dtype.itemsize in _UINT_OF and c.dtype == np.bool_):
        keep, zero_on_false = (x, True) if _bits_zero(y) else (y, False) if _bits_zero(x) else (None, None)
        shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
        if keep is None and c.shape == shape and c.size:
            ut = _UINT_OF[x.dtype.itemsize]
            mask = c.astype(ut)
            np.negative(mask, out=mask)  # all ones where c
            yb = y.view(ut)
            np.bitwise_and(np.bitwise_xor(x.view(ut), yb), mask, out=mask)
            mask ^= yb
            return mask.view(x.dtype)
        if keep is not None and np.broadcast_shapes(c.shape, keep.shape) == shape:
            ut = _UINT_OF[x.dtype.itemsize]
            mask = c.astype(ut)  # 1 / 0
            if zero_on_false:
                np.negative(mask, out=mask)  # all ones where c
            else:
                np.subtract(mask, ut(1), out=mask)  # all ones where not c
            if mask.shape == shape:
                return np.bitwise_and(keep.view(ut), mask, out=mask).view(x.dtype)
            return np.bitwise_and(keep.view(ut), mask).view(x.dtype)
    return np.where(c, x, y)


where = defop(
    "where",
    3,
    _infer_where,
    kernel=lambda xp, c, x, y, attrs=None: xp.where(c, x, y),
    impls={"numpy": _where_compute},
    elementwise=True,
    grad=lambda c, g: [r if r is None or is_float_expr(a) else None for r, a in zip(_where_grad(c, g), c.args)],
    pattern=FusionKind.BROADCAST,
    torch_name="where",
    dtypes=ALL_DTYPES,
)

