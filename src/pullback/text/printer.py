"""The text format, printing side: ``astext(obj)`` for modules, functions and expressions.

Format (reads like Relay; ``text.parser`` reads it back)::

    def @main(%x: Tensor[(2, 3), float32], %w: Tensor[(4, 3), float32]) -> Tensor[(), float32] {
      %0 = nn.dense(%x, %w);
      %1 = tanh(%0);
      sum(%1, axis=None, keepdims=False, exclude=False)
    }

- Every Call, Tuple, TupleGetItem, If and Function value is bound to ``%N = ...;``
  in post order of its scope; the last expression of a block is unbound. A
  shared node is therefore printed once and stays one node after parsing.
  Small constants used more than once are bound too.
- Vars print as ``%name`` with names made unique per top-level function
  (``%x``, ``%x_1``); characters other than ``[A-Za-z0-9_]`` become ``_``.
  Parameters are annotated in the signature; in ``astext(expr)`` a free
  variable is annotated at its first use (``%x: Tensor[(2, 3), float32]``).
- ``If``: nodes evaluated only in one branch (``ir.scope.ScopeInfo``) are
  printed inside that branch: ``%5 = if (%c) { %6 = ...; %6 } else { ... };``.
- Attributes: ``op(args, key=value, ...)`` for every field of the attrs
  dataclass; values are ints, floats (``repr``; ``nan``/``inf``/``-inf``),
  ``True``/``False``/``None``, JSON-quoted strings, tuples ``(1, 2)`` / ``(1,)``.
- Functions: ``fn [Primitive=1] (%p0: T) -> T { ... }`` (``-> T`` when ``ret_type``
  is set; an inferred-only return type is not printed, so the round trip is exact); a Call of a Function
  binds the function first (``%3 = fn ...;`` then ``%4 = %3(%a)``). Module
  functions: ``def @name(params) -> T { ... }``, calls ``@f(%0, %1)``; a name
  that is not an identifier is quoted (``@"my-fn"``).
- Types: ``Tensor[(2, ?), float32]`` (``?`` is ``Any``), ``Tensor[(), float32]``,
  ``Tensor[(3,), float32]``, tuples ``(T1, T2)`` / ``(T,)``, ``fn (T1) -> T2``.
- Constants with at most 16 elements print inline as ``const(1.5, float32)`` /
  ``const([[1, 2], [3, 4]], int32)`` / ``const(nan, float32)``, with values that
  parse back bit-exactly (float16/32 use the shortest digits that round-trip).
  Larger or empty constants, and any whose inline form would not round-trip
  bit-exactly (e.g. a NaN payload), print as ``meta[i]`` and go to a trailing
  section::

      #[metadata]
      meta[0] = float32 (100, 3) <base64 of the little-endian bytes>

Blocks indent by two spaces per level, up to ``MAX_INDENT_LEVELS`` (32) levels;
deeper blocks keep that indentation (braces still delimit them), so the text of
``if`` nested N deep is O(N), not O(N^2), and prints and parses in linear time.

Printing is iterative (nested Ifs and Functions use an explicit stack of
generators), so a chain of a million nodes prints in a few seconds.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import weakref
from collections.abc import Mapping
from typing import Iterator, Optional, Union

import numpy as np

from ..ir.errors import PullbackError
from ..ir.module import IRModule
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Op, Tuple, TupleGetItem, Var
from ..ir.scope import ScopeInfo
from ..ir.traversal import free_vars, post_order
from ..ir.types import FLOAT_DTYPES, TensorType, Type, type_text_with

__all__ = ["astext", "binding_text", "type_text", "value_text", "Namer", "INLINE_CONST_LIMIT"]

INLINE_CONST_LIMIT = 16
MAX_INDENT_LEVELS = 32  # deeper blocks print at this indentation: text size stays linear in nesting depth
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_GLOBAL_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_]")
_BOUND = (Call, Tuple, TupleGetItem, If, Function)


# ------------------------------------------------------------------ types and values


def _dims_text(shape: tuple) -> str:
    dims = ", ".join("?" if not isinstance(d, int) else str(d) for d in shape)
    return f"({dims},)" if len(shape) == 1 else f"({dims})"


def type_text(ty: Optional[Type]) -> str:
    """``Tensor[(2, 3), float32]``, ``(T1, T2)``, ``fn (T1) -> T2`` (iterative on nesting)."""
    return type_text_with(ty, _leaf_type_text)


def _leaf_type_text(t: Optional[Type]) -> str:
    if isinstance(t, TensorType):
        return f"Tensor[{_dims_text(t.shape)}, {t.dtype}]"
    if t is None:
        return "?"
    raise PullbackError(f"cannot print type {t!r}")


def _push_list(stack: list, items, sep) -> None:
    """Push ``items`` separated by ``sep`` so that they pop in order."""
    for i in range(len(items) - 1, -1, -1):
        stack.append(items[i])
        if i:
            stack.append(sep)


def _scalar_text(v) -> str:
    if v is None or isinstance(v, (bool, np.bool_)):
        return repr(None if v is None else bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, str):
        return json.dumps(v)
    raise PullbackError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def value_text(value) -> str:
    """An attribute value: scalars, strings, None, tuples ``(1,)`` and lists (iterative)."""
    out: list[str] = []
    stack: list = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, _Lit):
            out.append(v.text)
        elif isinstance(v, tuple):
            stack.append(_Lit(",)" if len(v) == 1 else ")"))
            _push_list(stack, v, _COMMA)
            stack.append(_Lit("("))
        elif isinstance(v, list):
            stack.append(_Lit("]"))
            _push_list(stack, v, _COMMA)
            stack.append(_Lit("["))
        else:
            out.append(_scalar_text(v))
    return "".join(out)


class _Lit:
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


_COMMA = _Lit(", ")


def _attrs_text(attrs) -> list[str]:
    if attrs is None:
        return []
    if dataclasses.is_dataclass(attrs):
        items = [(f.name, getattr(attrs, f.name)) for f in dataclasses.fields(attrs)]
    elif isinstance(attrs, Mapping):
        items = list(attrs.items())
    else:
        raise PullbackError(f"cannot print attrs {attrs!r}")
    return [f"{k if _IDENT.match(k) else json.dumps(k)}={value_text(v)}" for k, v in items]


def _float_text(x, dtype: str) -> str:
    if dtype == "float64":
        return repr(float(x))
    s = str(x)  # NumPy's (ml_dtypes') shortest digits for float16/bfloat16/float32
    if np.array(float(s), dtype=dtype).tobytes() != np.asarray(x).tobytes():
        s = repr(float(x))  # exact in float64, hence exact after the cast back
    return s


def inline_const_text(arr: np.ndarray) -> Optional[str]:
    """``const(VALUES, dtype)`` if it parses back bit-exactly and is small, else None."""
    if arr.size == 0 or arr.size > INLINE_CONST_LIMIT or arr.dtype.kind == "c":  # complex: in the metadata
        return None
    dtype = arr.dtype.name
    flat = arr.reshape(-1)
    if dtype == "bool":
        texts = ["True" if b else "False" for b in flat.tolist()]
        values: list = [bool(b) for b in flat.tolist()]
    elif dtype in FLOAT_DTYPES:
        texts = [_float_text(x, dtype) for x in flat]
        values = [float(t) for t in texts]
    else:
        values = [int(i) for i in flat.tolist()]
        texts = [str(i) for i in values]
    if np.array(values, dtype=dtype).tobytes() != np.ascontiguousarray(flat).tobytes():
        return None
    for d in reversed(arr.shape):
        texts = ["[" + ", ".join(texts[i : i + d]) + "]" for i in range(0, len(texts), d)]
    return f"const({texts[0]}, {dtype})"


def meta_line(index: int, arr: np.ndarray) -> str:
    """One line of the ``#[metadata]`` section."""
    le = np.ascontiguousarray(arr, dtype=np.dtype(arr.dtype.name).newbyteorder("<"))
    data = base64.b64encode(le.tobytes()).decode("ascii")
    return f"meta[{index}] = {arr.dtype.name} {_dims_text(arr.shape)} {data}"


def global_text(gv: GlobalVar) -> str:
    name = gv.name_hint
    return "@" + (name if _GLOBAL_IDENT.match(name) else json.dumps(name))


# ------------------------------------------------------------------ the printer


def _deeper(indent: str) -> str:
    """The indentation of a nested block: two more spaces, up to ``MAX_INDENT_LEVELS`` levels."""
    return indent if len(indent) >= 2 * MAX_INDENT_LEVELS else indent + "  "


class _Printer:
    """Prints one top-level unit (a def, a fn or an expression); numbering per unit."""

    def __init__(self, meta: list, meta_index: dict, record: bool = False):
        self.meta = meta
        self.meta_index = meta_index
        self.lines: list[str] = []
        self.names: dict[int, str] = {}  # id(node) -> "%3" / "%x"
        self.log: list[int] = []  # ids named in open blocks, for forgetting at block end
        self.used: set[str] = set()
        self.next_suffix: dict[str, int] = {}
        self.counter = 0
        self.free: set[int] = set()  # free vars to annotate at first use
        self.record: Optional[dict] = {} if record else None

    # -- names
    def var_name(self, v: Var) -> str:
        base = _BAD_CHARS.sub("_", v.name_hint)
        if not base[0].isalpha() and base[0] != "_":
            base = "v" + base
        name = base
        if name in self.used:
            k = self.next_suffix.get(base, 1)
            while f"{base}_{k}" in self.used:
                k += 1
            self.next_suffix[base] = k + 1
            name = f"{base}_{k}"
        self.used.add(name)
        text = "%" + name
        self.names[id(v)] = text
        return text

    def atom(self, e: Expr) -> str:
        name = self.names.get(id(e))
        if name is not None:
            return name
        if isinstance(e, Var):
            name = self.var_name(e)
            if id(e) in self.free and e.type_annotation is not None:
                return f"{name}: {type_text(e.type_annotation)}"
            return name
        if isinstance(e, Constant):
            return self.const_text(e)
        if isinstance(e, GlobalVar):
            return global_text(e)
        raise PullbackError(f"internal printer error: {type(e).__name__} used before it was printed")

    def const_text(self, c: Constant) -> str:
        text = inline_const_text(c.data)
        if text is not None:
            return text
        idx = self.meta_index.get(id(c))
        if idx is None:
            idx = self.meta_index[id(c)] = len(self.meta)
            self.meta.append(c)
        return f"meta[{idx}]"

    def bind(self, node: Expr) -> str:
        name = f"%{self.counter}"
        self.counter += 1
        nid = id(node)
        self.names[nid] = name
        self.log.append(nid)
        return name

    # -- expressions (operands already named)
    def expr_text(self, n: Expr) -> str:
        atom = self.atom
        if isinstance(n, Call):
            op = n.op
            parts = [atom(a) for a in n.args]
            if isinstance(op, Op):
                parts += _attrs_text(n.attrs)
                head = op.name
            elif isinstance(op, GlobalVar):
                head = global_text(op)
            else:
                head = atom(op)
            return f"{head}({', '.join(parts)})"
        if isinstance(n, Tuple):
            fields = [atom(f) for f in n.fields]
            return f"({fields[0]},)" if len(fields) == 1 else f"({', '.join(fields)})"
        if isinstance(n, TupleGetItem):
            return f"{atom(n.tuple_value)}.{n.index}"
        return atom(n)

    def fn_head(self, f: Function, prefix: str) -> str:
        params = []
        for p in f.params:
            name = self.var_name(p)
            params.append(name if p.type_annotation is None else f"{name}: {type_text(p.type_annotation)}")
        attrs = _attrs_text(f.attrs)
        if attrs:
            prefix = f"{prefix.rstrip()} [{', '.join(attrs)}] "
        head = f"{prefix}({', '.join(params)})"
        # only an explicit ret_type: printing an inferred one would make the parsed
        # function differ (ret_type set vs None) from the printed one
        ret = f.ret_type
        return head if ret is None else f"{head} -> {type_text(ret)}"

    # -- blocks (generators yield nested generators; the driver keeps the stack)
    def function(self, f: Function, prefix: str, indent: str, bound: Optional[str]) -> Iterator:
        head = self.fn_head(f, prefix)
        line = f"{bound} = {head}" if bound else head
        self._record(f, line)
        self.lines.append(f"{indent}{line} {{")
        yield self.block(f.body, _deeper(indent))
        self.lines.append(indent + ("};" if bound else "}"))

    def block(self, body: Expr, indent: str, nodes=None, info=None) -> Iterator:
        if nodes is None:
            order = post_order(body)
            kinds = {type(n) for n in order}
            info = ScopeInfo(body, order) if If in kinds else None
            nodes = info.root.nodes if info is not None else order
            if Constant in kinds:
                self.shared_consts(order)
        mark = len(self.log)
        lines, names, log, shared, atom = self.lines, self.names, self.log, self.shared, self.atom
        record = self.record
        for n in nodes:
            if n is body or id(n) in names:
                continue
            if type(n) is Call and n.attrs is None and isinstance(n.op, Op):  # the common line, inlined
                args = ", ".join([names.get(id(a)) or atom(a) for a in n.args])
                name = f"%{self.counter}"
                self.counter += 1
                names[id(n)] = name
                log.append(id(n))
                if record is not None:
                    record[id(n)] = f"{name} = {n.op.name}({args})"
                lines.append(f"{indent}{name} = {n.op.name}({args});")
                continue
            if not isinstance(n, _BOUND):
                if isinstance(n, Constant) and id(n) in shared:
                    text = self.const_text(n)
                    name = self.bind(n)
                    self._record(n, f"{name} = {text}")
                    lines.append(f"{indent}{name} = {text};")
                continue
            if isinstance(n, If):
                yield self.if_block(n, indent, info, bound=True)
                continue
            if isinstance(n, Function):
                yield self.function(n, "fn ", indent, self.bind(n))
                continue
            if isinstance(n, Call) and isinstance(n.op, Function) and id(n.op) not in names:
                yield self.function(n.op, "fn ", indent, self.bind(n.op))
            text = self.expr_text(n)
            name = self.bind(n)
            self._record(n, f"{name} = {text}")
            lines.append(f"{indent}{name} = {text};")
        # the block's value, unbound
        if id(body) in names or not isinstance(body, _BOUND):
            text = self.atom(body)
            self._record(body, text)
            lines.append(indent + text)
        elif isinstance(body, If):
            yield self.if_block(body, indent, info, bound=False)
        elif isinstance(body, Function):
            yield self.function(body, "fn ", indent, None)
        else:
            if isinstance(body, Call) and isinstance(body.op, Function) and id(body.op) not in names:
                yield self.function(body.op, "fn ", indent, self.bind(body.op))
            text = self.expr_text(body)
            self._record(body, text)
            lines.append(indent + text)
        for nid in self.log[mark:]:
            del names[nid]
        del self.log[mark:]

    def if_block(self, n: If, indent: str, info: ScopeInfo, bound: bool) -> Iterator:
        cond = self.atom(n.cond)
        head = f"{self.bind(n)} = if ({cond})" if bound else f"if ({cond})"
        self._record(n, head)
        self.lines.append(f"{indent}{head} {{")
        then_s, else_s = info.branch_scopes(n)
        yield self.block(n.true_branch, _deeper(indent), then_s.nodes, info)
        self.lines.append(indent + "} else {")
        yield self.block(n.false_branch, _deeper(indent), else_s.nodes, info)
        self.lines.append(indent + ("};" if bound else "}"))

    def shared_consts(self, order: list) -> None:
        counts: dict[int, int] = {}
        for n in order:
            for c in n.children():
                if isinstance(c, Constant):
                    counts[id(c)] = counts.get(id(c), 0) + 1
        self.shared.update(k for k, v in counts.items() if v > 1)

    shared: set = frozenset()

    def _record(self, node: Expr, line: str) -> None:
        if self.record is not None:
            self.record[id(node)] = line

    def run(self, gen: Iterator) -> None:
        self.shared = set()
        stack = [gen]
        while stack:
            try:
                stack.append(next(stack[-1]))
            except StopIteration:
                stack.pop()


def _print_unit(obj: Expr, meta: list, meta_index: dict, prefix: Optional[str] = None, record: bool = False) -> _Printer:
    p = _Printer(meta, meta_index, record)
    if isinstance(obj, Function):
        p.run(p.function(obj, prefix or "fn ", "", None))
    else:
        p.free = {id(v) for v in free_vars(obj)}
        p.run(p.block(obj, ""))
    return p


def _meta_section(meta: list) -> list[str]:
    if not meta:
        return []
    return ["#[metadata]"] + [meta_line(i, c.data) for i, c in enumerate(meta)]


def astext(obj: Union["IRModule", Expr, Type]) -> str:  # noqa: F821
    """The text of a module, a function, an expression or a type (see the module docstring)."""
    meta: list = []
    meta_index: dict = {}
    if isinstance(obj, IRModule):
        chunks = []
        for gv in obj.get_global_vars():
            p = _print_unit(obj[gv], meta, meta_index, f"def {global_text(gv)}")
            chunks.append("\n".join(p.lines))
        lines = ["\n\n".join(chunks)] if chunks else []
    elif isinstance(obj, Expr):
        lines = _print_unit(obj, meta, meta_index).lines
    elif isinstance(obj, Type):
        return type_text(obj)
    else:
        raise PullbackError(f"astext expects an IRModule, an expression or a type, got {type(obj).__name__}")
    lines += _meta_section(meta)
    return "\n".join(lines) + ("\n" if isinstance(obj, IRModule) and lines else "")


class Namer:
    """The numbering ``astext(fn)`` uses, computed once: ``namer.line(node)``."""

    def __init__(self, fn: Expr):
        self._lines = _print_unit(fn, [], {}, "fn ", record=True).record

    def line(self, node: Expr) -> str:
        """The line printed for ``node`` (``%7 = nn.foo(%5, %6)``), without ``;``."""
        text = self._lines.get(id(node))
        if text is None:
            if isinstance(node, (Var, Constant, GlobalVar)):
                return _Printer([], {}).atom(node)
            return f"<{type(node).__name__} not in this function>"
        return text


_NAMERS: "weakref.WeakKeyDictionary[Expr, Namer]" = weakref.WeakKeyDictionary()


def binding_text(fn: Expr, node: Expr) -> str:
    """The one line ``astext(fn)`` prints for ``node``, e.g. ``%7 = nn.foo(%5, %6)`` (cached per fn)."""
    namer = _NAMERS.get(fn)
    if namer is None:
        namer = _NAMERS[fn] = Namer(fn)
    return namer.line(node)
