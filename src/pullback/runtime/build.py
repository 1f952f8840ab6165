"""``build(mod, target)``: compile a module for an executor chosen from a target table."""

from __future__ import annotations

import importlib
from typing import Callable, Union

from ..ir.errors import PullbackError
from ..ir.expr import Function
from ..ir.module import IRModule
from ..ir.gc_pause import gc_paused

# target name -> factory(mod, **options) returning an executable, or "module:attr"
# naming one (imported on first use, so optional dependencies stay optional).
TARGETS: dict[str, Union[str, Callable]] = {
    "numpy": "pullback.runtime.numpy_executor:Executable",
    "jax": "pullback.runtime.jax_target:JaxExecutable",
    "torch": "pullback.runtime.torch_target:TorchExecutable",
}


def register_target(name: str, factory: Union[str, Callable]) -> None:
    """Add an executor: ``factory(mod, check_outputs=..., **options)`` returns an executable."""
    if name in TARGETS:
        raise PullbackError(f"target {name!r} is already registered")
    TARGETS[name] = factory


def _factory(target: str) -> Callable:
    factory = TARGETS.get(target) if isinstance(target, str) else None
    if factory is None:
        raise PullbackError(f"unknown target {target!r}; available targets: {', '.join(sorted(TARGETS))}")
    if isinstance(factory, str):
        module, attr = factory.split(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory


def build(mod: Union[IRModule, Function], target: str = "numpy", *, check_outputs: bool = False, **options):
    """Compile ``mod`` (or a single Function, as ``main``) for ``target``.

    The result runs a function with ``exe["main"](*arrays)``. ``check_outputs``
    compares every kernel result with its node's inferred type (for tests).
    Type inference runs first if the module is not typed. Every target takes
    ``max_call_depth`` (how deeply calls between module functions may nest) and
    its own options: numpy ``fuse``, ``tune_malloc``, ``blas_threads``, ``reuse``, ``aten``; jax
    ``devices``, ``batch_axis``; torch ``device``, ``fast``.
    """
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise PullbackError(f"build expects an IRModule or a Function, got {type(mod).__name__}")
    factory = _factory(target)
    with gc_paused():  # type inference and the call graph make many acyclic objects: the cyclic GC would only rescan them
        return factory(mod, check_outputs=check_outputs, **options)
