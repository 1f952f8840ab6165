"""Pictures of the dataflow graph: DOT text written by pullback, rendered by Graphviz if present.

``to_dot(mod, func)`` draws one function: a node per parameter, constant and
operator call (labelled with the op name and the result shape), a cluster per
fused group (a call to a ``Primitive=1`` function: its body is drawn inside
``subgraph cluster_N``), and, in a gradient function (``@f_grad`` returning
``(result, grads)``), forward nodes (those the forward result depends on) in
one colour and backward nodes in another. ``write_graph(mod, path, func)``
writes ``.dot`` itself and ``.svg`` / ``.png`` through the ``graphviz`` package
when it is installed and the ``dot`` program exists. Everything is iterative.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from .analysis.type_infer import infer_module
from .ir.errors import PullbackError
from .ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var
from .ir.module import IRModule
from .ir.traversal import post_order
from .ir.types import TensorType, TupleType, Type

FORWARD_COLOR = "lightblue"
BACKWARD_COLOR = "lightsalmon"
PLAIN_COLOR = "white"
PARAM_COLOR = "palegreen"
CONST_COLOR = "lightgrey"
FORMATS = ("dot", "svg", "png")


class VizError(PullbackError):
    """A graph picture cannot be made (unknown format, Graphviz missing)."""


def _type_label(ty: Optional[Type]) -> str:
    if isinstance(ty, TensorType):
        dims = ", ".join("?" if not isinstance(d, int) else str(d) for d in ty.shape)
        return f"({dims}{',' if len(ty.shape) == 1 else ''}) {ty.dtype}"
    if isinstance(ty, TupleType):
        return f"tuple of {len(ty.fields)}"
    return ""


def _node_label(n: Expr) -> str:
    if isinstance(n, Var):
        head = "%" + n.name_hint
    elif isinstance(n, Constant):
        head = "const" if n.data.size != 1 else f"const {n.data.reshape(-1)[0].item()!r}"
    elif isinstance(n, Call):
        head = n.op_name if not isinstance(n.op, Function) else "fused group"
    elif isinstance(n, Tuple):
        head = "tuple"
    elif isinstance(n, TupleGetItem):
        head = f".{n.index}"
    elif isinstance(n, If):
        head = "if"
    elif isinstance(n, GlobalVar):
        head = "@" + n.name_hint
    else:
        head = type(n).__name__
    ty = _type_label(n._checked_type)
    return f"{head}\\n{ty}" if ty else head


def _quote(s: str) -> str:
    return '"' + s.replace('"', '\\"') + '"'


def _forward_set(fn: Function, name: str) -> Optional[set]:
    """ids of the nodes the forward result of a gradient function depends on (None: not one)."""
    body = fn.body
    if not (name.endswith("_grad") and isinstance(body, Tuple) and len(body.fields) == 2):
        return None
    return {id(n) for n in post_order(body.fields[0])}


def _is_group(n: Expr) -> bool:
    return isinstance(n, Call) and isinstance(n.op, Function) and n.op.is_primitive


def to_dot(mod: IRModule | Function, func: str = "main") -> str:
    """DOT text of the dataflow graph of ``func`` (see the module docstring)."""
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise VizError(f"to_dot expects an IRModule or a Function, got {type(mod).__name__}")
    if func not in mod:
        raise VizError(f"the module has no function @{func} (functions: {', '.join('@' + k for k in mod)})")
    fn = mod[func]
    if fn._checked_type is None:
        infer_module(mod)
    forward = _forward_set(fn, func)
    ids: dict[int, str] = {}
    out = [f"digraph {_quote('@' + func)} {{", "  rankdir=TB;",
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
    if forward is not None:
        out.append(f'  legend [shape=note, style=filled, fillcolor=white, label="forward: {FORWARD_COLOR}\\n'
                   f'backward: {BACKWARD_COLOR}"];')
    edges: list[str] = []
    clusters = count = 0

    def color(n: Expr, outer: Expr) -> str:
        if isinstance(n, Var):
            return PARAM_COLOR
        if isinstance(n, Constant):
            return CONST_COLOR
        if forward is None:
            return PLAIN_COLOR
        return FORWARD_COLOR if id(outer) in forward else BACKWARD_COLOR

    def emit(n: Expr, outer: Expr, indent: str, src_of, table: dict) -> None:
        nonlocal count
        nid = table[id(n)] = f"n{count}"
        count += 1
        shape = ", shape=ellipse" if isinstance(n, Var) else ", shape=plaintext" if isinstance(n, Constant) else ""
        out.append(f"{indent}{nid} [label={_quote(_node_label(n))}, fillcolor={color(n, outer)}{shape}];")
        for c in n.children():
            src = src_of(c)
            if src is not None:
                edges.append(f"  {src} -> {nid};")

    outer_src = lambda c: ids.get(id(c))  # noqa: E731
    for n in [*fn.params, *post_order(fn.body)]:
        if id(n) in ids or isinstance(n, (Function, GlobalVar)):
            continue
        if not _is_group(n):
            emit(n, n, "  ", outer_src, ids)
            continue
        # a fused group: its body inside a cluster, its params wired to the call's arguments
        prim = n.op
        clusters += 1
        out.append(f"  subgraph cluster_{clusters} {{")
        out.append(f'    label="fused group {clusters}"; style="rounded,dashed"; color=grey40;')
        binding = {id(p): a for p, a in zip(prim.params, n.args)}
        local: dict[int, str] = {}  # per call: a primitive function called twice is drawn twice

        def inner_src(c, binding=binding, local=local):
            a = binding.get(id(c))
            return ids.get(id(a)) if a is not None else local.get(id(c))

        for m in post_order(prim.body):
            if id(m) in local or isinstance(m, (Var, Function, GlobalVar)):
                continue
            emit(m, n, "    ", inner_src, local)
        out.append("  }")
        ids[id(n)] = local.get(id(prim.body)) or inner_src(prim.body)
    out.extend(edges)
    out.append("}")
    return "\n".join(out) + "\n"


def render(dot: str, fmt: str) -> bytes:
    """``dot`` rendered to ``fmt`` ("svg" or "png") by Graphviz; a VizError if it is not installed."""
    if fmt not in ("svg", "png"):
        raise VizError(f"cannot render format {fmt!r} (formats: {', '.join(FORMATS)})")
    try:
        import graphviz
    except ImportError:
        raise VizError(f"writing .{fmt} needs the 'graphviz' Python package and Graphviz's 'dot' program; "
                       "write a .dot file instead (pip install graphviz)") from None
    if shutil.which("dot") is None:
        raise VizError(f"writing .{fmt} needs Graphviz's 'dot' program on PATH; write a .dot file instead")
    return graphviz.Source(dot).pipe(format=fmt)


def write_graph(mod: IRModule | Function, path: str | Path, func: str = "main") -> Path:
    """Write the picture of ``func`` to ``path``; the format is the suffix (.dot, .svg, .png)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise VizError(f"cannot tell the picture format from {str(path)!r}: use a .dot, .svg or .png file name")
    if fmt != "dot":  # fail before the work if Graphviz is missing
        render("digraph {}", fmt)
    dot = to_dot(mod, func)
    try:
        if fmt == "dot":
            path.write_text(dot)
        else:
            path.write_bytes(render(dot, fmt))
    except OSError as e:
        raise VizError(f"cannot write {path}: {e.strerror or e}") from None
    return path


__all__ = ["to_dot", "render", "write_graph", "VizError", "FORWARD_COLOR", "BACKWARD_COLOR"]
