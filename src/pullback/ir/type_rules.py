"""The type rules of the IR, and lazy iterative typing (what ``Expr.checked_type`` runs).

The type of a node is a pure function of its kind, callee, attributes and
operand types: a Var has its annotation, a Constant its array's shape and dtype,
a Call to an operator what ``op.infer(arg_types, attrs)`` says (the ``Op``
interface; the operators live in ``ops``), Tuple / TupleGetItem / If / Function
their structural rules. Only a call to a module function (``Call(GlobalVar)``, or
a GlobalVar used as a value) needs more: the module, given as ``global_type``
(``analysis.infer_module`` / ``analysis.infer_expr(expr, mod)`` supply it).

``infer_types(root)`` types the untyped part below ``root`` with an explicit
stack, operands first; typed nodes are not entered, so typing a new node over
typed operands costs one rule.
"""

from __future__ import annotations

from typing import Callable, Optional

from .errors import PullbackError, TypeInferenceError
from .expr import Call, Constant, Expr, Function, GlobalVar, If, Op, Tuple, TupleGetItem, Var, set_type
from .types import FuncType, TensorType, TupleType, Type, join_types, types_compatible

GlobalType = Callable[[GlobalVar], FuncType]
"""``global_type(gv)``: the FuncType of the module function ``gv`` names (raises TypeInferenceError)."""


def where(fn_name: Optional[str], node: Expr) -> str:
    """`` in @main at 3:5`` (what is known of the place of ``node``) for error messages."""
    loc = f" at {node.span}" if getattr(node, "span", None) else ""
    return f" in @{fn_name}{loc}" if fn_name else loc


class UntypedCallee(TypeInferenceError):
    """``global_type`` of a module function that does not type-check itself (its own errors are
    reported where they are): a call to it has no type, and is not reported again."""


class TypeProblems:
    """Type errors collected by ``infer_types`` instead of stopping at the first one.

    ``problems``: ``(node, error)`` per ill-typed node; ``bad``: ids of the nodes without a type,
    the ill-typed ones and every node that depends on one (those are not reported again)."""

    def __init__(self):
        self.problems: list[tuple[Expr, TypeInferenceError]] = []
        self.bad: set[int] = set()

    def messages(self) -> list[str]:
        return [str(e) for _, e in self.problems]


def _global(gv: GlobalVar, node: Expr, global_type: Optional[GlobalType], fn_name: Optional[str]) -> FuncType:
    if global_type is None:
        raise TypeInferenceError(
            f"the type of @{gv.name_hint} is only known with its module{where(fn_name, node)}: run "
            "transform.InferType() (or analysis.infer_module(mod), or analysis.infer_expr(expr, mod)) first"
        )
    try:
        return global_type(gv)
    except TypeInferenceError as e:
        raise type(e)(f"{e}{where(fn_name, node)}") from None


def _ty(e: Expr) -> Type:
    t = e._checked_type
    return t if t is not None else infer_types(e)


def _var(node: Var, global_type, fn_name) -> Type:
    if node.type_annotation is None:
        raise TypeInferenceError(f"variable %{node.name_hint} has no type annotation{where(fn_name, node)}")
    return node.type_annotation


_MEMO_MAX = 100_000  # entries of each memo table below (cleared when full)
_CONSTANT_TYPES: dict = {}  # (shape, numpy dtype) -> TensorType: numpy's dtype.name is slow


def _remember(table: dict, key, t: Type) -> Type:
    if len(table) >= _MEMO_MAX:
        table.clear()
    table[key] = t
    return t


def _constant(node: Constant, global_type, fn_name) -> Type:
    data = node.data
    key = (data.shape, data.dtype)
    t = _CONSTANT_TYPES.get(key)
    return t if t is not None else _remember(_CONSTANT_TYPES, key, TensorType(data.shape, data.dtype.name))


def _global_var(node: GlobalVar, global_type, fn_name) -> Type:
    return _global(node, node, global_type, fn_name)


_OP_TYPES: dict = {}  # (op, attrs, operand types...) -> result type


def op_result_type(op: Op, arg_types: list, attrs) -> Type:
    """``op.infer(arg_types, attrs)`` (arity checked), remembered: a type relation is a pure function of the operator,
    its attrs and its operand types, and a gradient program repeats a few such signatures thousands
    of times (an n-layer network's backward), so each is inferred once."""
    try:
        key = (op, attrs, *arg_types)
        t = _OP_TYPES.get(key)
    except TypeError:  # attrs that cannot be hashed
        op.check_arity(len(arg_types))
        return op.infer(arg_types, attrs)
    if t is None:
        op.check_arity(len(arg_types))
        t = _remember(_OP_TYPES, key, op.infer(arg_types, attrs))
    return t


def _call(node: Call, global_type, fn_name) -> Type:
    arg_types = [_ty(a) for a in node.args]
    op = node.op
    if isinstance(op, Op):
        try:
            return op_result_type(op, arg_types, node.attrs)
        except TypeInferenceError as e:
            raise TypeInferenceError(f"{e}{where(fn_name, node)}") from None
        except PullbackError as e:
            raise TypeInferenceError(f"{op.name}: {e}{where(fn_name, node)}") from None
    if isinstance(op, GlobalVar):
        ft = _global(op, node, global_type, fn_name)
        label = "@" + op.name_hint
    elif isinstance(op, Function):
        ft = _ty(op)
        label = "a primitive function"
    else:
        raise TypeInferenceError(f"cannot call {op!r}{where(fn_name, node)}")
    if len(ft.arg_types) != len(arg_types):
        raise TypeInferenceError(f"{label} expects {len(ft.arg_types)} arguments, got {len(arg_types)}{where(fn_name, node)}")
    for i, (want, got) in enumerate(zip(ft.arg_types, arg_types)):
        if not types_compatible(want, got):
            raise TypeInferenceError(f"{label}: argument {i} has type {got!r}, expected {want!r}{where(fn_name, node)}")
    return ft.ret_type


def _tuple(node: Tuple, global_type, fn_name) -> Type:
    return TupleType(tuple([_ty(f) for f in node.fields]))


def _get_item(node: TupleGetItem, global_type, fn_name) -> Type:
    t = _ty(node.tuple_value)
    if not isinstance(t, TupleType):
        raise TypeInferenceError(f"TupleGetItem .{node.index} of a non-tuple value of type {t!r}{where(fn_name, node)}")
    if node.index >= len(t.fields):
        raise TypeInferenceError(f"TupleGetItem index {node.index} is out of range for a tuple of {len(t.fields)} "
                                 f"fields {t!r}{where(fn_name, node)}")
    return t.fields[node.index]


def _if(node: If, global_type, fn_name) -> Type:
    c = _ty(node.cond)
    if not (isinstance(c, TensorType) and c.ndim == 0 and c.dtype == "bool"):
        raise TypeInferenceError(f"If condition must be a bool scalar, got {c!r}{where(fn_name, node)}")
    a, b = _ty(node.true_branch), _ty(node.false_branch)
    j = join_types(a, b)
    if j is None:
        raise TypeInferenceError(f"If branches have different types: {a!r} and {b!r}{where(fn_name, node)}")
    return j


def _function(node: Function, global_type, fn_name) -> Type:
    body_t = _ty(node.body)
    for p in node.params:
        if p.type_annotation is None:
            raise TypeInferenceError(f"parameter %{p.name_hint} has no type annotation{where(fn_name, p)}")
    if node.ret_type is not None:
        if not types_compatible(node.ret_type, body_t):
            raise TypeInferenceError(f"function body has type {body_t!r} but the declared return type is "
                                     f"{node.ret_type!r}{where(fn_name, node)}")
        body_t = node.ret_type
    return FuncType(tuple(p.type_annotation for p in node.params), body_t)


_RULES = {Var: _var, Constant: _constant, GlobalVar: _global_var, Call: _call, Tuple: _tuple,
          TupleGetItem: _get_item, If: _if, Function: _function}


def _rule(cls: type):
    rule = _RULES.get(cls)
    if rule is None:  # a subclass of a node kind
        rule = next((r for base, r in _RULES.items() if issubclass(cls, base)), None)
        if rule is None:
            raise TypeInferenceError(f"cannot infer the type of {cls.__name__}")
        _RULES[cls] = rule
    return rule


def node_type(node: Expr, global_type: Optional[GlobalType] = None, fn_name: Optional[str] = None) -> Type:
    """The type of ``node`` by its kind's rule (operands are typed on the way if they are not).

    Does not cache; ``fn_name`` names the function in error messages."""
    return _rule(type(node))(node, global_type, fn_name)


def _operands(node: Expr) -> tuple:
    """What must be typed before ``node``: its operands, a called primitive Function, a Function's
    parameters and body."""
    cls = type(node)
    if cls is Call or isinstance(node, Call):
        op = node.op
        return (op,) + node.args if isinstance(op, Function) else node.args
    if isinstance(node, Function):
        return node.params + (node.body,)
    return node.children()


def infer_types(root: Expr, global_type: Optional[GlobalType] = None, fn_name: Optional[str] = None,
                problems: Optional[TypeProblems] = None) -> Optional[Type]:
    """Type ``root`` and the untyped nodes below it (operands first, explicit stack), caching each
    node's ``checked_type``; returns the type of ``root``. Typed nodes are not entered.

    Errors are TypeInferenceErrors naming the node (and ``fn_name``); a call to a module function
    needs ``global_type``. With ``problems``, every independent error is collected there instead:
    an ill-typed node and the nodes using it stay untyped (``problems.bad``), the others are typed,
    and the result is None when ``root`` has no type."""
    t = root._checked_type
    if t is not None:
        return t
    rules = _RULES
    if problems is None:  # the common case, a new node over typed operands: no stack
        for k in _operands(root):
            if k._checked_type is None:
                break
        else:
            cls = type(root)
            t = (rules.get(cls) or _rule(cls))(root, global_type, fn_name)
            set_type(root, t)
            return t
    bad = problems.bad if problems is not None else ()
    stack = [root]
    push, pop = stack.append, stack.pop
    while stack:
        n = stack[-1]
        if n._checked_type is not None or id(n) in bad:
            pop()
            continue
        kids = _operands(n)
        ready = True
        poisoned = False
        for i in range(len(kids) - 1, -1, -1):
            k = kids[i]
            if k._checked_type is None:
                if id(k) in bad:
                    poisoned = True
                else:
                    push(k)
                    ready = False
        if ready:
            pop()
            if poisoned:
                bad.add(id(n))
                continue
            cls = type(n)
            rule = rules.get(cls) or _rule(cls)
            if problems is None:
                set_type(n, rule(n, global_type, fn_name))
                continue
            try:
                set_type(n, rule(n, global_type, fn_name))
            except UntypedCallee:
                bad.add(id(n))
            except TypeInferenceError as e:
                bad.add(id(n))
                problems.problems.append((n, e))
    return root._checked_type


__all__ = ["GlobalType", "TypeProblems", "UntypedCallee", "infer_types", "node_type", "op_result_type", "where", "join_types", "types_compatible"]
