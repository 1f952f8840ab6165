"""FirstOrderGradient: first-order reverse-mode AD as a module pass.

For ``@main(x0..xn) -> r`` it adds ``@main_grad(x0..xn) -> (r, (dx0..dxn))``
(``mode="vjp"``: one more parameter, the cotangent of ``r``); an existing
function is never replaced. Steps:

1. type inference; the call graph reachable from the function (recursion is a
   problem); one scan of every reachable body collecting *every* problem
   (operators without gradient whose output needs one, closures, recursion,
   integer parameters in ``wrt``) into one ``DiagnosticError``;
2. calls to global and primitive functions are inlined (callees first), and
   calls of operators without a rule of their own replaced by their expansion
   into operators that have one (``OpDef.expand``: an LSTM's gradient);
3. one reverse sweep (``ad.sweep``) over the body in reverse post order
   applying one transpose rule per node (``ad.rules``: operators, Tuple,
   TupleGetItem, If), with symbolic zeros (``ad.zeros``); linear in the
   program size and in If nesting depth, iterative (no recursion on depth or
   nesting); a forward If whose backward needs branch-local values is widened
   to return them too (``ad.residuals``), so only the taken branch runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ..analysis.type_infer import infer_module
from ..ir.errors import DiagnosticError, PassError
from ..ir.expr import Expr, Function, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import post_order
from ..ir.types import FuncType, TupleType
from .ad.common import all_float_leaves, build_struct, has_float_leaf, ones, typed_as
from .ad.inline import expand_calls, inline_calls
from .ad.scan import active_nodes, scan_module
from .ad.sweep import ReverseSweep
from ..ir.gc_pause import gc_paused
from .pass_infra import ModulePass, PassContext

WrtSpec = Optional[Union[str, Var, Sequence[Union[str, Var]]]]
MODES = ("grad", "vjp")


def resolve_wrt(fn: Function, wrt: WrtSpec, fn_name: str = "main") -> tuple[list[Var], list[str]]:
    """The parameters to differentiate with respect to, and problems with ``wrt``.

    Default: every parameter whose type is a float tensor or a tuple of float tensors.
    """
    if wrt is None:
        return [p for p in fn.params if all_float_leaves(p.type_annotation)], []
    items = [wrt] if isinstance(wrt, (str, Var)) else list(wrt)
    by_name: dict[str, list[Var]] = {}
    for p in fn.params:
        by_name.setdefault(p.name_hint, []).append(p)
    out: list[Var] = []
    problems: list[str] = []
    for w in items:
        if isinstance(w, Var):
            if not any(w is p for p in fn.params):
                problems.append(f"wrt: %{w.name_hint} is not a parameter of @{fn_name}")
                continue
            p = w
        elif isinstance(w, str):
            found = by_name.get(w.lstrip("%"), [])
            if len(found) != 1:
                why = "is not a parameter" if not found else "names several parameters; pass the Var"
                problems.append(f"wrt: {w!r} {why} of @{fn_name} (parameters: {', '.join('%' + q.name_hint for q in fn.params)})")
                continue
            p = found[0]
        else:
            raise PassError(f"FirstOrderGradient: wrt entries must be parameter names or Vars, got {w!r}")
        if any(p is q for q in out):
            problems.append(f"wrt: %{p.name_hint} is listed twice")
        elif not has_float_leaf(p.type_annotation):
            problems.append(f"gradient requested for %{p.name_hint} of type {p.type_annotation!r}: integer and boolean values carry no gradient, in @{fn_name}")
        else:
            out.append(p)
    return out, problems


def _seed(body: Expr, mode: str) -> tuple[Expr, Optional[Var]]:
    """The adjoint of the result: ones on every float leaf, or a cotangent parameter."""
    if mode == "vjp":
        ct = Var("ct", body.checked_type)
        return ct, ct
    return build_struct(body.checked_type, lambda p, t: ones(t, None if t.is_static else _at(body, p))), None


def _at(e: Expr, path) -> Expr:
    for i in path:
        e = TupleGetItem(e, i)
    return e


def differentiate(mod: IRModule, func: str = "main", wrt: WrtSpec = None, mode: str = "grad") -> Function:
    """The gradient function of ``mod[func]`` (see ``FirstOrderGradient``)."""
    with gc_paused():
        return _differentiate(mod, func, wrt, mode)


def _differentiate(mod: IRModule, func: str, wrt: WrtSpec, mode: str) -> Function:
    if mode not in MODES:
        raise PassError(f"FirstOrderGradient: mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if not isinstance(mod, IRModule):
        raise PassError(f"FirstOrderGradient expects an IRModule, got {type(mod).__name__}")
    fn = mod[func]  # raises naming the known functions
    infer_module(mod)  # returns at once when every function is typed
    params, problems = resolve_wrt(fn, wrt, func)
    scans, _, found = scan_module(mod, func, params)
    problems += found
    if problems:
        raise DiagnosticError(f"FirstOrderGradient cannot differentiate @{func}", problems)
    entry = scans[func]
    order, active = entry.order, entry.active
    if entry.has_calls or any(s.expansions for s in scans.values()):
        fn = expand_calls(inline_calls(mod, func) if entry.has_calls else fn)
        order = post_order(fn.body)
        active = active_nodes(order, params)
    body = fn.body
    sweep = ReverseSweep(body, order, active, func, fn, mod)
    seed, ct = _seed(body, mode)
    sweep.run(seed)
    grads = [sweep.param_adjoint(p) for p in params]
    out = sweep.finish(Tuple([body, Tuple(grads)]))
    new_params = list(fn.params) + ([ct] if ct is not None else [])
    ret = TupleType((out.fields[0].checked_type, TupleType(tuple(g.checked_type for g in grads))))
    return typed_as(Function(new_params, out, ret), FuncType(tuple(p.type_annotation for p in new_params), ret))


@dataclass(frozen=True)
class FirstOrderGradient(ModulePass, name="FirstOrderGradient"):
    """Reverse-mode AD: adds ``@{func}_grad`` (or ``name``) returning ``(result, (gradients...))``.

    An existing function is never replaced: when the module already has one of that name
    (a second run, a user function), a ``PassError`` names it; choose another ``name``.

    ``wrt``: parameter names or Vars (default: every floating-point parameter, tuple
    parameters whose leaves are all float included); the gradient tuple follows its
    order. ``mode="grad"`` seeds ones for every tensor of the result (the gradient of
    the sum of all outputs); ``mode="vjp"`` appends one cotangent parameter ``ct`` of
    the result's type. What cannot be differentiated (operators without gradient,
    closures, recursion, integer parameters in ``wrt``) is reported in one
    ``DiagnosticError`` listing every problem.
    """

    func: str = "main"
    wrt: WrtSpec = None
    mode: str = "grad"
    name: Optional[str] = None  # the gradient function's name (default ``{func}_grad``)

    def __post_init__(self):
        func, name = self.func, self.name
        if not isinstance(func, str) or not func:
            raise PassError(f"FirstOrderGradient: func must be a function name, got {func!r}")
        if self.mode not in MODES:
            raise PassError(f"FirstOrderGradient: mode must be one of {', '.join(map(repr, MODES))}, got {self.mode!r}")
        if name is not None and not isinstance(name, str):
            raise PassError(f"FirstOrderGradient: name must be a function name, got {name!r}")
        if isinstance(self.wrt, list):  # options stay hashable
            object.__setattr__(self, "wrt", tuple(self.wrt))
        object.__setattr__(self, "name", name or f"{func}_grad")
        if self.name == func:
            raise PassError(f"FirstOrderGradient: the gradient function cannot replace @{func}")

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        if self.name in mod:  # never replace a function: its callers would silently change behaviour
            raise PassError(
                f"FirstOrderGradient: the module already has a function @{self.name}, and the gradient of "
                f"@{self.func} never replaces one; pass name= a new name "
                f"(functions: {', '.join('@' + k for k in mod)})"
            )
        return mod.with_function(self.name, differentiate(mod, self.func, self.wrt, self.mode))


def gradient(fn_or_mod: Union[Function, IRModule], wrt: WrtSpec = None, mode: str = "grad", func: str = "main") -> Function:
    """The gradient Function of a Function (or of ``mod[func]``): ``fn(x..) -> (r, (dx..))``."""
    if isinstance(fn_or_mod, IRModule):
        mod = fn_or_mod
    elif isinstance(fn_or_mod, Function):
        mod = IRModule.from_expr(fn_or_mod)
    else:
        raise PassError(f"gradient expects a Function or an IRModule, got {type(fn_or_mod).__name__}")
    name, k = f"{func}_grad", 0
    while name in mod:  # the Function is returned, not the module: any free name will do
        k += 1
        name = f"{func}_grad_{k}"
    return FirstOrderGradient(func, wrt, mode, name)(mod)[name]


__all__ = ["FirstOrderGradient", "gradient", "differentiate", "resolve_wrt"]
