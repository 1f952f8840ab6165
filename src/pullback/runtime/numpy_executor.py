"""The NumPy executor: one flat loop over compiled plans, with an explicit frame stack.

Calls to module functions and primitive Functions push a frame (code, pc,
slots) instead of recursing in Python, so deep recursion through ``If`` works.
Intermediates are dropped right after their last use (see ``plan``).
Inputs reach kernels as read-only views: a kernel cannot write into them. A
result may be a (read-only) view of an input, e.g. for ``reshape``.
"""

from __future__ import annotations

from time import perf_counter
from typing import Optional

from ..analysis import infer_module
from ..ir.errors import ExecutionError
from ..ir.expr import Call, Expr, Function, GlobalVar
from ..ir.module import IRModule
from .plan import CALL1, CALL2, CALLN, FN, GET, IF, JUMP, KERNEL_OPS, MOVE, RET, TUPLE, FunctionPlan, kernel_label
from .profile import Profile, Profiler
from .tuning import BlasThreads, keep_freed_memory
from .values import convert_input, describe, find_mismatch, leaves, to_output


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


def _check_output(value, node: Call, plan: FunctionPlan) -> None:
    bad = find_mismatch(value, node.checked_type)
    if bad is not None:
        path, want, got = bad
        span = f" at {node.span}" if getattr(node, "span", None) else ""
        where = f" (field {path[1:]})" if path else ""
        raise ExecutionError(f"@{plan.name}: kernel of {kernel_label(node)}{span} returned {describe(got)}{where}, "
                             f"but its type is {want!r}")


def run(plan: FunctionPlan, args: list, check: bool = False, prof: Optional[Profiler] = None):
    """Run ``plan`` on already converted ``args``; returns the raw result value."""
    plan.ensure()
    code = plan.code
    slots = plan.template.copy()
    slots[: len(args)] = args
    stack: list = []
    push = stack.append
    pop = stack.pop
    slow = check or prof is not None
    pc = 0
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
                _, cond, else_pc, then_frees, else_frees, _ = ins
                if slots[cond]:
                    frees = then_frees
                else:
                    frees = else_frees
                    pc = else_pc
                for f in frees:
                    slots[f] = None
            elif op == MOVE:
                _, src, dst, frees = ins
                slots[dst] = slots[src]
                for f in frees:
                    slots[f] = None
            elif op == JUMP:
                pc = ins[1]
            elif op == FN:
                _, callee, a, out, frees, _ = ins
                vals = [slots[i] for i in a]
                for f in frees:
                    slots[f] = None
                if callee.code is None:
                    callee.ensure()
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
    except ExecutionError:
        raise
    except Exception as e:  # noqa: BLE001 - a kernel failed: say which op, where, on what
        if ins is None or ins[0] not in KERNEL_OPS + (GET, TUPLE):
            raise
        raise _kernel_error(ins, slots, plan, e) from e


def _slow(fn, vals, attrs, node: Call, plan: FunctionPlan, check: bool, prof: Optional[Profiler]):
    """A kernel call with profiling and/or output checking."""
    value = fn(*vals, attrs) if prof is None else prof.kernel(fn, vals, attrs, kernel_label(node, fn))
    if check:
        _check_output(value, node, plan)
    return value


class CompiledFunction:
    """``exe["name"]``: call with arrays (nested tuples for tuple parameters)."""

    def __init__(self, exe: "Executable", plan: FunctionPlan):
        self._exe = exe
        self.plan = plan
        self.name = plan.name
        self.params = plan.func.params

    def convert_inputs(self, inputs: tuple) -> list:
        params = self.params
        if len(inputs) != len(params):
            names = ", ".join("%" + p.name_hint for p in params) or "none"
            raise ExecutionError(f"@{self.name} takes {len(params)} input{'s' if len(params) != 1 else ''} ({names}), got {len(inputs)}")
        return [convert_input(v, p.checked_type, p.name_hint, self.name) for v, p in zip(inputs, params)]

    def __call__(self, *inputs):
        args = self.convert_inputs(inputs)
        with self._exe.blas_limit():
            return to_output(run(self.plan, args, self._exe.check_outputs))

    def __repr__(self) -> str:
        return f"<CompiledFunction @{self.name}>"


class Executable:
    """A module compiled for the NumPy executor; ``exe["main"](*arrays)`` runs a function.

    Each function is compiled once, on first use, to a flat plan. ``fuse=True``
    runs each fused group (a call of a ``Primitive=1`` Function) as one kernel that
    reuses its own buffers (``runtime.fused``); ``fuse=False`` steps through it op by op.
    Process-wide tuning, off by default (``runtime.tuning``): ``tune_malloc=True`` keeps
    freed memory in the process for the next step; ``blas_threads=n`` limits BLAS threads
    during each call (restored after it).
    """

    target = "numpy"

    def __init__(self, mod: IRModule, check_outputs: bool = False, fuse: bool = True, tune_malloc: bool = False,
                 blas_threads: Optional[int] = None):
        if tune_malloc:
            keep_freed_memory()
        self.blas_limit = BlasThreads(blas_threads)
        if not all(f._checked_type is not None for _, f in mod.items()):
            infer_module(mod)
        self.mod = mod
        self.check_outputs = check_outputs
        self.fuse = fuse
        self._groups: dict = {}
        self._plans: dict[str, FunctionPlan] = {}
        self._fn_plans: dict[int, FunctionPlan] = {}
        self._entries: dict[str, CompiledFunction] = {}

    @property
    def functions(self) -> list[str]:
        """Names of the module's functions."""
        return list(self.mod)

    def _plan(self, name: str) -> FunctionPlan:
        p = self._plans.get(name)
        if p is None:
            if name not in self.mod:
                raise ExecutionError(f"the module has no function @{name} (functions: {', '.join('@' + k for k in self.mod)})")
            p = self._plans[name] = FunctionPlan(name, self.mod[name], self._resolve, self.fuse, self._groups)
        return p

    def _resolve(self, callee: Expr) -> FunctionPlan:
        if isinstance(callee, GlobalVar):
            return self._plan(callee.name_hint)
        if not isinstance(callee, Function):
            raise ExecutionError(f"cannot call {callee!r}")
        p = self._fn_plans.get(id(callee))
        if p is None:
            p = self._fn_plans[id(callee)] = FunctionPlan(f"fn#{callee._uid}", callee, self._resolve, self.fuse, self._groups)
        return p

    def __getitem__(self, name: str) -> CompiledFunction:
        f = self._entries.get(name)
        if f is None:
            f = self._entries[name] = CompiledFunction(self, self._plan(name))
        return f

    def __contains__(self, name: str) -> bool:
        return name in self.mod

    def profile(self, *inputs, func: str = "main") -> Profile:
        """Run ``func`` once, timing every kernel and measuring peak live intermediate bytes."""
        entry = self[func]
        entry.plan.ensure()
        args = entry.convert_inputs(inputs)
        prof = Profiler(leaves(args) + list(entry.plan.template))
        with self.blas_limit():
            t0 = perf_counter()
            out = to_output(run(entry.plan, args, self.check_outputs, prof))
        return prof.result(func, perf_counter() - t0, out)

    def __repr__(self) -> str:
        return f"<Executable target={self.target} functions={self.functions}>"
