"""Executors: ``build(mod, target="numpy")`` compiles a module to an executable."""

from .build import TARGETS, build, register_target
from .numpy_executor import CompiledFunction, Executable
from .profile import Profile, ProfileRow

__all__ = ["build", "register_target", "TARGETS", "Executable", "CompiledFunction", "Profile", "ProfileRow"]
