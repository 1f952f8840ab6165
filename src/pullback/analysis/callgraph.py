"""The call graph of a module: which functions reference which, in what order, what recurses.

A function *references* another when its body calls it (``Call(@f, ...)``) or uses
its GlobalVar as a value, or names it as its ``custom_vjp``; all are edges (a value
use needs the callee as much as a call; AD calls a custom vjp). A custom vjp counts
as a value use: its signature is observable. Primitive function bodies count as
part of the function holding them.
Everything is iterative, and each Function object is scanned once (the scan is
cached on it), so passes that ask for the graph every round pay only for the
functions they changed.

    cg = CallGraph(mod)
    cg.callees("main")          # ["f", "g"]: module functions @main references, first use first
    cg.callers("f")             # ["main"]
    cg.callees_first()          # every function after the functions it references (DFS post order)
    cg.reachable(["main"])      # what @main needs, transitively
    cg.cycles(["main"])         # recursion: [("f", "g", "f")] (each closes on its first name)
    cg.sccs()                   # strongly connected components, callees first
"""

from __future__ import annotations

import weakref
from typing import Iterable, Optional

from ..ir.expr import Call, Expr, Function, GlobalVar
from ..ir.module import IRModule
from ..ir.traversal import post_order


class FunctionRefs:
    """What one Function references: ``refs`` is ``[(name, first referencing node)]`` in first-use
    order (the node is the Call, or the GlobalVar used as a value); ``value_uses`` the names whose
    GlobalVar appears other than as a callee."""

    __slots__ = ("refs", "value_uses")

    def __init__(self, fn: Function):
        first: dict[str, Expr] = {}
        values: set[str] = set()
        for n in post_order(fn, into_functions=True):
            if isinstance(n, Call):
                g = n.op
                if isinstance(g, GlobalVar):
                    first.setdefault(g.name_hint, n)
            elif isinstance(n, GlobalVar):
                first.setdefault(n.name_hint, n)
                values.add(n.name_hint)
        vjp = fn.custom_vjp
        if vjp is not None:
            first.setdefault(vjp, fn)
            values.add(vjp)
        self.refs: tuple = tuple(first.items())
        self.value_uses: frozenset = frozenset(values)


_REFS: "weakref.WeakKeyDictionary[Function, FunctionRefs]" = weakref.WeakKeyDictionary()


def function_refs(fn: Function) -> FunctionRefs:
    """The references of ``fn`` (cached per Function object: nodes are immutable)."""
    got = _REFS.get(fn)
    if got is None:
        got = _REFS[fn] = FunctionRefs(fn)
    return got


class CallGraph:
    """The reference graph of the functions of ``mod`` (a snapshot: modules are immutable)."""

    def __init__(self, mod: IRModule):
        self.mod = mod
        self._refs = {name: function_refs(fn) for name, fn in mod.items()}
        self._callees = {name: [r for r, _ in refs.refs if r in self._refs] for name, refs in self._refs.items()}
        self._callers: Optional[dict[str, list[str]]] = None

    def __contains__(self, name: str) -> bool:
        return name in self._refs

    def callees(self, name: str) -> list[str]:
        """Module functions ``@name`` references (itself too when it calls itself), first use first."""
        return list(self._callees[name])

    def unknown(self, name: str) -> list[str]:
        """Names ``@name`` references that are not functions of the module."""
        return [r for r, _ in self._refs[name].refs if r not in self._refs]

    def site(self, caller: str, callee: str) -> Optional[Expr]:
        """The first node of ``@caller`` referencing ``@callee`` (a Call or a GlobalVar), or None."""
        return next((n for r, n in self._refs[caller].refs if r == callee), None)

    def callers(self, name: str) -> list[str]:
        """Module functions referencing ``@name``, in module order."""
        if self._callers is None:
            callers: dict[str, list[str]] = {n: [] for n in self._refs}
            for caller, callees in self._callees.items():
                for c in callees:
                    callers[c].append(caller)
            self._callers = callers
        return list(self._callers[name])

    def value_uses(self) -> set[str]:
        """Functions whose GlobalVar is used as a value (not only called) somewhere in the module."""
        out: set[str] = set()
        for refs in self._refs.values():
            out |= refs.value_uses
        return out

    def roots(self) -> list[str]:
        """Functions no *other* function references (``main``, ``main_grad``, ...), in module order."""
        referenced = {c for name, cs in self._callees.items() for c in cs if c != name}
        return [name for name in self._refs if name not in referenced]

    def reachable(self, roots: Iterable[str]) -> set[str]:
        """Module functions reachable from ``roots`` (the roots in the module included)."""
        seen: set[str] = set()
        stack = [r for r in roots if r in self._refs]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            stack.extend(c for c in self._callees[name] if c not in seen)
        return seen

    def _walk(self, roots: Optional[Iterable[str]]) -> tuple[list[str], list[tuple[str, ...]]]:
        """Depth-first from ``roots`` (default: every function, module order): the post order and the
        path of every back edge."""
        order: list[str] = []
        cycles: list[tuple[str, ...]] = []
        state: dict[str, int] = {}  # 1: on the current path, 2: finished
        callees = self._callees
        for root in (self._refs if roots is None else roots):
            if root not in self._refs or root in state:
                continue
            path = [root]
            pos = {root: 0}
            state[root] = 1
            stack = [(root, iter(callees[root]))]
            while stack:
                name, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    path.pop()
                    del pos[name]
                    state[name] = 2
                    order.append(name)
                    continue
                s = state.get(nxt)
                if s == 1:
                    cycles.append(tuple(path[pos[nxt]:]) + (nxt,))
                elif s is None:
                    state[nxt] = 1
                    pos[nxt] = len(path)
                    path.append(nxt)
                    stack.append((nxt, iter(callees[nxt])))
        return order, cycles

    def callees_first(self, roots: Optional[Iterable[str]] = None) -> list[str]:
        """Functions reachable from ``roots`` (default: all), each after every function it references,
        except along recursion (a cycle is entered at the function met first)."""
        return self._walk(roots)[0]

    def cycles(self, roots: Optional[Iterable[str]] = None) -> list[tuple[str, ...]]:
        """One path per recursive reference met walking from ``roots`` (default: all): ``("f", "g", "f")``
        is @f calling @g calling @f; the last two names are the referencing function and the one it
        re-enters (``site(path[-2], path[-1])`` is where)."""
        return self._walk(roots)[1]

    def sccs(self) -> list[list[str]]:
        """Strongly connected components (Tarjan, iterative), callees first; a component of several
        functions, or of one that references itself, is recursion."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        on_stack: set[str] = set()
        comp_stack: list[str] = []
        out: list[list[str]] = []
        callees = self._callees
        for root in self._refs:
            if root in index:
                continue
            work = [(root, iter(callees[root]))]
            index[root] = low[root] = len(index)
            comp_stack.append(root)
            on_stack.add(root)
            while work:
                name, it = work[-1]
                nxt = next(it, None)
                if nxt is not None:
                    if nxt not in index:
                        index[nxt] = low[nxt] = len(index)
                        comp_stack.append(nxt)
                        on_stack.add(nxt)
                        work.append((nxt, iter(callees[nxt])))
                    elif nxt in on_stack:
                        low[name] = min(low[name], index[nxt])
                    continue
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[name])
                if low[name] == index[name]:
                    comp = []
                    while True:
                        m = comp_stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == name:
                            break
                    out.append(comp[::-1])
        return out

    def recursive(self) -> set[str]:
        """Functions that can re-enter themselves (members of a cycle)."""
        out: set[str] = set()
        for comp in self.sccs():
            if len(comp) > 1 or comp[0] in self._callees[comp[0]]:
                out.update(comp)
        return out


__all__ = ["CallGraph", "FunctionRefs", "function_refs"]
