"""pullback: a pure-Python compiler IR for training tensor programs.

``import pullback`` needs NumPy alone; PyTorch, JAX, networkx and graphviz are
imported by the modules that use them, when they are used. ``pullback.frontend``,
``pullback.integrations`` and ``pullback.testing`` load on first attribute access.
"""

import importlib

from . import ops  # registers every operator
from . import analysis, op, text, transform
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
    TypeCheckError,
    TypeInferenceError,
    Var,
    WellFormedError,
    const,
    var,
)
from .text import parse, parse_expr
from .text import astext, binding_text
from .ir.structural import assert_structural_equal, structural_equal, structural_hash
from .runtime import build

__version__ = "0.1.0"

_LAZY = ("frontend", "integrations", "testing")


def __getattr__(name: str):
    """PEP 562: ``pb.frontend``, ``pb.integrations`` and ``pb.testing`` import on first use."""
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "Any", "AttrError", "Call", "Constant", "DiagnosticError", "ExecutionError", "Expr", "FuncType", "Function",
    "GlobalVar", "If", "IRModule", "ParseError", "PassError", "PullbackError", "TensorType", "Tuple", "TupleGetItem",
    "TupleType", "Type", "TypeCheckError", "TypeInferenceError", "Var", "WellFormedError", "const", "var",
    "parse", "parse_expr", "astext", "binding_text", "assert_structural_equal", "structural_equal", "structural_hash",
    "build", "analysis", "op", "ops", "text", "transform",
]
