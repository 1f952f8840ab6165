"""The order a plan runs a body's nodes in: the post-order, with each value's last reader run as soon as it can.

A post-order (``ir.traversal.post_order``) computes each output's operands just before the output. A
gradient program returns many outputs reading one long chain: the input's gradient needs the whole chain of
activation gradients, and a post-order computes it first, then every weight gradient, each reading an
activation gradient made long before. Every one of those stays alive to the end of the backward, and is
read back cold from memory. PyTorch's autograd runs each layer's weight gradient as soon as its activation
gradient exists (both are one ``AddmmBackward`` node).

``memory_order`` keeps the post-order but, whenever a node is run, runs at once the remaining readers of
each of its operands (and its own), one or two (``MAX_LAST_READERS``: a linear layer's output gradient is read
last by its weight gradient's reshape and its bias's sum), when their other operands are ready and their
results together are no larger than the value they let go (within an eighth: the bias). That is a topological
order of the same nodes (any is correct), whose values die sooner. The reader may be several nodes deep through
same-size nodes (a weight gradient reads ``transpose(reshape(g))``): each hoisted node makes its operand's last
readers the next candidates. A weight gradient larger than the activation gradient it reads (a wide layer on few
rows) stays where the post-order puts it: run early, it would hold its memory longer than the value it frees.

A value computed from constants alone (``sources``) runs just before its first reader instead:
the post-order runs it where it meets it, the embedding gradient's ``zeros`` (Llama's 32,000-token vocabulary:
94 MiB) first of the whole backward, since the gradient it adds into is the program's first result, and holds it
to the end (eager makes it in the embedding's backward, last).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..ir.expr import Call, Constant, Expr, Tuple, TupleGetItem, Var
from ..ir.types import TensorType, TupleType
from ..ops.registry import get_op


def operands(n: Expr) -> tuple:
    """The values ``n`` reads: a call's arguments, a tuple's fields, a projection's tuple (else its children)."""
    t = type(n)
    if t is Call:
        return n.args
    if t is Tuple:
        return n.fields
    if t is TupleGetItem:
        return (n.tuple_value,)
    return n.children()


def _tensor_bytes(t) -> Optional[int]:
    if isinstance(t, TensorType) and all(isinstance(d, int) for d in t.shape):
        try:
            return math.prod(t.shape) * np.dtype(t.dtype).itemsize
        except TypeError:
            return None
    return None


def _bytes(t, memo: dict) -> Optional[int]:
    """The bytes of a value of type ``t`` (static shapes only), else None; ``memo`` maps id(type) -> bytes (nested
    tuple types: iteratively, each shared field once)."""
    stack = [(t, False)]
    while stack:
        u, ready = stack.pop()
        if id(u) in memo:
            continue
        if not isinstance(u, TupleType):
            memo[id(u)] = _tensor_bytes(u)
        elif ready:
            sizes = [memo[id(f)] for f in u.fields]
            memo[id(u)] = None if None in sizes else sum(sizes)
        else:
            stack.append((u, True))
            stack.extend((f, False) for f in u.fields if id(f) not in memo)
    return memo[id(t)]


# the most readers of one value run together to let it go: a linear layer's output gradient is read last by its
# weight gradient's reshape and its bias gradient's sum
MAX_LAST_READERS = 2


def sources(order: list, body: Expr) -> set:
    """The nodes of ``order`` computed from constants alone (calls, tuples and projections whose operands are
    ``Constant``s or such nodes, if any: ``zeros``), but ``body``."""
    found: set = set()
    for n in order:
        if type(n) in (Call, Tuple, TupleGetItem) and n is not body and all(
                type(a) is Constant or a in found for a in operands(n)):
            found.add(n)
    return found


def memory_order(order: list, body: Expr) -> list:
    """``order`` (a post-order of ``body``, without ``If``) with last readers hoisted and values computed from
    constants alone run just before their first reader (module docstring)."""
    users: dict = {}
    for n in order:
        for a in dict.fromkeys(operands(n)):
            users.setdefault(a, []).append(n)
    late = sources(order, body)
    if not late and not any(len(u) > 1 for u in users.values()):
        return order  # a chain or a tree: nothing to hoist
    remaining = {a: len(u) for a, u in users.items()}
    waiting = {n: len(dict.fromkeys(operands(n))) for n in order}
    memo: dict = {}

    def nbytes(n):
        return None if n._checked_type is None else _bytes(n._checked_type, memo)

    out = [n for n in order if type(n) in (Var, Constant)]  # parameters and constants: there from the start
    done: set = set(out)
    for n in (*out, *late):  # a late value is ready whenever a reader wants it
        for u in users.get(n, ()):
            waiting[u] -= 1

    def run_late(m) -> None:
        """Run the late values ``m`` reads that have not run yet (operands first)."""
        stack = [(a, False) for a in operands(m) if a in late and a not in done]
        while stack:
            a, ready = stack.pop()
            if a in done:
                continue
            if not ready:
                stack.append((a, True))
                stack.extend((b, False) for b in operands(a) if b in late and b not in done)
                continue
            done.add(a)
            out.append(a)
            for b in dict.fromkeys(operands(a)):
                remaining[b] -= 1

    for n in order:
        if n in done or n in late:
            continue
        stack = [n]
        while stack:
            m = stack.pop()
            if m in done or m in late:  # a late value hoisted as a last reader runs with its own reader
                continue
            run_late(m)
            done.add(m)
            out.append(m)
            for u in users.get(m, ()):
                waiting[u] -= 1
            args = dict.fromkeys(operands(m))
            for a in args:
                remaining[a] -= 1
            for a in (m, *args):  # each value whose last readers may now run (operands first: popped last in)
                left = remaining.get(a)
                if not left or left > MAX_LAST_READERS or a is body:
                    continue
                last = [u for u in users[a] if u not in done]
                if any(waiting[u] or u is body for u in last):
                    continue
                have, need = nbytes(a), [nbytes(u) for u in last]
                if have is not None and None not in need and sum(need) <= have + have // 8:
                    stack.extend(reversed(last))
    return out


def reads_before_writes(order: list) -> list:
    """``order`` with each slice of a ``strided_set``'s base that runs after the write moved to just before it.

    A gradient through ``x[i] = f(x[i])`` zeroes row ``i`` of the incoming gradient and reads that row: a
    post-order may read it after the write, which then cannot write in place (the base is still read) and copies
    the whole base. Read first, the row is a small view the plan may copy instead (``plan.buffer_reuse``)."""
    strided_set, strided_slice = get_op("strided_set"), get_op("strided_slice")
    readers: dict = {}
    for n in order:
        if type(n) is Call and n.op is strided_slice:
            readers.setdefault(n.args[0], []).append(n)
    if not readers:
        return order
    out, moved, position = [], set(), {n: p for p, n in enumerate(order)}
    for p, n in enumerate(order):
        if n in moved:
            continue
        if type(n) is Call and n.op is strided_set:
            for r in readers.get(n.args[0], ()):
                if position[r] > p and r not in moved:
                    moved.add(r)
                    out.append(r)
        out.append(n)
    return out


__all__ = ["memory_order", "operands", "reads_before_writes", "sources"]
