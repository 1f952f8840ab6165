"""pullback: a pure-Python compiler IR for training tensor programs.

``import pullback`` needs NumPy alone; PyTorch, JAX, networkx and graphviz are
imported by the modules that use them, when they are used.
"""

from . import ops  # registers every operator
from . import analysis, op, testing, transform
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
from .ir.parser import parse, parse_expr
from .ir.printer import astext, binding_text
from .ir.structural import assert_structural_equal, structural_equal, structural_hash
from .runtime import build

__version__ = "0.1.0"

__all__ = [
    "Any", "AttrError", "Call", "Constant", "DiagnosticError", "ExecutionError", "Expr", "FuncType", "Function",
    "GlobalVar", "If", "IRModule", "ParseError", "PassError", "PullbackError", "TensorType", "Tuple", "TupleGetItem",
    "TupleType", "Type", "TypeInferenceError", "Var", "WellFormedError", "const", "var",
    "parse", "parse_expr", "astext", "binding_text", "assert_structural_equal", "structural_equal", "structural_hash",
    "build", "analysis", "op", "ops", "testing", "transform",
]
