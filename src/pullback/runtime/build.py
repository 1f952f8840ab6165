"""``build(mod, target)``: compile a module for an executor chosen from a target table."""

from __future__ import annotations

from typing import Callable, Union

from ..ir.errors import PullbackError
from ..ir.expr import Function
from ..ir.module import IRModule


def _numpy(mod: IRModule, **options):
    from .numpy_executor import Executable

    return Executable(mod, **options)


# target name -> factory(mod, **options); other executors add a row (e.g. "jax")
TARGETS: dict[str, Callable] = {"numpy": _numpy}


def register_target(name: str, factory: Callable) -> None:
    """Add an executor: ``factory(mod, **options)`` returns an executable."""
    if name in TARGETS:
        raise PullbackError(f"target {name!r} is already registered")
    TARGETS[name] = factory


def build(mod: Union[IRModule, Function], target: str = "numpy", *, check_outputs: bool = False):
    """Compile ``mod`` (or a single Function, as ``main``) for ``target``.

    The result runs a function with ``exe["main"](*arrays)``. ``check_outputs``
    compares every kernel result with its node's inferred type (for tests).
    Type inference runs first if the module is not typed.
    """
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise PullbackError(f"build expects an IRModule or a Function, got {type(mod).__name__}")
    factory = TARGETS.get(target)
    if factory is None:
        raise PullbackError(f"unknown target {target!r}; available targets: {', '.join(sorted(TARGETS))}")
    return factory(mod, check_outputs=check_outputs)
