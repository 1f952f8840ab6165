"""The IR: nodes, types, modules, traversals, scopes, structural equality (the text format is in ``text``)."""

from .errors import (
    AttrError,
    DiagnosticError,
    ExecutionError,
    ParseError,
    PassError,
    PullbackError,
    TypeCheckError,
    TypeInferenceError,
    WellFormedError,
)
from .expr import Call, Constant, Expr, Function, GlobalVar, If, Op, Tuple, TupleGetItem, Var, const, var
from .module import IRModule
from .structural import assert_structural_equal, structural_equal, structural_hash
from .traversal import free_vars, post_order, transform
from .types import Any, FuncType, TensorType, TupleType, Type

__all__ = [
    "AttrError",
    "DiagnosticError",
    "ExecutionError",
    "ParseError",
    "PassError",
    "PullbackError",
    "TypeCheckError",
    "TypeInferenceError",
    "WellFormedError",
    "Call",
    "Constant",
    "Expr",
    "Function",
    "GlobalVar",
    "If",
    "Op",
    "Tuple",
    "TupleGetItem",
    "Var",
    "const",
    "var",
    "IRModule",
    "assert_structural_equal",
    "structural_equal",
    "structural_hash",
    "free_vars",
    "post_order",
    "transform",
    "Any",
    "FuncType",
    "TensorType",
    "TupleType",
    "Type",
]
