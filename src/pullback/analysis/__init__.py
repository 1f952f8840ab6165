"""Analyses over the IR: types, well-formedness, liveness, costs."""

from .type_infer import infer_expr, infer_function, infer_module, join_types, types_compatible
