"""Well-formedness: variable binding, global references, arities and cached types.

``check_well_formed`` reports every problem at once in one ``WellFormedError``
(its ``problems`` attribute lists them). Rules, per module function:

- a Var is bound by at most one Function, and used only inside the Function
  that binds it (no free variables in a module function);
- every GlobalVar (called or used as a value) names a function of the module,
  and a call to it passes as many arguments as the callee has parameters;
- a call to an operator passes as many arguments as the operator takes;
- where nodes carry cached types, they are consistent with their operands:
  a Call's type equals ``op.infer(arg types, attrs)``, a global call's type the
  callee's return type, Tuple / TupleGetItem / If types follow their operands,
  and a parameter's type equals its annotation.

A Function value (closure) inside a body is well formed; first-order passes
reject it themselves. Different module functions may share nodes (and even
parameter Vars): binding is checked inside each function.
"""

from __future__ import annotations

from typing import Optional, Union

from ..ir.errors import PullbackError, WellFormedError
from ..ir.expr import Call, Expr, Function, GlobalVar, Op, Var
from ..ir.module import IRModule
from ..ir.structural import describe_node
from ..ir.traversal import children, post_order
from ..ir.type_rules import node_type, op_result_type
from ..ir.types import FuncType
from ..ops.registry import OpDef

Checkable = Union[IRModule, Function, Expr]


class _CannotTell(Exception):
    """The type of a module function is not cached: a node calling it is not checked."""


def _where(fn_name: Optional[str], node: Expr) -> str:
    loc = f" at {node.span}" if getattr(node, "span", None) else ""
    return (f"in @{fn_name}" if fn_name else "in the expression") + loc


def _args(n: int) -> str:
    return f"{n} argument{'s' if n != 1 else ''}"


class _Checker:
    def __init__(self, mod: Optional[IRModule]):
        self.mod = mod
        self.problems: list[str] = []
        self.skipped: set[Expr] = set()  # nodes verified before and unchanged (check_nodes)
        self.done: set[Expr] = set()  # nodes checked (problems reported once, not per function sharing them)

    def report(self, fn_name: Optional[str], node: Expr, message: str) -> None:
        self.problems.append(f"{_where(fn_name, node)}: {message} [{describe_node(node)}]")

    # -- binding
    def check_binding(self, root: Expr, nodes: list, fn_name: Optional[str]) -> None:
        # nodes hash by identity (Expr defines no __eq__): tables keyed by node, without id() calls
        binder: dict[Var, Function] = {}
        functions = [n for n in nodes if isinstance(n, Function)]
        for f in functions:
            for p in f.params:
                if p in binder and binder[p] is not f:
                    self.report(fn_name, p, f"variable %{p.name_hint} is bound by two functions")
                binder[p] = f
        if functions == [root]:  # fast path: one scope
            for n in nodes:
                if isinstance(n, Var) and n not in binder:
                    self.report(fn_name, n, f"free variable %{n.name_hint} (not a parameter of any enclosing function)")
            return
        # walk each function body in its own scope, with the params of enclosing functions in view
        # a bare expression may use free variables; a function may not
        outer_bound = frozenset() if isinstance(root, Function) else frozenset(
            n for n in nodes if isinstance(n, Var) and n not in binder)
        stack: list = [(root, outer_bound)]
        seen_fn: set[Function] = set()
        reported: set[Var] = set()
        while stack:
            body, bound = stack.pop()
            if isinstance(body, Function):
                if body in seen_fn:
                    continue
                seen_fn.add(body)
                bound = bound | set(body.params)
                body = body.body
            for n in post_order(body):
                if isinstance(n, Var):
                    if n not in bound and n not in reported:
                        reported.add(n)
                        if n in binder:
                            self.report(fn_name, n, f"variable %{n.name_hint} is used outside the function that binds it")
                        else:
                            self.report(fn_name, n, f"free variable %{n.name_hint} (not a parameter of any enclosing function)")
                elif isinstance(n, Function):
                    stack.append((n, bound))
                elif isinstance(n, Call) and isinstance(n.op, Function):
                    stack.append((n.op, bound))

    # -- globals, arity and cached types
    def check_nodes(self, nodes: list, fn_name: Optional[str], verified: Optional[dict] = None) -> None:
        """Check every node; with ``verified`` (``node -> cached type`` of nodes that passed an
        earlier check), skip a node whose own checks cannot have a different outcome: same
        cached type object, every operand skipped as well, and no reference to a module
        function (those depend on the module)."""
        skipped, done = self.skipped, self.done
        for n in nodes:
            if n in done:  # a node shared with a function checked before
                continue
            if verified is not None and type(n) is not GlobalVar:
                t, now = verified.get(n, _ABSENT), n._checked_type
                if t is (now if now is not None else _UNTYPED) and not (isinstance(n, Call) and isinstance(n.op, GlobalVar)):
                    for c in children(n, True):
                        if c not in skipped:
                            break
                    else:
                        skipped.add(n)
                        continue
            if isinstance(n, GlobalVar):
                self.check_global(n, fn_name)
            elif isinstance(n, Call):
                self.check_call(n, fn_name)
                if not isinstance(n.op, GlobalVar):  # calls of module functions are checked in each caller
                    done.add(n)
            else:
                done.add(n)
            if n._checked_type is not None:
                self.check_type(n, fn_name)

    def check_global(self, gv: GlobalVar, fn_name: Optional[str]) -> Optional[Function]:
        if self.mod is None:
            return None
        if gv.name_hint not in self.mod:
            self.report(fn_name, gv, f"reference to @{gv.name_hint}, which is not a function of the module")
            return None
        return self.mod[gv.name_hint]

    def check_call(self, call: Call, fn_name: Optional[str]) -> None:
        op = call.op
        if isinstance(op, OpDef):
            if not op.takes(len(call.args)):
                self.report(fn_name, call, f"{op.name} takes {op.arity()}, got {len(call.args)}")
            return
        if isinstance(op, GlobalVar):
            callee = self.check_global(op, fn_name)
            label = "@" + op.name_hint
        else:
            callee, label = op, "the primitive function"
        if callee is not None and len(callee.params) != len(call.args):
            self.report(fn_name, call, f"{label} takes {_args(len(callee.params))}, got {len(call.args)}")

    def callee_type(self, gv: GlobalVar) -> FuncType:
        callee = self.mod[gv.name_hint] if self.mod is not None and gv.name_hint in self.mod else None
        t = callee._checked_type if callee is not None else None
        if not isinstance(t, FuncType):
            raise _CannotTell
        return t

    def expected_type(self, n: Expr):
        """The type ``n`` should have given its operands' cached types (None: cannot tell)."""
        if type(n) is Call and isinstance(n.op, Op):  # the common case, without the generic rule's dispatch
            arg_types = []
            for a in n.args:
                t = a._checked_type
                if t is None:
                    return None
                arg_types.append(t)
            try:
                return op_result_type(n.op, arg_types, n.attrs)
            except PullbackError:
                pass  # node_type below raises it again, with the operator and the place in its message
        elif isinstance(n, Var):
            return n.type_annotation
        for c in children(n, True):
            if c._checked_type is None:
                return None
        try:
            return node_type(n, self.callee_type)
        except _CannotTell:
            return None

    def check_type(self, n: Expr, fn_name: Optional[str]) -> None:
        try:
            want = self.expected_type(n)
        except PullbackError as e:
            self.report(fn_name, n, f"cached type {n._checked_type!r} is inconsistent: {e}")
            return
        if want is not None and want is not n._checked_type and want != n._checked_type:
            source = "its annotation is" if isinstance(n, Var) else "its operands give"
            self.report(fn_name, n, f"cached type {n._checked_type!r} but {source} {want!r}")


def check_well_formed(target: Checkable, mod: Optional[IRModule] = None) -> None:
    """Raise ``WellFormedError`` listing every problem of ``target`` (an IRModule, a Function
    or an expression). GlobalVars are resolved in ``target`` (a module) or ``mod``;
    without a module they are not checked."""
    _check_well_formed(target, mod, None)


_ABSENT = object()
_UNTYPED = object()  # the recorded "type" of a node verified while untyped


class VerifiedNodes:
    """What a successful ``check_well_formed`` verified, for an incremental re-check of the next
    module (e.g. a pass's output, which shares most nodes with its input): ``types`` maps each
    node (which it keeps alive) to its cached type then."""

    __slots__ = ("types",)

    def __init__(self, types: Optional[dict] = None):
        self.types = types


def _check_well_formed(target: Checkable, mod: Optional[IRModule], verified: Optional[VerifiedNodes]) -> None:
    if isinstance(target, IRModule):
        mod, roots = target, list(target.items())
    elif isinstance(target, Expr):
        roots = [(None, target)]
    else:
        raise WellFormedError(f"check_well_formed expects an IRModule, Function or Expr, got {type(target).__name__}")
    checker = _Checker(mod)
    orders = []
    for name, fn in roots:
        nodes = post_order(fn, into_functions=True)
        orders.append(nodes)
        checker.check_binding(fn, nodes, name)
        checker.check_nodes(nodes, name, verified.types if verified is not None else None)
    if checker.problems:
        n = len(checker.problems)
        err = WellFormedError(f"ill-formed IR ({n} problem{'s' if n != 1 else ''}):\n" + "\n".join(f"  - {p}" for p in checker.problems))
        err.problems = list(checker.problems)
        raise err
    if verified is not None:  # everything checked is consistent: remember it (and keep it alive)
        untyped = _UNTYPED
        verified.types = {n: (n._checked_type if n._checked_type is not None else untyped)
                          for nodes in orders for n in nodes}


def is_well_formed(target: Checkable, mod: Optional[IRModule] = None) -> bool:
    """True if ``check_well_formed(target, mod)`` raises nothing."""
    try:
        check_well_formed(target, mod)
    except WellFormedError:
        return False
    return True


__all__ = ["check_well_formed", "is_well_formed"]
