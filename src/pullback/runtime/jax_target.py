"""The JAX/XLA target: ``build(mod, target="jax", devices=None, batch_axis=None)``.

The shared evaluator (``runtime.evaluator``) is traced once per entry point
under ``jax.jit``: every operator runs ``op.impl("jax")`` on traced values,
``If`` becomes ``jax.lax.cond`` (each branch is the evaluator's loop over the
branch's range of the plan), and calls to module functions and to primitive
Functions (FuseOps groups) are inlined while tracing (XLA fuses by itself), so
recursive module functions are rejected. Inputs are checked like on every
target; results are NumPy arrays, nested in tuples as on the numpy target.

jax is imported on first build only (``import pullback`` does not import it).
64-bit types: a module that uses float64 or int64 is traced and run inside
``jax.enable_x64(True)`` (jax's scoped setting), any other inside
``enable_x64(False)``; the process-wide ``jax_enable_x64`` flag is never changed.

Run-time checks: what is an error on the other targets (an index out of range
in ``take`` with ``mode="fast"``, ``gather``, ``scatter``, ``scatter_add``,
``index_add``, ``nn.nll_loss`` targets; integer division by zero) is computed
inside the XLA program as one int32 code returned with the results, and raised
as the same ``ExecutionError`` after the call (``ops.kernels.check``).

Several devices (data parallelism through XLA): ``devices`` is a count or a list
of jax devices, ``batch_axis`` maps parameter names to the axis sharded over a
1-D mesh (``NamedSharding``); other inputs are replicated and XLA inserts the
reductions (e.g. of parameter gradients).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional, Sequence, Union

import numpy as np

from ..analysis.callgraph import CallGraph
from ..ir.errors import ExecutionError, PullbackError
from ..ir.expr import Call, Function, GlobalVar, If
from ..ir.module import IRModule
from ..ir.scope import ScopeInfo
from ..ir.traversal import post_order
from ..ir.types import TensorType, TupleType, Type
from ..ops.kernels import active_checks, collecting_checks, message_of
from ..ops.registry import OpDef, list_ops
from .evaluator import DEFAULT_MAX_CALL_DEPTH, CompiledFunction, Executable, Target, run
from .values import read_only, to_output

jax = jnp = lax = None  # set by _load_jax()


def _load_jax():
    global jax, jnp, lax
    if jax is None:
        try:
            import jax as _jax
            import jax.numpy as _jnp
            from jax import lax as _lax
        except ImportError as e:  # pragma: no cover - jax is a test dependency
            raise PullbackError(f"target 'jax' needs the jax package: {e}") from None
        jax, jnp, lax = _jax, _jnp, _lax
    return jax


_WIDE = frozenset(np.dtype(t) for t in ("float64", "int64", "uint64", "complex128"))  # 64-bit types: jax's x64 only


class JaxTarget(Target):
    """Kernels on traced jax values; ``If`` through ``lax.cond``; a result of another dtype than its
    node's type (a weakly typed or promoted jax result) is cast to it."""

    name = "jax"

    def __init__(self):
        _load_jax()
        self.cond = _checked_cond

    def has_kernel(self, op: OpDef) -> bool:
        try:
            op.impl("jax")
        except PullbackError:
            return False
        return True

    def kernel(self, call: Call) -> Callable:
        fn = call.op.impl("jax")
        t = call._checked_type
        dtype = t.dtype if isinstance(t, TensorType) else None
        where = f" at {call.span}" if getattr(call, "span", None) else ""

        def typed(*args):
            checks = active_checks()
            if checks is not None:
                checks.where = where  # a failing check names this operator's place
            out = fn(*args)
            return out if dtype is None or out.dtype == dtype else out.astype(dtype)

        return typed

    def constant(self, data: np.ndarray):
        """A concrete jax array of ``data``'s dtype, even while tracing (plans outlive a trace) and outside
        the module's 64-bit scope (a plan made before its first call: float64 stays float64)."""
        with jax.enable_x64(True) if data.dtype in _WIDE else nullcontext(), jax.ensure_compile_time_eval():
            return jnp.asarray(data)

    @staticmethod
    def take(arr):
        module = type(arr).__module__
        if module.startswith("jax"):
            return arr  # a jax array goes to jit as it is
        if module.startswith("torch"):  # zero copy through DLPack (compact strides only: else one copy first)
            return jnp.from_dlpack(arr.detach().contiguous())
        return read_only(arr)

    output = staticmethod(np.asarray)


def _checked_cond(pred, then_fn: Callable, else_fn: Callable):
    """``lax.cond`` whose branches carry their run-time checks out (``ops.kernels.TracedChecks``)."""
    outer = active_checks()

    def carried(fn):
        def branch():
            with collecting_checks() as inner:
                value = fn()
            return value, inner.result()

        return branch

    value, code = lax.cond(pred, carried(then_fn), carried(else_fn))
    if outer is not None:
        outer.merge(code)
    return value


def _checked_run(plan, args: list, check: bool, depth: int):
    """The evaluator traced with the run-time checks collected: ``(result, check code)``."""
    with collecting_checks() as checks:
        out = run(plan, args, check, None, _checked_cond, depth)
    return out, checks.result()


def missing_lowerings() -> list[str]:
    """Registered operators the jax target cannot run (empty when every operator has a jax kernel)."""
    target = JaxTarget()
    return [o.name for o in list_ops() if not target.has_kernel(o)]


def _uses_64bit(mod: IRModule) -> bool:
    stack: list[Type] = []
    for _, fn in mod.items():
        for n in post_order(fn, into_functions=True):
            if n._checked_type is not None:
                stack.append(n._checked_type)
    while stack:
        t = stack.pop()
        if isinstance(t, TensorType):
            if t.dtype in ("float64", "int64", "complex128"):
                return True
        elif isinstance(t, TupleType):
            stack.extend(t.fields)
    return False


def _check_no_recursion(mod: IRModule, name: str) -> None:
    """Calls are inlined: a cycle of module functions reachable from ``name`` cannot be."""
    graph = CallGraph(mod)
    for f in graph.callees_first([name]):
        missing = graph.unknown(f)
        if missing:
            raise ExecutionError(f"@{f} references @{missing[0]}, which is not in the module")
    cycles = graph.cycles([name])
    if cycles:
        path = cycles[0]
        raise ExecutionError(f"target 'jax': @{path[-1]} is recursive (through @{path[-2]}); the jax target "
                             "inlines module functions and cannot run recursion")


MAX_COND_DEPTH = 64  # jax traces a lax.cond inside the one around it, about 9 Python frames per level


def _cond_depth(mod: IRModule, name: str) -> int:
    """How deep ``lax.cond`` calls nest when ``@name`` is traced: the If scopes' nesting, a called module
    function's own depth counted from its call site (the target inlines calls)."""
    graph = CallGraph(mod)
    depth: dict[str, int] = {}
    for f in graph.callees_first([name]):
        info = ScopeInfo(mod[f].body)
        best = 0
        for n in info.order:
            d = info.scope_of[id(n)].depth
            if isinstance(n, If):
                d += 1
            elif isinstance(n, Call) and isinstance(n.op, GlobalVar):
                d += depth.get(n.op.name_hint, 0)
            best = max(best, d)
        depth[f] = best
    return depth[name]


def _check_cond_depth(mod: IRModule, name: str) -> None:
    d = _cond_depth(mod, name)
    if d > MAX_COND_DEPTH:
        raise ExecutionError(f"@{name}: If expressions nest too deeply for the jax target ({d} levels, at most "
                             f"{MAX_COND_DEPTH}: jax traces nested lax.cond recursively, on the Python stack); run "
                             "it on the numpy or torch target")


class _Scoped64:
    """A jitted function called (and lowered) inside jax's scoped 64-bit setting of its module."""

    def __init__(self, fn, x64: bool):
        self.fn = fn
        self.x64 = x64

    def __call__(self, *args):
        with jax.enable_x64(self.x64):
            return self.fn(*args)

    def lower(self, *args):
        with jax.enable_x64(self.x64):
            return self.fn.lower(*args)


class JaxFunction(CompiledFunction):
    """``exe["name"]``: the evaluator traced once under ``jax.jit``; NumPy arrays out."""

    def __init__(self, exe: "JaxExecutable", name: str, jitted: "_Scoped64"):
        super().__init__(exe, exe._plan(name))
        self.func = self.plan.func
        self._jitted = jitted

    def __call__(self, *inputs):
        return to_output(self.call_native(inputs), np.asarray)

    def call_native(self, args: Sequence, check: bool = True, consume: bool = False):
        """The jitted function on ``args``; results stay jax arrays. Torch tensors are taken by DLPack
        (inside the module's 64-bit scope, so int64 stays int64). A failed run-time check (out-of-range
        index, integer division by zero) is an ExecutionError, as on every target. ``consume`` changes nothing
        here: XLA holds its arguments to the end of the call."""
        with jax.enable_x64(self._exe.x64):
            if check:
                args = self.convert_inputs(tuple(args))
                self._exe._check_batch(self, args)
            out, code = self._jitted.fn(*args)
        code = int(code)
        if code:
            raise ExecutionError(f"@{self.name}: {message_of(code)} (jax target)")
        return out

    def lower_text(self, *inputs) -> str:
        """The StableHLO text jax produces for these inputs (for inspection)."""
        return self._jitted.lower(*self.convert_inputs(inputs)).as_text()

    def __repr__(self) -> str:
        return f"<JaxFunction @{self.name}>"


class JaxExecutable(Executable):
    """A module compiled for XLA through ``jax.jit``; ``exe["main"](*arrays)`` runs a function."""

    def __init__(self, mod: IRModule, check_outputs: bool = False,
                 devices: Union[None, int, Sequence] = None, batch_axis: Optional[dict] = None,
                 max_call_depth: int = DEFAULT_MAX_CALL_DEPTH):
        super().__init__(mod, JaxTarget(), check_outputs, max_call_depth)
        self._check_kernels()
        self.x64 = _uses_64bit(self.mod)
        self._jitted: dict[str, _Scoped64] = {}  # name -> its jitted evaluator (traced and compiled once)
        self.mesh = None
        self.batch_axis = dict(batch_axis or {})
        if devices is not None or batch_axis:
            self._setup_mesh(devices)

    @property
    def profile(self):
        raise AttributeError("profile: the jax target runs each function as one XLA program; "
                             "profile per operator on the numpy or torch target")

    # -- sharding
    def _setup_mesh(self, devices) -> None:
        from jax.sharding import Mesh

        available = jax.devices()
        if devices is None:
            devs = available
        elif isinstance(devices, int) and not isinstance(devices, bool):
            if not 1 <= devices <= len(available):
                raise ExecutionError(f"target 'jax': devices={devices}, but jax sees {len(available)} device(s) "
                                     f"({available[0].platform}); on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N "
                                     "before jax is imported")
            devs = available[:devices]
        else:
            devs = list(devices)
            if not devs:
                raise ExecutionError("target 'jax': devices is an empty list")
        for k, v in self.batch_axis.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int):
                raise ExecutionError(f"target 'jax': batch_axis maps parameter names to int axes, got {k!r}: {v!r}")
        self.devices = devs
        self.mesh = Mesh(np.array(devs), ("batch",))

    def _jit_options(self, fn: Function, name: str) -> dict:
        if self.mesh is None:
            return {}
        from jax.sharding import NamedSharding, PartitionSpec

        names = {p.name_hint: p for p in fn.params}
        for k in self.batch_axis:
            if k not in names:
                raise ExecutionError(f"target 'jax': batch_axis names %{k}, which is not a parameter of @{name} "
                                     f"(parameters: {', '.join('%' + n for n in names)})")
        shardings = []
        for p in fn.params:
            axis = self.batch_axis.get(p.name_hint)
            t = p.checked_type
            if axis is None:
                shardings.append(NamedSharding(self.mesh, PartitionSpec()))
                continue
            if not isinstance(t, TensorType) or not -t.ndim <= axis < t.ndim:
                raise ExecutionError(f"target 'jax': batch axis {axis} of %{p.name_hint} does not fit its type {t!r}")
            axis %= t.ndim
            shardings.append(NamedSharding(self.mesh, PartitionSpec(*([None] * axis + ["batch"]))))
        return {"in_shardings": tuple(shardings)}

    def _check_batch(self, entry: JaxFunction, args: list) -> None:
        if self.mesh is None:
            return
        n = len(self.devices)
        for p, a in zip(entry.params, args):
            axis = self.batch_axis.get(p.name_hint)
            if axis is not None and a.shape[axis] % n:
                raise ExecutionError(f"@{entry.name}: parameter %{p.name_hint} has {a.shape[axis]} entries along its "
                                     f"batch axis {axis}, not divisible by the {n} devices")

    # -- entry points
    def _entry(self, name: str) -> JaxFunction:
        jitted = self._jitted.get(name)
        if jitted is None:
            plan = self._plan(name)  # an unknown name is an error here
            _check_no_recursion(self.mod, name)
            _check_cond_depth(self.mod, name)
            check, depth = self.check_outputs, self.max_call_depth  # the traced function holds no executable
            fn = jax.jit(lambda *args: _checked_run(plan, list(args), check, depth), **self._jit_options(plan.func, name))
            jitted = self._jitted[name] = _Scoped64(fn, self.x64)
        return JaxFunction(self, name, jitted)

    def __repr__(self) -> str:
        devs = f" devices={len(self.devices)}" if self.mesh is not None else ""
        return f"<JaxExecutable functions={self.functions}{devs}>"


__all__ = ["JaxExecutable", "JaxFunction", "JaxTarget", "missing_lowerings"]
