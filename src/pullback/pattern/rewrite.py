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

from ..analysis.type_infer import _Inferencer, infer_expr
from ..ir.errors import PassError, PullbackError, TypeInferenceError
from ..ir.expr import Call, Expr, Function
from ..ir.module import IRModule
from ..ir.traversal import rebuild
from .matcher import captures_of, match_pattern
from .patterns import DFPattern

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


Rule = Union[tuple, DFPatternCallback]


class _Rule:
    __slots__ = ("pattern", "fn", "relay")

    def __init__(self, pattern: DFPattern, fn, relay: bool):
        self.pattern, self.fn, self.relay = pattern, fn, relay


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


def _root_ops(pattern: DFPattern) -> Optional[frozenset]:
    """The operators a match's root must call, or None when the pattern may match any node."""
    from .patterns import AltPattern, CallPattern, OpPattern, _Constrained

    ops: set = set()
    stack = [pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, _Constrained):
            stack.append(p.pattern)
        elif isinstance(p, AltPattern):
            stack.extend((p.left, p.right))
        elif isinstance(p, CallPattern) and isinstance(p.op, OpPattern):
            ops.update(p.op.ops)
        elif isinstance(p, OpPattern):
            ops.update(p.ops)
        else:
            return None
    return frozenset(ops)


class _RuleIndex:
    """Rules to try on a node, in table order, skipping those whose root operator cannot match."""

    def __init__(self, table: list):
        self.table = table
        self.filters = [_root_ops(r.pattern) for r in table]
        self.generic = [r for r, f in zip(table, self.filters) if f is None]
        self.cache: dict[int, list] = {}

    def rules_for(self, node: Expr) -> list:
        op = node.op if isinstance(node, Call) else None
        if op is None:
            return self.generic
        got = self.cache.get(id(op))
        if got is None:
            got = self.cache[id(op)] = [r for r, f in zip(self.table, self.filters) if f is None or op in f]
        return got


class _Typer:
    """Types one node at a time whose operands are typed (no walk over the whole graph)."""

    def __init__(self, mod: Optional[IRModule]):
        self.mod = mod
        self.inf = _Inferencer(mod)

    def __call__(self, node: Expr) -> None:
        if node._checked_type is not None:
            return
        kids = node.children()
        opaque = isinstance(node, Function) or (isinstance(node, Call) and isinstance(node.op, Function))
        if not opaque and all(k._checked_type is not None for k in kids):
            try:
                node._checked_type = self.inf.infer_node(node, None)
            except TypeInferenceError:
                pass  # left untyped: type-constrained patterns do not match it
            return
        try:
            infer_expr(node, self.mod)
        except PullbackError:
            pass


def rewrite_expr(rules, root: Expr, mod: Optional[IRModule] = None, max_rewrites: int = 10_000) -> Expr:
    """Apply ``rules`` to every node under ``root`` until none fires; returns the new root.

    Operates in one scope level (primitive Function bodies are not entered).
    Raises PassError when the rules keep rewriting one position (more than
    ``max_rewrites`` successive replacements of a node and its replacements).
    """
    table = _normalize_rules(rules)
    index = _RuleIndex(table)
    typer = _Typer(mod)
    done: set[int] = set()  # ids of settled nodes (fixed points)
    fwd: dict[int, Expr] = {}  # id(node) -> what replaces it (may itself be forwarded)
    keep: list = []  # keeps every node we keyed by id alive
    depth: dict[int, int] = {}  # id(replacement) -> how many rewrites led to it

    def resolve(x: Expr) -> Expr:
        y = x
        while id(y) in fwd:
            y = fwd[id(y)]
        if y is not x:
            fwd[id(x)] = y
        return y

    stack: list = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        nid = id(node)
        if nid in done or nid in fwd:
            continue
        if not expanded:
            stack.append((node, True))
            kids = node.children()
            for i in range(len(kids) - 1, -1, -1):
                k = kids[i]
                if id(k) not in done and id(k) not in fwd:
                    stack.append((k, False))
            continue
        pre = node
        cur = rebuild(node, resolve)
        typer(cur)
        replacement = None
        for rule in index.rules_for(cur):
            bound = match_pattern(rule.pattern, cur)
            if bound is None:
                continue
            if rule.relay:
                out = rule.fn(pre, cur, {p: [e] for p, e in bound.items()})
            else:
                out = rule.fn(cur, captures_of(bound))
            if out is not None and out is not cur and out is not pre:
                if not isinstance(out, Expr):
                    raise PullbackError(f"rewrite callback for pattern {rule.pattern!r} returned {out!r}, not an expression")
                replacement = out
                break
        keep.append(node)
        if replacement is None:
            done.add(id(cur))
            if cur is not node:
                keep.append(cur)
                fwd[nid] = cur
            continue
        d = depth.get(nid, 0) + 1
        if d > max_rewrites:
            raise PassError(f"rewrite did not reach a fixed point: {max_rewrites} successive rewrites of one node (last pattern: {rule.pattern!r})")
        depth[id(replacement)] = d
        keep.append(replacement)
        fwd[nid] = replacement
        if cur is not node:
            keep.append(cur)
            fwd[id(cur)] = replacement
        stack.append((replacement, False))  # settle the replacement before any user of ``node``
    return resolve(root)


def rewrite(rules, expr: Union[Expr, Function], mod: Optional[IRModule] = None):
    """Apply a table of ``(pattern, callback)`` rules (or DFPatternCallbacks) to a fixed point.

    ``expr`` is an expression or a Function (its body is rewritten, its parameters
    kept). Returns ``expr`` itself when nothing changed. ``mod`` types calls to
    global functions.
    """
    if isinstance(expr, Function):
        body = rewrite_expr(rules, expr.body, mod)
        new = expr.replace(body=body)
        if new is not expr and body._checked_type is not None:
            try:
                new._checked_type = _Inferencer(mod).infer_node(new, None)
            except PullbackError:
                pass
        return new
    if not isinstance(expr, Expr):
        raise PullbackError(f"rewrite expects an expression or a Function, got {type(expr).__name__}")
    return rewrite_expr(rules, expr, mod)


def typed_module(mod: IRModule) -> IRModule:
    """``mod`` with every function typed (runs type inference only where types are missing)."""
    from ..analysis.type_infer import infer_module

    if any(fn._checked_type is None or fn.body._checked_type is None for _, fn in mod.items()):
        infer_module(mod)
    return mod


def rewrite_module(rules, mod: IRModule) -> IRModule:
    """``rewrite(rules, fn)`` for every non-primitive function of ``mod`` (types inferred first).

    Returns ``mod`` itself when no function changed."""
    if not isinstance(mod, IRModule):
        raise PassError(f"rewrite_module expects an IRModule, got {type(mod).__name__}")
    typed_module(mod)
    updates = {}
    for name, fn in mod.items():
        if fn.is_primitive:
            continue
        new = rewrite(rules, fn, mod)
        if new is not fn:
            updates[name] = new
    return mod.with_functions(updates) if updates else mod


__all__ = ["DFPatternCallback", "rewrite", "rewrite_expr", "rewrite_module", "typed_module", "Callback"]
