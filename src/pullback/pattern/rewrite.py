"""The rewrite driver: tables of ``(pattern, callback)`` applied bottom-up to a fixed point.

One iterative driver (a worklist over post order, like tinygrad's
``graph_rewrite`` or xDSL's greedy driver):

1. operands are settled before their users;
2. a node is rebuilt over its settled operands, typed, and the rules are tried
   in table order; the first callback returning a node other than ``None``
   (and other than the node itself) replaces it;
3. the replacement is settled the same way (its new sub-nodes first, then the
   rules again on it), so the result is a fixed point of the whole table;
4. nodes that did not change keep their identity: with no rewrite at all, the
   input object itself is returned.

Callbacks are ``callback(node, captures) -> replacement | None``; ``captures``
maps capture names to the matched nodes. Relay's class form
(:class:`DFPatternCallback`, ``callback(pre, post, node_map)``) is accepted too.
New nodes get their ``checked_type`` before rules look at them (when it can be
inferred), so type-constrained patterns work on what earlier rules produced.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

from ..analysis.type_infer import infer_expr, infer_module
from ..ir.errors import PassError, PullbackError
from ..ir.expr import Call, Constant, Expr, Function, If, Op, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.traversal import rebuild
from .matcher import captures_of, compile_pattern
from .patterns import (AltPattern, CallPattern, ConstantPattern, DFPattern, ExprPattern, IfPattern, OpPattern,
                       TupleGetItemPattern, TuplePattern, VarPattern, _Constrained)

Callback = Callable[[Expr, dict], Optional[Expr]]


class DFPatternCallback:
    """Relay's class form of a rewrite: set ``self.pattern`` and define ``callback``.

    ``callback(pre, post, node_map)``: ``pre`` is the node as first met (before its
    operands were rewritten), ``post`` the node with rewritten operands, and
    ``node_map`` maps each pattern node to the list of expressions it matched.
    ``require_type`` is accepted for Relay compatibility (types are always inferred).
    """

    pattern: DFPattern

    def __init__(self, require_type: bool = False, rewrite_once: bool = False):
        self.require_type = require_type
        self.rewrite_once = rewrite_once

    def callback(self, pre: Expr, post: Expr, node_map: dict) -> Optional[Expr]:
        raise NotImplementedError(f"{type(self).__name__} must define callback(pre, post, node_map)")

    def rewrite(self, expr):
        """Apply this callback to ``expr`` (an expression or Function) to a fixed point."""
        return rewrite([self], expr)


class _Rule:
    __slots__ = ("pattern", "fn", "relay", "match")

    def __init__(self, pattern: DFPattern, fn, relay: bool):
        self.pattern, self.fn, self.relay = pattern, fn, relay
        self.match = compile_pattern(pattern)


def _normalize_rules(rules) -> list[_Rule]:
    if isinstance(rules, (DFPatternCallback, tuple)) and not (isinstance(rules, tuple) and rules and isinstance(rules[0], tuple)):
        rules = [rules]
    out = []
    for i, r in enumerate(rules):
        if isinstance(r, DFPatternCallback):
            pat = getattr(r, "pattern", None)
            if not isinstance(pat, DFPattern):
                raise PullbackError(f"rewrite: {type(r).__name__}.pattern must be a DFPattern, got {pat!r}")
            out.append(_Rule(pat, r.callback, True))
        elif isinstance(r, (tuple, list)) and len(r) == 2 and isinstance(r[0], DFPattern) and callable(r[1]):
            out.append(_Rule(r[0], r[1], False))
        else:
            raise PullbackError(f"rewrite: rule {i} must be (pattern, callback) or a DFPatternCallback, got {r!r}")
    return out


_KIND_OF = {TuplePattern: Tuple, TupleGetItemPattern: TupleGetItem, IfPattern: If, VarPattern: Var,
            ConstantPattern: Constant}


def _root_filter(pattern: DFPattern) -> Optional[dict]:
    """``{node class: frozenset of op ids, or None for any callee}`` a match's root can be;
    None when the pattern may match any node."""
    out: dict = {}

    def add(cls, ops):
        if cls in out and out[cls] is None:
            return
        out[cls] = None if ops is None else (out.get(cls) or frozenset()) | frozenset(id(o) for o in ops)

    stack = [pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, _Constrained):
            stack.append(p.pattern)
        elif isinstance(p, AltPattern):
            stack.extend((p.left, p.right))
        elif isinstance(p, CallPattern):
            add(Call, p.op.ops if isinstance(p.op, OpPattern) else None)
        elif isinstance(p, OpPattern):
            add(Call, p.ops)
        elif type(p) in _KIND_OF:
            add(_KIND_OF[type(p)], None)
        elif isinstance(p, ExprPattern):
            add(type(p.expr), None)
        else:
            return None
    return out


def _may_match(flt: Optional[dict], cls: type, op) -> bool:
    if flt is None:
        return True
    for kind, ops in flt.items():
        if issubclass(cls, kind) and (ops is None or id(op) in ops):
            return True
    return False


class _RuleIndex:
    """Rules to try on a node, in table order, skipping those whose root cannot be that node
    (its class, and for a Call its operator)."""

    def __init__(self, table: list):
        self.table = table
        self.filters = [_root_filter(r.pattern) for r in table]
        self.cache: dict = {}  # (node class, operator or callee class) -> rules

    def rules_for(self, node: Expr) -> list:
        cls = type(node)
        if cls is Call or isinstance(node, Call):
            op = node.op
            key = (cls, op if isinstance(op, Op) else type(op))
        else:
            op, key = None, cls
        got = self.cache.get(key)
        if got is None:
            got = self.cache[key] = [r for r, f in zip(self.table, self.filters) if _may_match(f, cls, op)]
        return got


class _Driver:
    """The worklist driver; one instance may settle several roots (functions of one module)
    and then shares its results: a node reachable from two roots is rewritten once."""

    def __init__(self, rules, mod: Optional[IRModule], max_rewrites: int):
        self.index = _RuleIndex(_normalize_rules(rules))
        self.mod = mod
        self.max_rewrites = max_rewrites
        # node -> what it became: itself once settled as a fixed point, else its replacement (which may
        # itself be forwarded). Nodes hash by identity, and the keys keep the nodes they stand for alive.
        self.fwd: dict[Expr, Expr] = {}
        self.depth: dict[Expr, int] = {}  # replacement -> how many rewrites led to it
        self.last_pattern: Optional[DFPattern] = None

    def resolve(self, x: Expr) -> Expr:
        fwd = self.fwd
        y = fwd.get(x, x)
        if y is x:
            return x
        z = fwd.get(y, y)
        while z is not y:
            y = z
            z = fwd.get(y, y)
        fwd[x] = y
        return y

    def run(self, root: Expr) -> Expr:
        fwd, resolve, type_new = self.fwd, self.resolve, self.type_new
        rules_cache, rules_for = self.index.cache, self.index.rules_for
        mark = _MARK
        stack: list = [root]
        push, pop = stack.append, stack.pop
        while stack:
            node = pop()
            if node is not mark:
                if node in fwd:
                    continue
                push(node)
                push(mark)
                kids = node.children()
                for i in range(len(kids) - 1, -1, -1):
                    k = kids[i]
                    if k not in fwd:
                        push(k)
                continue
            node = pop()
            if node in fwd:  # settled meanwhile (a replacement reached it first)
                continue
            cur = node
            for k in node.children():
                if fwd[k] is not k:
                    cur = rebuild(node, resolve)
                    break
            if cur._checked_type is None:
                type_new(cur)
            cls = type(cur)
            rules = rules_cache.get((cls, cur.op) if cls is Call else cls)
            if rules is None:
                rules = rules_for(cur)
            replacement = self.apply(rules, node, cur) if rules else None
            if replacement is None:
                fwd[node] = cur
                if cur is not node:
                    fwd[cur] = cur
                continue
            d = self.depth.get(node, 0) + 1
            if d > self.max_rewrites:
                raise PassError(f"rewrite did not reach a fixed point: {self.max_rewrites} successive rewrites of one node "
                                f"(last pattern: {self.last_pattern!r})")
            self.depth[replacement] = d
            fwd[node] = replacement
            if cur is not node:
                fwd[cur] = replacement
            push(replacement)  # settle the replacement before any user of ``node``
        return resolve(root)

    def type_new(self, node: Expr) -> None:
        """Type a node before the rules see it, when it can be typed: it stays untyped (and
        type-constrained patterns do not match it) when an operand is untyped or it is ill-typed."""
        for k in node.children():
            if k._checked_type is None:
                return
        try:
            infer_expr(node, self.mod)
        except PullbackError:
            pass

    def apply(self, rules: list, pre: Expr, cur: Expr) -> Optional[Expr]:
        """The first replacement a rule gives for ``cur`` (``pre``: the node before its operands were rewritten)."""
        for rule in rules:
            bound = rule.match(cur)
            if bound is None:
                continue
            if rule.relay:
                out = rule.fn(pre, cur, {p: [e] for p, e in bound.items()})
            else:
                out = rule.fn(cur, captures_of(bound))
            if out is not None and out is not cur and out is not pre:
                if not isinstance(out, Expr):
                    raise PullbackError(f"rewrite callback for pattern {rule.pattern!r} returned {out!r}, not an expression")
                self.last_pattern = rule.pattern
                return out
        return None


_MARK = object()


def rewrite_expr(rules, root: Expr, mod: Optional[IRModule] = None, max_rewrites: int = 10_000) -> Expr:
    """Apply ``rules`` to every node under ``root`` until none fires; returns the new root.

    Operates in one scope level (primitive Function bodies are not entered).
    Raises PassError when the rules keep rewriting one position (more than
    ``max_rewrites`` successive replacements of a node and its replacements).
    """
    return _Driver(rules, mod, max_rewrites).run(root)


def _rewrite_function(driver: _Driver, fn: Function) -> Function:
    new = fn.replace(body=driver.run(fn.body))
    if new is not fn:
        driver.type_new(new)
    return new


def rewrite(rules, expr: Union[Expr, Function], mod: Optional[IRModule] = None):
    """Apply a table of ``(pattern, callback)`` rules (or DFPatternCallbacks) to a fixed point.

    ``expr`` is an expression or a Function (its body is rewritten, its parameters
    kept). Returns ``expr`` itself when nothing changed. ``mod`` types calls to
    global functions.
    """
    if isinstance(expr, Function):
        return _rewrite_function(_Driver(rules, mod, 10_000), expr)
    if not isinstance(expr, Expr):
        raise PullbackError(f"rewrite expects an expression or a Function, got {type(expr).__name__}")
    return rewrite_expr(rules, expr, mod)


def rewrite_module(rules, mod: IRModule) -> IRModule:
    """``rewrite(rules, fn)`` for every non-primitive function of ``mod`` (types inferred first).

    Returns ``mod`` itself when no function changed."""
    if not isinstance(mod, IRModule):
        raise PassError(f"rewrite_module expects an IRModule, got {type(mod).__name__}")
    infer_module(mod)
    updates = {}
    driver = _Driver(rules, mod, 10_000)  # shared: nodes common to several functions are rewritten once
    for name, fn in mod.items():
        if fn.is_primitive:
            continue
        new = _rewrite_function(driver, fn)
        if new is not fn:
            updates[name] = new
    return mod.with_functions(updates) if updates else mod


__all__ = ["DFPatternCallback", "rewrite", "rewrite_expr", "rewrite_module", "Callback"]
