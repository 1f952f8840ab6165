"""The dataflow pattern language and the rewrite driver (Relay's vocabulary).

    from pullback.pattern import is_op, wildcard, rewrite
    x = wildcard().named("x")
    rules = [(is_op("add")(x, is_op("zeros_like")(wildcard())), lambda node, c: c["x"])]
    new_fn = rewrite(rules, fn)
"""

from .matcher import captures_of, match, match_captures, match_pattern
from .patterns import (AltPattern, AttrPattern, CallPattern, ConstantPattern, DFPattern, ExprPattern, IfPattern, OpPattern,
                       PredicatePattern, TupleGetItemPattern, TuplePattern, TypePattern, VarPattern, WildcardPattern, has_attr,
                       has_dtype, has_shape, has_type, is_constant, is_expr, is_if, is_op, is_tuple, is_tuple_get_item, is_var,
                       wildcard)
from .rewrite import DFPatternCallback, rewrite, rewrite_expr, rewrite_module

__all__ = [
    "DFPattern", "WildcardPattern", "ExprPattern", "VarPattern", "ConstantPattern", "OpPattern", "CallPattern",
    "TuplePattern", "TupleGetItemPattern", "IfPattern", "AltPattern", "TypePattern", "AttrPattern", "PredicatePattern",
    "wildcard", "is_expr", "is_var", "is_constant", "is_op", "is_tuple", "is_tuple_get_item", "is_if",
    "has_type", "has_shape", "has_dtype", "has_attr",
    "match", "match_captures", "match_pattern", "captures_of",
    "DFPatternCallback", "rewrite", "rewrite_expr", "rewrite_module",
]
