"""Passes over IRModules and the pass infrastructure (one import line per module)."""

from .pass_infra import FunctionPass, ModulePass, Pass, PassContext, PassInfo, Sequential, function_pass, get_default_instruments, get_pass, list_passes, module_pass, register_pass, set_default_instruments  # noqa: F401
from .instruments import PassInstrument, PassTime, PassTiming, PrintIR, WellFormedCheck  # noqa: F401
from .infer_type import InferType  # noqa: F401
from .first_order_gradient import FirstOrderGradient, gradient  # noqa: F401
