"""Type inference: sets ``checked_type`` on every node, iteratively.

Types are a pure function of a node (vars carry annotations, operators their
type relations), so a cached ``checked_type`` is never stale and nodes shared
between modules are typed once.
"""

from __future__ import annotations

from typing import Optional

from ..ir.errors import PullbackError, TypeInferenceError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import global_calls, post_order
from ..ir.types import Any, FuncType, TensorType, TupleType, Type
from ..ops.registry import OpDef


def types_compatible(expected: Type, given: Type) -> bool:
    """Equal types, where an ``Any`` dim on either side matches any size."""
    stack = [(expected, given)]
    while stack:
        a, b = stack.pop()
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            if a.dtype != b.dtype or a.ndim != b.ndim:
                return False
            if any(x is not Any and y is not Any and x != y for x, y in zip(a.shape, b.shape)):
                return False
        elif isinstance(a, TupleType) and isinstance(b, TupleType):
            if len(a.fields) != len(b.fields):
                return False
            stack.extend(zip(a.fields, b.fields))
        elif isinstance(a, FuncType) and isinstance(b, FuncType):
            if len(a.arg_types) != len(b.arg_types):
                return False
            stack.extend(zip(a.arg_types, b.arg_types))
            stack.append((a.ret_type, b.ret_type))
        else:
            return False
    return True


def join_types(a: Type, b: Type) -> Optional[Type]:
    """The most precise type both ``a`` and ``b`` fit (dims that differ become Any); None if incompatible."""
    if not types_compatible(a, b):
        return None
    if a == b:
        return a
    if isinstance(a, TensorType):
        return TensorType(tuple(x if x == y else Any for x, y in zip(a.shape, b.shape)), a.dtype)
    if isinstance(a, TupleType):
        return TupleType(tuple(join_types(x, y) for x, y in zip(a.fields, b.fields)))
    return a


def _where(fn_name: Optional[str], node: Expr) -> str:
    loc = f" at {node.span}" if getattr(node, "span", None) else ""
    return f" in @{fn_name}{loc}" if fn_name else loc


class _Inferencer:
    def __init__(self, mod: Optional[IRModule]):
        self.mod = mod
        self.fn_types: dict[str, FuncType] = {}
        self.in_progress: set[str] = set()

    def global_type(self, gv: GlobalVar, fn_name: Optional[str]) -> FuncType:
        name = gv.name_hint
        if name in self.fn_types:
            return self.fn_types[name]
        if self.mod is None or name not in self.mod:
            raise TypeInferenceError(f"call to unknown global function @{name}{_where(fn_name, gv)}")
        fn = self.mod[name]
        if isinstance(fn._checked_type, FuncType):  # typed already (what infer_module would use)
            self.fn_types[name] = fn._checked_type
            return fn._checked_type
        if all(p.type_annotation is not None for p in fn.params) and fn.ret_type is not None:
            return FuncType(tuple(p.type_annotation for p in fn.params), fn.ret_type)
        raise TypeInferenceError(f"@{name} is used before its type is known (recursion needs a ret_type annotation){_where(fn_name, gv)}")

    def infer_module(self) -> None:
        """Infer every function, callees first (explicit-stack DFS over the call graph)."""
        mod = self.mod
        done: set[str] = set()
        for root in mod:
            stack = [(root, False)]
            while stack:
                name, expanded = stack.pop()
                if expanded:
                    self.in_progress.discard(name)
                    if name not in done:
                        fn = mod[name]
                        self.infer_expr(fn, name)
                        self.fn_types[name] = fn.checked_type
                        done.add(name)
                    continue
                if name in done or name in self.in_progress:
                    continue
                self.in_progress.add(name)
                stack.append((name, True))
                for gv in global_calls(mod[name].body):
                    if gv.name_hint in mod and gv.name_hint not in done and gv.name_hint not in self.in_progress:
                        stack.append((gv.name_hint, False))

    def infer_expr(self, root: Expr, fn_name: Optional[str] = None) -> Type:
        for node in post_order(root, into_functions=True):
            if node._checked_type is not None:
                continue
            node._checked_type = self.infer_node(node, fn_name)
        return root.checked_type

    def infer_node(self, node: Expr, fn_name: Optional[str]) -> Type:
        if isinstance(node, Var):
            if node.type_annotation is None:
                raise TypeInferenceError(f"variable %{node.name_hint} has no type annotation{_where(fn_name, node)}")
            return node.type_annotation
        if isinstance(node, Constant):
            return TensorType(node.data.shape, node.data.dtype.name)
        if isinstance(node, GlobalVar):
            return self.global_type(node, fn_name)
        if isinstance(node, Call):
            return self.infer_call(node, fn_name)
        if isinstance(node, Tuple):
            return TupleType(tuple(f.checked_type for f in node.fields))
        if isinstance(node, TupleGetItem):
            t = node.tuple_value.checked_type
            if not isinstance(t, TupleType):
                raise TypeInferenceError(f"TupleGetItem .{node.index} of a non-tuple value of type {t!r}{_where(fn_name, node)}")
            if node.index >= len(t.fields):
                raise TypeInferenceError(f"TupleGetItem index {node.index} is out of range for a tuple of {len(t.fields)} fields {t!r}{_where(fn_name, node)}")
            return t.fields[node.index]
        if isinstance(node, If):
            c = node.cond.checked_type
            if not (isinstance(c, TensorType) and c.ndim == 0 and c.dtype == "bool"):
                raise TypeInferenceError(f"If condition must be a bool scalar, got {c!r}{_where(fn_name, node)}")
            a, b = node.true_branch.checked_type, node.false_branch.checked_type
            j = join_types(a, b)
            if j is None:
                raise TypeInferenceError(f"If branches have different types: {a!r} and {b!r}{_where(fn_name, node)}")
            return j
        if isinstance(node, Function):
            body_t = node.body.checked_type
            for p in node.params:
                if p.type_annotation is None:
                    raise TypeInferenceError(f"parameter %{p.name_hint} has no type annotation{_where(fn_name, p)}")
            if node.ret_type is not None:
                if not types_compatible(node.ret_type, body_t):
                    raise TypeInferenceError(f"function body has type {body_t!r} but the declared return type is {node.ret_type!r}{_where(fn_name, node)}")
                body_t = node.ret_type
            return FuncType(tuple(p.type_annotation for p in node.params), body_t)
        raise TypeInferenceError(f"cannot infer the type of {type(node).__name__}{_where(fn_name, node)}")

    def infer_call(self, node: Call, fn_name: Optional[str]) -> Type:
        arg_types = [a.checked_type for a in node.args]
        op = node.op
        if isinstance(op, OpDef):
            try:
                op.check_arity(len(arg_types))
                out = op.infer(arg_types, node.attrs)
            except TypeInferenceError as e:
                raise TypeInferenceError(f"{e}{_where(fn_name, node)}") from None
            except PullbackError as e:
                raise TypeInferenceError(f"{op.name}: {e}{_where(fn_name, node)}") from None
            return out
        if isinstance(op, GlobalVar):
            ft = self.global_type(op, fn_name)
            label = "@" + op.name_hint
        elif isinstance(op, Function):
            ft = op.checked_type
            label = "a primitive function"
        else:
            raise TypeInferenceError(f"cannot call {op!r}{_where(fn_name, node)}")
        if len(ft.arg_types) != len(arg_types):
            raise TypeInferenceError(f"{label} expects {len(ft.arg_types)} arguments, got {len(arg_types)}{_where(fn_name, node)}")
        for i, (want, got) in enumerate(zip(ft.arg_types, arg_types)):
            if not types_compatible(want, got):
                raise TypeInferenceError(f"{label}: argument {i} has type {got!r}, expected {want!r}{_where(fn_name, node)}")
        return ft.ret_type


def carry_type(old: Expr, new: Expr) -> bool:
    """Give ``new`` the cached type of ``old`` when ``new`` is ``old`` rebuilt over operands of the
    same types (same node kind, callee, attributes); True if ``new`` is typed afterwards.

    Types are a pure function of a node's kind, callee, attributes and operand types, so
    this is what inference would compute, at the cost of one comparison per operand."""
    if new._checked_type is not None:
        return True
    t = old._checked_type
    if t is None or type(old) is not type(new):
        return False
    if isinstance(new, Call):
        if new.op is not old.op or new.attrs is not old.attrs or isinstance(new.op, GlobalVar):
            return False  # a global callee may change within a pass
    elif isinstance(new, TupleGetItem):
        if new.index != old.index:
            return False
    elif not isinstance(new, (Tuple, If)):
        return False
    a_kids, b_kids = old.children(), new.children()
    if len(a_kids) != len(b_kids):
        return False
    for a, b in zip(a_kids, b_kids):
        if a is not b:
            ta, tb = a._checked_type, b._checked_type
            if tb is None or (ta is not tb and ta != tb):
                return False
    new._checked_type = t
    return True


def type_rebuilt(old: Expr, new: Expr, inf: Optional["_Inferencer"] = None) -> None:
    """Type ``new`` (``old`` rebuilt over other operands) without walking: carry ``old``'s type
    (``carry_type``), else infer it from its typed operands; left untyped when that fails."""
    if carry_type(old, new) or inf is None:
        return
    for k in new.children():
        if k._checked_type is None:
            return
    if isinstance(new, Function) and new.body._checked_type is None:
        return
    try:
        new._checked_type = inf.infer_node(new, None)
    except PullbackError:
        pass


def infer_module(mod: IRModule) -> IRModule:
    """Annotate every node of every function of ``mod`` with its type; returns ``mod``."""
    _Inferencer(mod).infer_module()
    return mod


def infer_expr(expr: Expr, mod: Optional[IRModule] = None) -> Type:
    """Infer ``expr`` (and its sub-expressions); returns its type."""
    inf = _Inferencer(mod)
    if mod is not None:
        inf.infer_module()
    return inf.infer_expr(expr)


def infer_function(fn: Function, mod: Optional[IRModule] = None) -> Function:
    infer_expr(fn, mod)
    return fn


__all__ = ["infer_module", "infer_expr", "infer_function", "types_compatible", "join_types", "carry_type", "type_rebuilt"]
