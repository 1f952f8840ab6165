"""Executors: ``build(mod, target="numpy"|"jax"|"torch")`` compiles a module to an executable.

One evaluator skeleton (``evaluator``) runs every target; a ``Target`` supplies how an operator runs.
"""

from .build import TARGETS, build, register_target
from .evaluator import CompiledFunction, Target
from .numpy_executor import Executable
from .profile import Profile, ProfileRow

__all__ = ["build", "register_target", "TARGETS", "Executable", "CompiledFunction", "Target", "Profile", "ProfileRow"]
