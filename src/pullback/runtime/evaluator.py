"""The evaluator skeleton shared by every target: plans, scopes, calls, freeing, input checks.

A module function is compiled to a flat plan (``runtime.plan``) and run by one
loop (``run``): only the taken ``If`` branch runs, calls to module functions and
to unfused primitive Functions push a frame on an explicit stack (no Python
recursion, deep recursion through ``If`` works, ``max_call_depth`` bounds it),
and every intermediate is dropped right after its last use. ``check_outputs``
and ``profile`` go through the same loop.

A target supplies only how an operator runs, like a backend overriding
torch.fx's ``Interpreter.call_function``: a ``Target`` gives the kernel of a
call (``op.impl(name)``), converts constants and checked inputs to its arrays
and results back, may run a fused group as one kernel, and a traced target
(``jax``) runs ``If`` through ``cond(pred, then_fn, else_fn)``, each branch
being the same loop over the branch's range of the plan.
"""

from __future__ import annotations

import weakref
from time import perf_counter
from typing import Callable, Optional, Sequence

import numpy as np

from ..analysis import infer_module
from ..ir.errors import ExecutionError, PullbackError
from ..ir.expr import Call, Expr, Function, GlobalVar
from ..ir.module import IRModule
from ..ir.traversal import post_order
from ..ops.registry import OpDef
from .plan import CALL1, CALL2, CALLN, END, FN, GET, IF, KERNEL_OPS, RET, TUPLE, FunctionPlan, kernel_label
from .profile import Profile, Profiler
from .values import convert_input, describe, find_mismatch, leaves, read_only, to_output

DEFAULT_MAX_CALL_DEPTH = 100_000


class Target:
    """How one target runs operators; the evaluator does everything else.

    ``name`` selects the operators' implementations (``op.impl(name)``). Override
    ``kernel`` to adapt them; ``constant``, ``take(leaf)`` (a checked input) and
    ``output`` (None or ``fn(leaf)``, a result) for the target's arrays, and
    ``fresh`` (a copy of a constant's value returned as a result, where the
    caller could write into it); ``group_kernel`` to run a fused group as one
    kernel; and set ``cond``
    (``cond(pred, then_fn, else_fn) -> value``) when values are traced and
    ``If`` cannot jump on a concrete condition.
    """

    name = "numpy"
    cond: Optional[Callable] = None

    def kernel(self, call: Call) -> Callable:
        """``fn(*arrays, attrs)`` running the operator of ``call``."""
        return call.op.impl(self.name)

    def missing_kernels(self, mod: IRModule) -> list[str]:
        """Names of the operators in ``mod`` this target has no kernel for (checked at build)."""
        ops = {n.op for _, f in mod.items() for n in post_order(f, into_functions=True)
               if isinstance(n, Call) and isinstance(n.op, OpDef)}
        return sorted(op.name for op in ops if not self.has_kernel(op))

    def has_kernel(self, op: OpDef) -> bool:
        try:
            op.impl(self.name)
        except PullbackError:
            return False
        return True

    # buffer reuse in plans (runtime.plan.buffer_reuse): on when a target gives in-place kernels
    reuses_buffers = False

    def allocates(self, call: Call) -> bool:
        """Does the kernel of ``call`` always return new memory, shared with no other value?"""
        return False

    def allocates_first(self, call: Call) -> bool:
        """Does the kernel of ``call`` return a tuple whose first field is always new memory, shared with no other
        value (a batch norm's output beside its statistics)?"""
        return False

    def inplace_kernel(self, call: Call, i: int) -> Optional[Callable]:
        """``fn(*arrays, attrs)`` computing ``call`` into argument ``i``'s array, or None."""
        return None

    def group_kernel(self, fn: Function) -> Optional[Callable]:
        """One kernel ``fn(*arrays, None)`` for the primitive Function ``fn``, or None to call it."""
        return None

    def constant(self, data: np.ndarray):
        """A Constant's (read-only NumPy) data as this target's value."""
        return data

    # A checked input leaf (native NumPy array, torch tensor or jax array) as this target's value.
    take = staticmethod(read_only)
    # None, or ``fn(leaf)``: a result leaf as returned to the caller (None: NumPy scalars as 0-d arrays).
    output: Optional[Callable] = None
    # None, or ``fn(value)``: a copy of a constant's value, for targets whose constants the caller could write
    # into (torch tensors cannot be read-only): a result that is a constant of the program is returned as a
    # copy, so writing into it in place cannot change what the next call returns
    fresh: Optional[Callable] = None

    def buffer(self, value) -> Optional[tuple]:
        """``(owner, nbytes)`` of the memory a result leaf lives in, ``owner`` being a weak-referenceable
        object that lives exactly as long as that memory; None when not tracked (profiles)."""
        if not isinstance(value, np.ndarray):
            return None
        while isinstance(value.base, np.ndarray):
            value = value.base
        return (value, value.nbytes) if value.flags.writeable else None

    def run_context(self):
        """A context entered around each run (e.g. a BLAS thread limit), or None."""
        return None


# ---------------------------------------------------------------- the loop


def _kernel_error(ins: tuple, slots: list, plan: FunctionPlan, exc: BaseException) -> ExecutionError:
    node = ins[-1]
    op = ins[0]
    if op == CALL1:
        arg_slots = (ins[3],)
    elif op == CALL2:
        arg_slots = (ins[3], ins[4])
    elif op == CALLN:
        arg_slots = ins[3]
    else:
        return ExecutionError(f"@{plan.name}: {type(node).__name__} failed: {type(exc).__name__}: {exc}")
    shapes = ", ".join(describe(slots[a]) for a in arg_slots)
    span = f" at {node.span}" if getattr(node, "span", None) else ""
    return ExecutionError(f"@{plan.name}: kernel of {kernel_label(node)}{span} failed on inputs ({shapes}): {type(exc).__name__}: {exc}")


def _fresh_constants(ids: frozenset, fresh: Callable, output: Optional[Callable]) -> Callable:
    """``output`` of a copy of each leaf that is one of the constants ``ids``."""
    def leaf(v):
        if id(v) in ids:
            v = fresh(v)
        return v if output is None else output(v)

    return leaf


def _check_output(value, node: Call, plan: FunctionPlan) -> None:
    bad = find_mismatch(value, node.checked_type)
    if bad is not None:
        path, want, got = bad
        span = f" at {node.span}" if getattr(node, "span", None) else ""
        where = f" (field {path[1:]})" if path else ""
        raise ExecutionError(f"@{plan.name}: kernel of {kernel_label(node)}{span} returned {describe(got)}{where}, "
                             f"but its type is {want!r}")


def _located(e: ExecutionError, node, plan: FunctionPlan) -> ExecutionError:
    """``e`` (raised by a kernel's run-time check) naming the function and the node's place."""
    span = f" at {node.span}" if getattr(node, "span", None) else ""
    out = ExecutionError(f"@{plan.name}: {e}{span}")
    out._located = True
    return out


def _depth_error(callee: FunctionPlan, max_depth: int) -> ExecutionError:
    return ExecutionError(f"@{callee.name}: calls nested more than max_call_depth={max_depth} deep (a recursion "
                          "without a base case?); the limit is build(..., max_call_depth=n)")


def run(plan: FunctionPlan, args: list, check: bool = False, prof: Optional[Profiler] = None,
        cond: Optional[Callable] = None, max_depth: int = DEFAULT_MAX_CALL_DEPTH, consume: bool = False):
    """Run ``plan`` on already converted ``args``; returns the raw result value.

    ``cond``: None to run ``If`` by jumping on the concrete condition, else
    ``cond(pred, then_fn, else_fn)`` (traced targets), each branch function
    running the loop over its branch's range of the plan. ``consume``: ``args`` is emptied once the slots
    hold its values, so that the plan's frees drop the last reference to each."""
    plan.ensure()
    slots = plan.template.copy()
    slots[: len(args)] = args
    if consume:
        args.clear()
    return _loop(plan, slots, 0, check, prof, cond, max_depth)


def _loop(plan: FunctionPlan, slots: list, pc: int, check: bool, prof: Optional[Profiler], cond, max_depth: int):
    code = plan.code
    stack: list = []  # the caller frames; with the running one, at most max_depth functions are active
    nested = max_depth - 1
    push = stack.append
    pop = stack.pop
    slow = check or prof is not None
    ins = None
    try:
        while True:
            ins = code[pc]
            pc += 1
            op = ins[0]
            if op == CALL1:
                _, fn, attrs, a0, out, frees, node = ins
                if slow:
                    slots[out] = _slow(fn, (slots[a0],), attrs, node, plan, check, prof)
                else:
                    slots[out] = fn(slots[a0], attrs)
                for f in frees:
                    slots[f] = None
            elif op == CALL2:
                _, fn, attrs, a0, a1, out, frees, node = ins
                if slow:
                    slots[out] = _slow(fn, (slots[a0], slots[a1]), attrs, node, plan, check, prof)
                else:
                    slots[out] = fn(slots[a0], slots[a1], attrs)
                for f in frees:
                    slots[f] = None
            elif op == CALLN:
                _, fn, attrs, a, out, frees, node = ins
                vals = [slots[i] for i in a]
                if slow:
                    slots[out] = _slow(fn, vals, attrs, node, plan, check, prof)
                else:
                    slots[out] = fn(*vals, attrs)
                for f in frees:
                    slots[f] = None
            elif op == GET:
                _, src, index, out, frees, _ = ins
                slots[out] = slots[src][index]
                for f in frees:
                    slots[f] = None
            elif op == TUPLE:
                _, a, out, frees, _ = ins
                slots[out] = tuple([slots[i] for i in a])
                for f in frees:
                    slots[f] = None
            elif op == IF:
                _, c, else_pc, then_frees, else_frees, end_pc, out, _ = ins
                if cond is not None:  # traced: both branches become functions of the values they use
                    slots[out] = cond(slots[c], _branch(plan, slots, pc, check, cond, max_depth),
                                      _branch(plan, slots, else_pc, check, cond, max_depth))
                    pc = end_pc
                    continue
                if slots[c]:
                    frees = then_frees
                else:
                    frees = else_frees
                    pc = else_pc
                for f in frees:
                    slots[f] = None
            elif op == END:
                _, src, dst, frees, pc = ins
                if cond is not None:  # the end of a traced branch (nested Ifs run in loops of their own)
                    return slots[src]
                slots[dst] = slots[src]
                for f in frees:
                    slots[f] = None
            elif op == FN:
                _, callee, a, out, frees, _ = ins
                vals = [slots[i] for i in a]
                for f in frees:
                    slots[f] = None
                if callee.code is None:
                    callee.ensure()
                if len(stack) >= nested:
                    raise _depth_error(callee, max_depth)
                push((code, pc, slots, out, plan))
                plan = callee
                code = callee.code
                slots = callee.template.copy()
                slots[: len(vals)] = vals
                pc = 0
            elif op == RET:
                value = slots[ins[1]]
                if not stack:
                    return value
                code, pc, slots, out, plan = pop()
                slots[out] = value
    except ExecutionError as e:
        if ins is not None and ins[0] in KERNEL_OPS and not getattr(e, "_located", False):
            raise _located(e, ins[-1], plan) from None  # a kernel's check failed: say in which function, where
        raise
    except Exception as e:  # noqa: BLE001 - a kernel failed: say which op, where, on what
        if ins is None or ins[0] not in KERNEL_OPS + (GET, TUPLE):
            raise
        raise _kernel_error(ins, slots, plan, e) from e


def _branch(plan: FunctionPlan, slots: list, pc: int, check: bool, cond, max_depth: int) -> Callable:
    """A traced branch: the loop from ``pc`` to the branch's END on a copy of the frame's slots."""
    return lambda: _loop(plan, slots.copy(), pc, check, None, cond, max_depth)


def _slow(fn, vals, attrs, node: Call, plan: FunctionPlan, check: bool, prof: Optional[Profiler]):
    """A kernel call with profiling and/or output checking."""
    value = fn(*vals, attrs) if prof is None else prof.kernel(fn, vals, attrs, kernel_label(node, fn))
    if check:
        _check_output(value, node, plan)
    return value


# ---------------------------------------------------------------- executables


class CompiledFunction:
    """``exe["name"]``: call with arrays (nested tuples for tuple parameters)."""

    def __init__(self, exe: "Executable", plan: FunctionPlan):
        self._exe = exe
        self.plan = plan
        self.name = plan.name
        self.params = plan.func.params

    def convert_inputs(self, inputs: tuple) -> list:
        """The inputs checked against the parameters' types and converted for the target."""
        params = self.params
        if len(inputs) != len(params):
            names = ", ".join("%" + p.name_hint for p in params) or "none"
            raise ExecutionError(f"@{self.name} takes {len(params)} input{'s' if len(params) != 1 else ''} ({names}), got {len(inputs)}")
        take = self._exe.target.take
        return [convert_input(v, p.checked_type, p.name_hint, self.name, take) for v, p in zip(inputs, params)]

    def __call__(self, *inputs):
        return self._exe.execute(self.plan, self.convert_inputs(inputs))

    def call_native(self, args: Sequence, check: bool = True, consume: bool = False):
        """Run on ``args`` and return the target's own arrays (jax arrays on the jax target; as ``__call__``
        elsewhere). ``check=False`` skips the input checks and conversions: ``args`` must then be values
        this target made (results of the executable's functions, or of ``target.take``), as an embedding
        that passes one function's results to another does (e.g. residuals from ``@main_fwd`` to ``@main_bwd``).
        ``consume`` (with ``check=False``): ``args`` is a list the caller gives up; it is emptied once the plan
        holds the values, so that each is freed after its last reader rather than at the end."""
        if check:
            return self._exe.execute(self.plan, self.convert_inputs(tuple(args)))
        return self._exe.execute(self.plan, args if consume and type(args) is list else list(args), consume=consume)

    def __repr__(self) -> str:
        return f"<CompiledFunction @{self.name}>"


class Executable:
    """A module built for a ``Target``; ``exe["main"](*arrays)`` runs a function.

    Each function is compiled once, on first use, to a flat plan. ``max_call_depth``
    bounds how many functions may be active at once, the called one included (an
    ``ExecutionError`` naming the function beyond it, instead of running out of memory).

    No reference cycle runs through an executable: an entry (``exe["main"]``) keeps it alive,
    it keeps its plans, and plans reach it back only weakly, so a dropped executable and its
    module (a model's weights, when they are constants) are freed at once, not by the cyclic GC.
    """

    def __init__(self, mod: IRModule, target: Target, check_outputs: bool = False,
                 max_call_depth: int = DEFAULT_MAX_CALL_DEPTH):
        if isinstance(max_call_depth, bool) or not isinstance(max_call_depth, int) or max_call_depth < 1:
            raise ExecutionError(f"max_call_depth must be a positive int, got {max_call_depth!r}")
        if not all(f._checked_type is not None for _, f in mod.items()):
            infer_module(mod)
        self.mod = mod
        self.target = target
        self.check_outputs = check_outputs
        self.max_call_depth = max_call_depth
        self._plans: dict[str, FunctionPlan] = {}
        self._fn_plans: dict[Function, FunctionPlan] = {}  # called primitive Functions (identity hash)
        self._resolver = _weak_resolver(self)

    @property
    def functions(self) -> list[str]:
        """Names of the module's functions."""
        return list(self.mod)

    def _check_kernels(self) -> None:
        """Refuse, at build, a module using operators the target cannot run."""
        missing = self.target.missing_kernels(self.mod)
        if missing:
            raise ExecutionError(f"target {self.target.name!r}: no kernel for {', '.join(missing)}")

    def _plan(self, name: str) -> FunctionPlan:
        p = self._plans.get(name)
        if p is None:
            if name not in self.mod:
                raise ExecutionError(f"the module has no function @{name} (functions: {', '.join('@' + k for k in self.mod)})")
            p = self._plans[name] = FunctionPlan(name, self.mod[name], self._resolver, self.target)
        return p

    def _resolve(self, callee: Expr) -> FunctionPlan:
        if isinstance(callee, GlobalVar):
            return self._plan(callee.name_hint)
        if not isinstance(callee, Function):
            raise ExecutionError(f"cannot call {callee!r}")
        plan = self._fn_plans.get(callee)
        if plan is None:
            plan = self._fn_plans[callee] = FunctionPlan(f"fn#{callee._uid}", callee, self._resolver, self.target)
        return plan

    def _entry(self, name: str):
        return CompiledFunction(self, self._plan(name))

    def __getitem__(self, name: str):
        # a new entry each time (a few fields; what it compiles is kept here): an entry keeps the executable
        # alive, so the executable keeping its entries would make a cycle
        return self._entry(name)

    def __contains__(self, name: str) -> bool:
        return name in self.mod

    def execute(self, plan: FunctionPlan, args: list, prof: Optional[Profiler] = None, consume: bool = False):
        """Run ``plan`` on converted ``args``; the result as returned to the caller. ``consume``: empty ``args``
        once the plan holds its values (``run``)."""
        target = self.target
        ctx = target.run_context()
        if ctx is None:
            value = run(plan, args, self.check_outputs, prof, target.cond, self.max_call_depth, consume)
        else:
            with ctx:
                value = run(plan, args, self.check_outputs, prof, target.cond, self.max_call_depth, consume)
        leaf = target.output
        if plan.returned_constants:  # a result that is a constant: a copy the caller may write into
            leaf = _fresh_constants(plan.returned_constants, target.fresh, leaf)
        return to_output(value, leaf)

    def profile(self, *inputs, func: str = "main") -> Profile:
        """Run ``func`` once, timing every kernel and measuring peak live intermediate bytes."""
        entry = self[func]
        entry.plan.ensure()
        args = entry.convert_inputs(inputs)
        prof = Profiler(leaves(args) + list(entry.plan.template), self.target.buffer)
        t0 = perf_counter()
        out = self.execute(entry.plan, args, prof)
        return prof.result(func, perf_counter() - t0, out)

    def __repr__(self) -> str:
        return f"<Executable target={self.target.name} functions={self.functions}>"


def _weak_resolver(exe: Executable) -> Callable[[Expr], FunctionPlan]:
    """``exe._resolve`` through a weak reference: plans hold it, and the executable holds its plans."""
    ref = weakref.ref(exe)

    def resolve(callee: Expr) -> FunctionPlan:
        owner = ref()
        if owner is None:
            raise ExecutionError("this plan's executable was freed: keep the executable or one of its entries")
        return owner._resolve(callee)

    return resolve


__all__ = ["Target", "Executable", "CompiledFunction", "run", "DEFAULT_MAX_CALL_DEPTH"]
