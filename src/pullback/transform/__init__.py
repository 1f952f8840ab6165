"""Passes over IRModules and the pass infrastructure (one import line per module)."""

from .pass_infra import FunctionPass, ModulePass, Pass, PassContext, PassInfo, RewritePass, Sequential, function_pass, get_default_instruments, get_pass, list_passes, module_pass, register_pass, set_default_instruments  # noqa: F401
from .instruments import PassInstrument, PassTime, PassTiming, PrintIR, WellFormedCheck  # noqa: F401
from .infer_type import InferType  # noqa: F401
from .first_order_gradient import FirstOrderGradient, gradient  # noqa: F401
from .concretize_like import LIKE_OPS, ConcretizeLike  # noqa: F401
from .eliminate_identity import EliminateIdentity  # noqa: F401
from .simplify_expr import SimplifyExpr  # noqa: F401
from .recognize_ops import RecognizeOps  # noqa: F401
from .remove_unused_params import RemoveUnusedParameters  # noqa: F401
from .dead_code import DeadCodeElimination  # noqa: F401
from .cse import EliminateCommonSubexpr  # noqa: F401
from .fold_constant import FoldConstant  # noqa: F401
from .pipelines import FixedPoint, StandardCleanup, standard_cleanup  # noqa: F401
from .fuse_ops import FuseOps  # noqa: F401
from .partition import PartitionForwardBackward  # noqa: F401
