"""Analyses over the IR: types, call graph, well-formedness, liveness, costs."""

from .callgraph import CallGraph
from .type_infer import infer_expr, infer_function, infer_module, join_types, types_compatible
from .well_formed import check_well_formed, is_well_formed
from .liveness import Live, liveness, peak_memory, type_bytes
from .stats import LIKE_OPS, count_identity_arith, count_like_ops, flops, op_histogram, program_stats
from .fusion import FusionReport, fusion_report
from .saved import recomputed_calls, saved_bytes
from .tracking import tracked_children

__all__ = [
    "CallGraph",
    "infer_expr",
    "infer_function",
    "infer_module",
    "join_types",
    "types_compatible",
    "check_well_formed",
    "is_well_formed",
    "Live",
    "liveness",
    "peak_memory",
    "type_bytes",
    "LIKE_OPS",
    "count_identity_arith",
    "count_like_ops",
    "flops",
    "op_histogram",
    "program_stats",
    "FusionReport",
    "fusion_report",
    "saved_bytes",
    "recomputed_calls",
    "tracked_children",
]
