"""Shared harness of the operator tests: op cases, a tiny reference evaluator, rule and torch checks.

A ``Case`` is one operator applied to concrete float64 inputs. Tests evaluate
its forward with the op kernels, check the kernel's dtype/shape against type
inference, compare the gradient *rule* (``op.grad``) with central finite
differences, and compare forward and vector-Jacobian products with PyTorch.
Each test module exports ``CASES`` (the op names are collected by test_registry).
"""

from __future__ import annotations

import importlib
import pathlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

import pullback
from pullback.analysis import infer_expr
from pullback.ir.expr import Call, Constant, Expr, Tuple, TupleGetItem, Var
from pullback.ir.traversal import post_order
from pullback.ir.types import TensorType, TupleType, complex_of, is_complex
from pullback.ops import get_op

FLOAT = "float64"

# (op, target) pairs a target cannot run, with the error it must give instead of a result
UNSUPPORTED = {(name, "jax"): "the result's shape depends on the data" for name in ("nonzero", "unique")}


@dataclass
class Case:
    """``op`` applied to ``inputs`` (float64 unless given), built by ``build(*vars)``."""

    op: str
    inputs: list
    build: Callable
    torch: Optional[Callable] = None  # (*torch_tensors) -> tensor or tuple of tensors
    wrt: Optional[list] = None  # argument positions to differentiate (default: float inputs)
    id: str = ""
    tol: float = 1e-6
    fd: bool = True  # False where finite differences are not defined (exact ties)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.inputs = [np.asarray(x) for x in self.inputs]
        if self.wrt is None:
            self.wrt = [i for i, x in enumerate(self.inputs) if x.dtype.kind in "fc"]
        if not self.id:
            shapes = "_".join("x".join(map(str, x.shape)) or "s" for x in self.inputs)
            self.id = f"{self.op}-{shapes}"

    def __repr__(self) -> str:
        return self.id


def case(op: str, *inputs, attrs: Optional[dict] = None, args: tuple = (), torch=None, **kw) -> Case:
    """A Case calling ``pullback.op.<op>(*vars, *args, **attrs)``."""
    attrs = attrs or {}
    return Case(op, list(inputs), lambda *xs: get_op(op)(*xs, *args, **attrs), torch, **kw)


def case_tables(exclude: tuple = ("test_registry", "test_all_targets")) -> list:
    """``(module name, case)`` for every Case in a module-level list of Cases of tests/ops/test_*.py
    (the op test tables; each case once)."""
    out, seen = [], set()
    for path in sorted(pathlib.Path(__file__).parent.glob("test_*.py")):
        if path.stem in exclude:
            continue
        for value in vars(importlib.import_module(path.stem)).values():
            if isinstance(value, (list, tuple)) and value and all(isinstance(c, Case) for c in value):
                out.extend((path.stem, c) for c in value if id(c) not in seen and not seen.add(id(c)))
    return out


def at_precision(x: np.ndarray, dtype: str) -> np.ndarray:
    """A float input in ``dtype`` (float32/float64), a complex one in the complex dtype of that precision."""
    if x.dtype.kind == "f":
        return x.astype(dtype)
    return x.astype(complex_of(dtype)) if x.dtype.kind == "c" else x


def vars_for(inputs) -> list:
    return [pullback.var(f"x{i}", TensorType(x.shape, x.dtype.name)) for i, x in enumerate(inputs)]


def to_target(target: str, x: np.ndarray):
    """NumPy array ``x`` as an array of ``target`` (``numpy``, ``jax``, ``torch``)."""
    if target == "jax":
        import jax.numpy as jnp

        return jnp.asarray(x)
    if target == "torch":
        import torch

        return torch.from_numpy(np.array(x, copy=True))
    return x


def evaluate(expr: Expr, env: dict, target: str = "numpy", calls: Optional[list] = None):
    """Reference interpreter: ``op.impl(target)`` over a post order; on NumPy, checks each kernel result
    against its type. Appends the value of every Call to ``calls`` when given."""
    vals: dict = {}
    for node in post_order(expr):
        if isinstance(node, Var):
            v = env[node]
        elif isinstance(node, Constant):
            v = to_target(target, node.data)
        elif isinstance(node, Call):
            v = node.op.impl(target)(*[vals[a] for a in node.args], node.attrs)
            if target == "numpy":
                check_value(v, node.checked_type, node.op.name)
            if calls is not None:
                calls.append(v)
        elif isinstance(node, Tuple):
            v = tuple(vals[f] for f in node.fields)
        elif isinstance(node, TupleGetItem):
            v = vals[node.tuple_value][node.index]
        else:
            raise TypeError(f"cannot evaluate {type(node).__name__}")
        vals[node] = v
    return vals[expr]


def check_value(v, ty, what: str) -> None:
    if isinstance(ty, TupleType):
        assert isinstance(v, tuple) and len(v) == len(ty.fields), f"{what}: expected a tuple of {len(ty.fields)}"
        for x, t in zip(v, ty.fields):
            check_value(x, t, what)
        return
    assert isinstance(v, np.ndarray), f"{what}: kernel returned {type(v).__name__}, not an ndarray"
    assert v.dtype.name == ty.dtype, f"{what}: kernel dtype {v.dtype} but inferred {ty.dtype}"
    assert len(v.shape) == ty.ndim and all(d is pullback.Any or d == s for d, s in zip(ty.shape, v.shape)), (
        f"{what}: kernel shape {v.shape} but inferred {ty.shape}")


def forward(c: Case, inputs=None):
    inputs = c.inputs if inputs is None else inputs
    xs = vars_for(inputs)
    out = c.build(*xs)
    infer_expr(out)
    return evaluate(out, dict(zip(xs, inputs))), out


def cotangent(out_type, rng):
    if isinstance(out_type, TupleType):
        return [cotangent(t, rng) for t in out_type.fields]
    if is_complex(out_type.dtype):
        return (rng.standard_normal(out_type.shape) + 1j * rng.standard_normal(out_type.shape)).astype(out_type.dtype)
    return rng.standard_normal(out_type.shape).astype(out_type.dtype)


def _pairing(g, y) -> float:
    """``<g, y>`` over the reals: ``Re(sum(conj(g) * y))`` (PyTorch's convention for complex values)."""
    return float(np.sum(np.real(np.conj(g) * y)))


def _flat(v) -> list:
    return [x for f in v for x in _flat(f)] if isinstance(v, (tuple, list)) else [np.asarray(v)]


def rule_vjp(c: Case, gval) -> list:
    """Evaluate ``op.grad(call, g)`` for the call built by the case (only the outermost call's rule)."""
    xs = vars_for(c.inputs)
    call = c.build(*xs)
    infer_expr(call)
    assert isinstance(call, Call)
    gtype = call.checked_type
    if isinstance(gtype, TupleType):
        gvars = [pullback.var(f"g{i}", t) for i, t in enumerate(gtype.fields)]
        g = Tuple(gvars)
        genv = dict(zip(gvars, gval))
    else:
        g = pullback.var("g", gtype)
        genv = {g: gval}
    env = {**dict(zip(xs, c.inputs)), **genv}
    grads = call.op.grad(call, g)
    assert len(grads) == len(call.args), f"{c.op}: rule returned {len(grads)} gradients for {len(call.args)} args"
    out = []
    for i, (ge, arg) in enumerate(zip(grads, call.args)):
        if ge is None:
            out.append(None)
            continue
        infer_expr(ge)
        assert ge.checked_type == arg.checked_type, f"{c.op}: gradient {i} has type {ge.checked_type}, arg {arg.checked_type}"
        out.append(evaluate(ge, env))
    return out


def fd_vjp(c: Case, gval, i: int, eps: float = 1e-6) -> np.ndarray:
    """Central differences of <g, f(x)> with respect to input ``i`` (for a complex input, d/dRe + i d/dIm)."""
    gflat = _flat(gval)
    base = [x.copy() for x in c.inputs]
    xvars = vars_for(base)
    expr = c.build(*xvars)
    infer_expr(expr)
    out = np.zeros(base[i].shape, dtype=base[i].dtype if base[i].dtype.kind == "c" else np.float64)
    it = np.nditer(base[i], flags=["multi_index"])
    for _ in it:
        k = it.multi_index
        for unit in (1, 1j) if base[i].dtype.kind == "c" else (1,):
            vals = []
            for s in (1, -1):
                xs = [x.copy() for x in base]
                xs[i][k] += s * eps * unit
                y = evaluate(expr, dict(zip(xvars, xs)))
                vals.append(sum(_pairing(a, b) for a, b in zip(gflat, _flat(y))))
            out[k] += unit * (vals[0] - vals[1]) / (2 * eps)
    return out


def check_rule(c: Case, seed: int = 0) -> None:
    """The gradient rule matches central finite differences for each differentiated input."""
    if not c.fd:
        return
    rng = np.random.default_rng(seed)
    _, out = forward(c)
    gval = cotangent(out.checked_type, rng)
    got = rule_vjp(c, gval)
    for i in c.wrt:
        assert got[i] is not None, f"{c.op}: no gradient for argument {i}"
        np.testing.assert_allclose(got[i], fd_vjp(c, gval, i), rtol=c.tol, atol=c.tol, err_msg=f"{c.id} d/dx{i}")


def torch_check(c: Case, seed: int = 0) -> None:
    """Forward value and vector-Jacobian product equal PyTorch's (float64)."""
    import torch

    rng = np.random.default_rng(seed)
    ours, out = forward(c)
    ts = [torch.tensor(x, requires_grad=(i in c.wrt)) for i, x in enumerate(c.inputs)]
    theirs = c.torch(*ts)
    theirs_l = list(theirs) if isinstance(theirs, (tuple, list)) else [theirs]
    for a, b in zip(_flat(ours), theirs_l):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{c.id} forward")
    if not c.wrt or pullback.ops.get_op(c.op).grad is None:  # (no rule of its own: an expansion, or none)
        return
    gval = cotangent(out.checked_type, rng)
    gs = [torch.tensor(g) for g in _flat(gval)]
    tg = torch.autograd.grad(theirs_l, [ts[i] for i in c.wrt], gs, allow_unused=True)
    got = rule_vjp(c, gval)
    for i, t in zip(c.wrt, tg):
        want = np.zeros(c.inputs[i].shape) if t is None else t.numpy()
        np.testing.assert_allclose(got[i], want, rtol=1e-9, atol=1e-12, err_msg=f"{c.id} torch d/dx{i}")


def dtype_check(c: Case, dtype: str) -> None:
    """Kernels return exactly the inferred dtype and shape when float inputs are ``dtype``."""
    inputs = [at_precision(x, dtype) for x in c.inputs]
    with np.errstate(all="ignore"):
        forward(c, inputs)  # evaluate() checks dtype and shape of every kernel result


def function_of(c: Case):
    xs = vars_for(c.inputs)
    return pullback.Function(xs, c.build(*xs)), xs


def check_ad(c: Case) -> None:
    """The AD pass (``pullback.testing.check_grad``) on the case agrees with finite differences."""
    from pullback.testing import check_grad

    if not c.fd or not c.wrt:
        return
    fn, xs = function_of(c)
    check_grad(fn, c.inputs, wrt=[xs[i] for i in c.wrt], rtol=c.tol, atol=c.tol)


def check_second(c: Case) -> None:
    """Hessian-vector products through the AD pass applied to its own output."""
    from pullback.testing import check_second_order

    fn, xs = function_of(c)
    check_second_order(fn, c.inputs, wrt=[xs[i] for i in c.wrt], rtol=1e-5, atol=1e-6)
