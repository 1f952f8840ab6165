"""pullback: a pure-Python compiler IR for training tensor programs."""

from . import ops  # noqa: F401  (registers operators)
from . import op
from . import analysis
from . import transform
from .ir.parser import parse, parse_expr
from .ir.printer import astext, binding_text
from .ir.structural import assert_structural_equal, structural_equal, structural_hash
from .ir import (
    Any,
    AttrError,
    Call,
    Constant,
    DiagnosticError,
    ExecutionError,
    Expr,
    FuncType,
    Function,
    GlobalVar,
    If,
    IRModule,
    ParseError,
    PassError,
    PullbackError,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Type,
    TypeInferenceError,
    Var,
    WellFormedError,
    const,
    var,
)

from .runtime import build  # noqa: E402

__version__ = "0.1.0"
