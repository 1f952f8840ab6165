"""The text format, reading side: ``parse(text) -> IRModule``, ``parse_expr(text) -> Expr``.

Reads everything ``text.printer.astext`` prints (see its docstring for the
format) plus hand-written text: nested calls ``add(multiply(%x, %y), %z)``,
nested tuples and parentheses, ``%t.0`` (also on a parenthesised expression),
``@f(...)``, ``%fnvar(args)``, ``if (c) {...} else {...}``, ``fn (...) {...}``
values, ``def @name(...) -> T {...}`` (return type optional), ``// comments``,
``const(...)`` literals and ``meta[i]`` with its ``#[metadata]`` section. In
``parse_expr`` an undefined ``%x`` is a free variable, annotated at its first
use (``%x: Tensor[(2, 3), float32]``), and ``@f`` makes a fresh GlobalVar.
Names are lexically scoped: a branch, a ``fn`` body or its parameters may
shadow an outer name; defining a name twice in one block is an error. Parsed
Calls get ``span = "line:column"`` (the position of the callee).

Nothing recurses on the nesting depth: expressions are read by a pushdown
automaton with an explicit stack of frames, types and literals by small
iterative loops. Any input either parses or raises ``ParseError`` with the
line and column (1-based) and what was expected.

Layering: ``text`` sits above ``ops`` and looks operators up in the registry.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Optional

import numpy as np

from ..ir.errors import ParseError, PullbackError
from ..ir.expr import Call, Constant, Expr, Function, GlobalVar, If, Tuple, TupleGetItem, Var, exact_array
from ..ir.gc_pause import gc_paused
from ..ir.module import IRModule
from ..ir.types import ALL_DTYPES, FLOAT_DTYPES, Any, FuncType, TensorType, TupleType, finfo
from ..ops import registry
from .unused import ill_typed

__all__ = ["parse", "parse_expr"]

MAX_LITERAL_DEPTH = 32  # nesting of attribute / constant literals (NumPy allows 64 dims)
INT64_MAX = 2**63 - 1  # bound of dimensions, tuple and metadata indices
LITERAL_INT_RANGE = (-(2**63), INT64_MAX)  # integer literals: the int64 range (the widest dtype)
MAX_META_RANK = 64  # NumPy's limit on array dimensions
_MAX_INT_DIGITS = 20  # longer integers (leading zeros aside) are out of range whatever their value

_SKIP = re.compile(r"(?:[ \t\r\n]+|//[^\n]*)*")
_TOKEN = re.compile(
    r"""(?P<local>%[A-Za-z0-9_]+)
      |(?P<global>@(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*|"(?:[^"\\\n]|\\.)*"))
      |(?P<num>-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)|-(?:inf|nan)\b)
      |(?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
      |(?P<str>"(?:[^"\\\n]|\\.)*")
      |(?P<arrow>->)
      |(?P<punct>[()\[\]{},;=:.?])""",
    re.X,
)
_INDEX = re.compile(r"\d+")
_META_HEADER = re.compile(r"^#\[metadata\][ \t\r]*$", re.M)
_META_LINE = re.compile(r"meta\[(\d+)\][ \t]*=[ \t]*([a-z0-9]+)[ \t]*\(([0-9, \t]*)\)[ \t]*([A-Za-z0-9+/=]*)[ \t\r]*\Z")
_NAME = r"%[A-Za-z0-9_]+"
_FAST_BIND = re.compile(
    rf"%([A-Za-z0-9_]+) = ([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\(((?:{_NAME}(?:, {_NAME})*)?)\);"
)
_FAST_NEXT = re.compile(r"\n[ \t]*" + _FAST_BIND.pattern)
_KEYWORDS = frozenset({"def", "fn", "if", "else", "meta", "const"})
_LITERAL_WORDS = {"True": True, "False": False, "None": None, "nan": math.nan, "inf": math.inf}
_EOF = "end of input"


def _registry():
    return registry


# ------------------------------------------------------------------ frames of the expression automaton

_NEED = object()  # a frame asks for the next expression


class _Frame:
    postfix = True  # whether ``.N`` / ``(args)`` may follow the frame's value
    start = (0, 0)  # line, column where the frame's expression starts

    def resume(self, p: "_Parser", value):  # -> _NEED | _Frame | Expr (done)
        raise NotImplementedError


class _Block(_Frame):
    """``%a = e; ...; result`` up to ``}`` (or the end of input for ``parse_expr``)."""

    postfix = False
    __slots__ = ("close", "names", "pending")

    def __init__(self, close: str):
        self.close = close
        self.names: dict[str, Optional[Expr]] = {}  # defined here -> the binding it shadows
        self.pending: Optional[tuple] = None

    def resume(self, p, value):
        if value is not None:
            if self.pending is None:  # the result
                if self.close == "}":
                    p.expect("}")
                elif p.kind != "eof":
                    p.fail(f"expected end of input but found {p.desc()}")
                p.unbind(self.names)
                p.used.add(id(value))
                return value
            p.expect(";")
            name = self.pending[0]
            self.names[name] = p.env.get(name)
            p.env[name] = value
            p.bound.append(value)
            p.bound_at.append(self.pending[1])
            self.pending = None
        while p.kind == "local":
            if p.fast_bind(self.names):
                continue
            if p.peek_kind() != "=":
                break
            name, line, col = p.val[1:], p.line, p.col
            if name in self.names or name in p.free:
                p.fail(f"%{name} is already defined", line, col)
            start = p.pos - len(p.val)
            p.advance()
            p.advance()
            self.pending = (name, start)
            return _NEED
        return _NEED


class _Call(_Frame):
    """Arguments of a call, after ``(``; ``callee`` is an OpDef or an expression."""

    __slots__ = ("callee", "line", "col", "args", "kwargs")

    def __init__(self, callee, line: int, col: int):
        self.callee = callee
        self.line, self.col = line, col
        self.args: list = []
        self.kwargs: dict = {}

    def resume(self, p, value):
        if value is None:
            if p.kind == ")":
                p.advance()
                return self.finish(p)
        else:
            self.args.append(value)
            if p.kind == ")":
                p.advance()
                return self.finish(p)
            p.expect(",", "',' or ')'")
        while p.kind == "ident" and p.peek_kind() == "=":
            key, line, col = p.val, p.line, p.col
            if key in self.kwargs:
                p.fail(f"attribute {key!r} given twice", line, col)
            p.advance()
            p.advance()
            self.kwargs[key] = p.literal()
            if p.kind == ")":
                p.advance()
                return self.finish(p)
            p.expect(",", "',' or ')'")
        if self.kwargs:
            p.fail(f"expected an attribute 'name=value' but found {p.desc()} (arguments go before attributes)")
        return _NEED

    def finish(self, p) -> Call:
        callee, args, where = self.callee, self.args, (self.line, self.col)
        if isinstance(callee, Expr):
            if self.kwargs:
                p.fail("only operator calls take attributes", *where)
            if not isinstance(callee, (GlobalVar, Function)):
                p.fail(f"cannot call a {type(callee).__name__}: expected an operator, a @global or a fn", *where)
            call = p.guard(lambda: Call(callee, args), where)
        else:
            if not callee.takes(len(args)):
                p.fail(f"operator {callee.name} expects {callee.arity()}, got {len(args)}", *where)
            attrs = p.guard(lambda: callee.make_attrs(**self.kwargs), where)
            call = p.guard(lambda: Call(callee, args, attrs), where)
        call.span = f"{self.line}:{self.col}"
        p.use(args)
        if isinstance(callee, Expr):
            p.used.add(id(callee))
        return call


class _Tuple(_Frame):
    """After ``(``: ``()``, ``(e)`` (parentheses), ``(e,)``, ``(e1, e2, ...)``."""

    __slots__ = ("fields", "comma")

    def __init__(self):
        self.fields: list = []
        self.comma = False

    def resume(self, p, value):
        if value is None:
            if p.kind == ")":
                p.advance()
                return p.at(Tuple(()), self.start)
            return _NEED
        self.fields.append(value)
        if p.kind == ",":
            p.advance()
            self.comma = True
            if p.kind != ")":
                return _NEED
        elif p.kind != ")":
            p.fail(f"expected ',' or ')' but found {p.desc()}")
        p.advance()
        if not self.comma:
            return value
        p.use(self.fields)
        return p.at(Tuple(self.fields), self.start)


class _If(_Frame):
    """After ``if (``: condition, ``) {`` block ``} else {`` block ``}``."""

    __slots__ = ("state", "cond", "then")

    def __init__(self):
        self.state = 0
        self.cond = self.then = None

    def resume(self, p, value):
        if value is None:
            return _NEED
        if self.state == 0:
            self.cond = value
            p.expect(")")
            p.expect("{")
        elif self.state == 1:
            self.then = value
            p.expect_word("else")
            p.expect("{")
        else:
            p.use((self.cond, self.then, value))
            return p.at(If(self.cond, self.then, value), self.start)
        self.state += 1
        return _Block("}")


class _Fn(_Frame):
    """A function whose header is read and whose params are bound; reads the body block."""

    __slots__ = ("params", "ret", "attrs", "line", "col", "shadowed")

    def __init__(self, params, ret, attrs, line, col, shadowed):
        self.params, self.ret, self.attrs, self.line, self.col = params, ret, attrs, line, col
        self.shadowed = shadowed

    def resume(self, p, value):
        if value is None:
            return _Block("}")
        p.unbind(self.shadowed)
        fn = p.guard(lambda: Function(self.params, value, self.ret, self.attrs), (self.line, self.col))
        return p.at(fn, (self.line, self.col))


# ------------------------------------------------------------------ the parser


class _Parser:
    def __init__(self, text: str, source_name: str, expr_mode: bool):
        if not isinstance(text, str):
            raise ParseError(f"expected program text (str), got {type(text).__name__}", 1, 1, source_name)
        self.source = source_name
        self.expr_mode = expr_mode
        self.meta: dict[int, Constant] = {}
        m = _META_HEADER.search(text)
        if m is not None:
            self.read_meta(text, m)
            text = text[: m.start()]
        self.text, self.n = text, len(text)
        self.pos = 0
        self.cur_line, self.line_start = 1, 0
        self.env: dict[str, Expr] = {}
        self.free: dict[str, Var] = {}
        self.globals: dict[str, GlobalVar] = {}
        self.bound: list[Expr] = []  # the value of every ``%name = ...;`` (flat lists: nothing for the GC to track)
        self.bound_at: list[int] = []  # and the offset of its ``%name``
        self.used: set[int] = set()  # ids of nodes used as an operand or a block's result
        self.global_refs: dict[str, tuple] = {}
        self.ops: dict[str, object] = {}
        self.kind = self.val = ""
        self.line = self.col = 1
        self.advance()

    # -- errors
    def fail(self, message: str, line: Optional[int] = None, col: Optional[int] = None):
        raise ParseError(message, self.line if line is None else line, self.col if col is None else col, self.source)

    def guard(self, make, where: tuple):
        """``make()``, turning a PullbackError (bad attrs, bad node) into a ParseError at ``where``."""
        try:
            return make()
        except ParseError:
            raise
        except PullbackError as e:
            self.fail(str(e), *where)

    def desc(self) -> str:
        return _EOF if self.kind == "eof" else repr(self.val)

    # -- lexer
    def advance(self, index: bool = False) -> None:
        text, pos = self.text, self.pos
        end = _SKIP.match(text, pos).end()
        if end != pos:
            nl = text.count("\n", pos, end)
            if nl:
                self.cur_line += nl
                self.line_start = text.rfind("\n", pos, end) + 1
            pos = end
        self.line, self.col = self.cur_line, pos - self.line_start + 1
        if pos >= self.n:
            self.kind, self.val, self.pos = "eof", "", pos
            return
        m = (_INDEX if index else _TOKEN).match(text, pos)
        if m is None:
            self.pos = pos
            if index:
                self.fail(f"expected a tuple index after '.' but found {text[pos]!r}")
            self.fail(f"unexpected character {text[pos]!r}")
        kind = "num" if index else m.lastgroup
        val = m.group()
        if kind == "punct" or kind == "arrow":
            kind = val
        self.kind, self.val, self.pos = kind, val, m.end()

    def peek_kind(self) -> str:
        state = (self.pos, self.cur_line, self.line_start, self.kind, self.val, self.line, self.col)
        self.advance()
        kind = self.kind
        self.pos, self.cur_line, self.line_start, self.kind, self.val, self.line, self.col = state
        return kind

    def expect(self, kind: str, what: Optional[str] = None) -> None:
        if self.kind != kind:
            self.fail(f"expected {what or repr(kind)} but found {self.desc()}")
        self.advance()

    def expect_word(self, word: str) -> None:
        if self.kind != "ident" or self.val != word:
            self.fail(f"expected '{word}' but found {self.desc()}")
        self.advance()

    def expect_int(self, what: str, noun: str) -> int:
        """A non-negative int64 (a dimension or an index); ``what`` is expected, ``noun`` names it when out of range."""
        if self.kind != "num" or not self.val.isdigit():
            self.fail(f"expected {what} but found {self.desc()}")
        v = self.to_int(self.val, noun, (0, INT64_MAX))
        self.advance()
        return v

    def to_int(self, text: str, what: str, bounds: tuple, line: Optional[int] = None, col: Optional[int] = None) -> int:
        """``int(text)`` within ``bounds`` (inclusive), else a ParseError (never Python's digit-limit ValueError)."""
        v = _bounded_int(text, bounds)
        if v is None:
            self.fail(f"{what} {_short(text)} is out of range ({bounds[0]} to {bounds[1]})", line, col)
        return v

    # -- nodes
    @staticmethod
    def at(node: Expr, where: tuple) -> Expr:
        """``node`` with ``span = "line:column"``."""
        node.span = f"{where[0]}:{where[1]}"
        return node

    def use(self, operands) -> None:
        self.used.update(map(id, operands))

    def check_unused(self, functions: dict) -> None:
        """Bindings no expression uses are not in the program: they must type-check all the same."""
        used = self.used
        roots: dict[int, tuple] = {}
        for node, at in zip(self.bound, self.bound_at):
            if id(node) not in used and id(node) not in roots:
                roots[id(node)] = (at, node)
        if not roots:
            return
        order = sorted(roots.values(), key=lambda r: r[0])  # text order
        found = ill_typed([node for _, node in order], functions)
        if found:
            text = self.text

            def place(k: int) -> tuple:
                at = order[k][0]
                return _TOKEN.match(text, at).group(), text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)

            (k, error), rest = found[0], found[1:]
            name, line, col = place(k)
            more = ""
            if rest:
                others = ", ".join(f"{n} at {ln}:{c}" for n, ln, c in (place(j) for j, _ in rest))
                verb = "bindings that do not" if len(rest) > 1 else "binding that does not"
                more = f" (and {len(rest)} more unused {verb} type-check: {others})"
            self.fail(f"{name} is never used and does not type-check: {error}{more}", line, col)

    # -- names
    def lookup(self, name: str) -> Optional[Expr]:
        v = self.env.get(name)
        return self.free.get(name) if v is None else v

    def unbind(self, shadowed: dict) -> None:
        """Leave a scope: restore the bindings its names shadowed."""
        env = self.env
        for name, prev in shadowed.items():
            if prev is None:
                del env[name]
            else:
                env[name] = prev

    def global_var(self, name: str, line: int, col: int) -> GlobalVar:
        gv = self.globals.get(name)
        if gv is None:
            gv = self.globals[name] = self.at(GlobalVar(name), (line, col))
            self.global_refs[name] = (line, col)
        return gv

    def get_op(self, name: str, line: int, col: int):
        op = self.ops.get(name)
        if op is None:
            reg = _registry()
            if name in _KEYWORDS or not reg.has_op(name):
                self.fail(f"unknown operator {name!r}", line, col)
            op = self.ops[name] = reg.get_op(name)
        return op

    def fast_bind(self, names: dict) -> bool:
        """Lines ``%N = op(%a, %b);`` of attr-less operators, read with one regex each (the bulk of
        printed programs); stops at the first line that needs the general parser."""
        text, env, ops = self.text, self.env, self.ops
        use, bound, bound_at = self.used.update, self.bound.append, self.bound_at.append
        pos = self.pos - len(self.val)
        line, line_start = self.line, self.pos - len(self.val) - self.col + 1
        m = _FAST_BIND.match(text, pos)
        found: Optional[tuple] = None
        set_attr = object.__setattr__  # spans are not structural: skip Expr.__setattr__
        while m is not None:
            name, opname, argtext = m.group(1, 2, 3)
            op = ops.get(opname)
            if op is None:
                reg = _registry()
                if opname in _KEYWORDS or not reg.has_op(opname):
                    break
                op = ops[opname] = reg.get_op(opname)
            if op.attrs_type is not None or name in env or name in self.free:
                break
            args = [env.get(a[1:]) for a in argtext.split(", ")] if argtext else []
            if None in args or not op.takes(len(args)):
                break
            call = Call(op, args)
            set_attr(call, "span", f"{line}:{m.start(2) - line_start + 1}")
            env[name] = call
            names[name] = None
            use(map(id, args))
            bound(call)
            bound_at(m.start(1) - 1)
            found = (line, line_start, m.end())  # where the accepted lines end
            pos = m.end()
            m = _FAST_NEXT.match(text, pos)
            if m is not None:  # the next line's position (committed only if it is accepted)
                line += 1
                line_start = pos + 1
        if found:
            self.cur_line, self.line_start, self.pos = found
            self.advance()
        return bool(found)

    # -- expressions
    def run(self, root: _Frame) -> Expr:
        """The pushdown automaton: returns the value of ``root``."""
        stack = [root]
        r = root.resume(self, None)
        while True:
            if r is _NEED:
                start = (self.line, self.col)
                r = self.primary()
                if isinstance(r, _Frame):
                    r.start = start
                    stack.append(r)
                    r = r.resume(self, None)
                    continue
                value = self.postfix(r, start)
            elif isinstance(r, _Frame):
                stack.append(r)
                r = r.resume(self, None)
                continue
            else:
                done = stack.pop()
                if not stack:
                    return r
                value = self.postfix(r, done.start) if done.postfix else r
            if isinstance(value, _Frame):
                stack.append(value)
                r = value.resume(self, None)
                continue
            r = stack[-1].resume(self, value)

    def postfix(self, value: Expr, start: tuple):
        """``.N`` and ``(args)`` after a value starting at ``start`` (line, column)."""
        while True:
            if self.kind == ".":
                where = (self.line, self.col)
                self.advance(index=True)
                index = self.to_int(self.val, "tuple index", (0, INT64_MAX))
                self.advance()
                self.used.add(id(value))
                value = self.at(self.guard(lambda v=value, i=index: TupleGetItem(v, i), where), where)
            elif self.kind == "(":
                self.advance()
                call = _Call(value, *start)
                call.start = start
                return call
            else:
                return value

    def primary(self):
        kind, val, line, col = self.kind, self.val, self.line, self.col
        if kind == "local":
            name = val[1:]
            self.advance()
            v = self.lookup(name)
            if self.kind == ":":
                if v is not None:
                    self.fail(f"%{name} is already defined; only the first use of a free variable takes a type", line, col)
                if not self.expr_mode:
                    self.fail(f"undefined variable %{name}", line, col)
                self.advance()
                v = self.free[name] = self.at(Var(name, self.type()), (line, col))
            elif v is None:
                if not self.expr_mode:
                    self.fail(f"undefined variable %{name}", line, col)
                v = self.free[name] = self.at(Var(name), (line, col))
            return v
        if kind == "global":
            self.advance()
            return self.global_var(self.global_name(val, line, col), line, col)
        if kind == "(":
            self.advance()
            return _Tuple()
        if kind != "ident":
            self.fail(f"expected an expression but found {self.desc()}")
        if val == "if":
            self.advance()
            self.expect("(")
            return _If()
        if val == "fn":
            self.advance()
            return self.fn_header(line, col)
        if val == "meta":
            self.advance()
            self.expect("[")
            index = self.expect_int("a metadata index", "metadata index")
            self.expect("]")
            if index not in self.meta:
                self.fail(f"meta[{index}] is not in the #[metadata] section", line, col)
            const = self.meta[index]
            if const.span is None:  # shared by every use: the first one
                const.span = f"{line}:{col}"
            return const
        if val == "const":
            self.advance()
            return self.const_literal(line, col)
        self.advance()
        if self.kind != "(":
            if val in _KEYWORDS or val in _LITERAL_WORDS or not _registry().has_op(val):
                self.fail(f"expected an expression but found {val!r}", line, col)
            self.fail(f"expected '(' after operator {val!r} but found {self.desc()}")
        op = self.get_op(val, line, col)
        self.advance()
        return _Call(op, line, col)

    def global_name(self, val: str, line: int, col: int) -> str:
        if val[1] != '"':
            return val[1:]
        try:
            name = json.loads(val[1:])
        except ValueError:
            self.fail(f"bad string in global name {val}", line, col)
        if not name:
            self.fail("empty global name", line, col)
        return name

    def fn_header(self, line: int, col: int) -> _Fn:
        """``[attrs] (params) -> T {``; binds the params and returns the frame reading the body."""
        attrs = {}
        if self.kind == "[":
            self.advance()
            while self.kind != "]":
                if self.kind == "str":
                    key = self.string(self.val)
                elif self.kind == "ident":
                    key = self.val
                else:
                    self.fail(f"expected an attribute name but found {self.desc()}")
                if key in attrs:
                    self.fail(f"attribute {key!r} given twice")
                self.advance()
                self.expect("=")
                value = self.literal()
                attrs[key] = value  # Function freezes it (lists become tuples)
                if self.kind != "]":
                    self.expect(",", "',' or ']'")
            self.advance()
        self.expect("(")
        params: list[Var] = []
        seen: set = set()
        while self.kind != ")":
            if self.kind != "local":
                self.fail(f"expected a parameter '%name' but found {self.desc()}")
            name, pl, pc = self.val[1:], self.line, self.col
            if name in seen:
                self.fail(f"duplicate parameter %{name}", pl, pc)
            seen.add(name)
            self.advance()
            ty = None
            if self.kind == ":":
                self.advance()
                ty = self.type()
            params.append(self.at(Var(name, ty), (pl, pc)))
            if self.kind != ")":
                self.expect(",", "',' or ')'")
        self.advance()
        ret = None
        if self.kind == "->":
            self.advance()
            ret = self.type()
        self.expect("{")
        shadowed = {}
        for v in params:
            shadowed[v.name_hint] = self.env.get(v.name_hint)
            self.env[v.name_hint] = v
        return _Fn(params, ret, attrs, line, col, shadowed)

    # -- constants and metadata
    def const_literal(self, line: int, col: int) -> Constant:
        self.expect("(")
        value = self.literal()
        dtype = None
        if self.kind == ",":
            self.advance()
            if self.kind != "ident" or self.val not in ALL_DTYPES:
                self.fail(f"expected a dtype ({', '.join(ALL_DTYPES)}) but found {self.desc()}")
            dtype = self.val
            self.advance()
        self.expect(")")
        leaves = list(_leaves(value))
        if not all(isinstance(x, (int, float, bool)) for x in leaves):
            self.fail("a constant holds numbers, True/False or nested [...] lists of them", line, col)
        if dtype is None:
            dtype = "bool" if all(isinstance(x, bool) for x in leaves) else "float32"
            if dtype == "float32" and all(isinstance(x, int) and not isinstance(x, bool) for x in leaves):
                dtype = "int32"
        if dtype != "bool" and any(isinstance(x, bool) for x in leaves):
            self.fail(f"bad constant: True/False in a {dtype} constant", line, col)
        if dtype[0] in "iu" and any(isinstance(x, float) for x in leaves):
            self.fail(f"bad constant: a float value in an {dtype} constant", line, col)
        if dtype in FLOAT_DTYPES:  # a finite literal must stay finite
            try:
                wide = np.array(value, dtype="float64")
            except (ValueError, TypeError, OverflowError) as e:
                self.fail(f"bad constant: {e}", line, col)
            with np.errstate(over="ignore"):
                overflow = np.isinf(wide.astype(dtype)) & ~np.isinf(wide)
            if overflow.any():
                self.fail(f"bad constant: {float(wide[overflow][0])!r} overflows {dtype} (largest finite value {finfo(dtype).max})", line, col)
        try:
            arr = exact_array(value, dtype, "bad constant")  # the checks of ir.expr.const: no silent wrap or rounding to bool
        except PullbackError as e:
            self.fail(str(e), line, col)
        const = Constant(arr)
        const.span = f"{line}:{col}"
        return const

    def read_meta(self, text: str, header: re.Match) -> None:
        first = text.count("\n", 0, header.start()) + 1
        for i, raw in enumerate(text[header.end() :].split("\n")[1:]):
            line = raw.strip()
            if not line or line.startswith("//"):
                continue
            lineno = first + 1 + i
            m = _META_LINE.match(line)
            if m is None:
                raise ParseError("expected 'meta[i] = dtype (shape) base64' in the #[metadata] section", lineno, 1, self.source)
            self.meta_entry(m, lineno)

    def meta_entry(self, m: re.Match, lineno: int) -> None:
        """One ``meta[i] = dtype (shape) base64`` line: indices and dims int64, at most 64 dims, a size NumPy can hold."""

        def fail(message: str):
            raise ParseError(message, lineno, 1, self.source)

        index = _bounded_int(m.group(1), (0, INT64_MAX))
        if index is None:
            fail(f"metadata index {_short(m.group(1))} is out of range (0 to {INT64_MAX})")
        dtype, dim_texts, data = m.group(2), m.group(3).replace(" ", "").replace("\t", "").split(","), m.group(4)
        if dtype not in ALL_DTYPES:
            fail(f"unknown dtype {dtype!r} in meta[{index}]")
        if index in self.meta:
            fail(f"meta[{index}] is defined twice")
        dim_texts = [d for d in dim_texts if d]
        if len(dim_texts) > MAX_META_RANK:
            fail(f"meta[{index}] has {len(dim_texts)} dimensions; an array has at most {MAX_META_RANK}")
        shape = tuple(_bounded_int(d, (0, INT64_MAX)) for d in dim_texts)
        if None in shape:
            bad = dim_texts[shape.index(None)]
            fail(f"meta[{index}]: dimension {_short(bad)} is out of range (0 to {INT64_MAX})")
        le = np.dtype(dtype).newbyteorder("<")
        if math.prod(max(d, 1) for d in shape) * le.itemsize > INT64_MAX:
            fail(f"meta[{index}]: a {dtype} array of shape {_shape_text(shape)} is too large to exist")
        try:
            raw_bytes = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            fail(f"meta[{index}]: bad base64 data")
        if len(raw_bytes) != math.prod(shape) * le.itemsize:
            fail(f"meta[{index}]: {len(raw_bytes)} bytes do not fit {dtype} {_shape_text(shape)}")
        try:
            arr = np.frombuffer(raw_bytes, dtype=le).reshape(shape).astype(dtype)
        except (ValueError, MemoryError) as e:
            fail(f"meta[{index}]: cannot make a {dtype} array of shape {_shape_text(shape)} ({e})")
        self.meta[index] = Constant(arr)

    # -- literals (attribute values, constant values) and types, iteratively
    def string(self, tok: str) -> str:
        try:
            return json.loads(tok)
        except ValueError:
            self.fail(f"bad string literal {tok}")

    def literal(self):
        """A value: number, True/False/None, nan/inf, "string", (tuple), [list]."""
        stack: list = []  # [closing char, items, saw_comma]
        while True:
            kind, val = self.kind, self.val
            if kind in ("(", "["):
                if len(stack) >= MAX_LITERAL_DEPTH:
                    self.fail(f"literal nested deeper than {MAX_LITERAL_DEPTH} levels")
                self.advance()
                close = ")" if kind == "(" else "]"
                if self.kind == close:
                    self.advance()
                    value = () if close == ")" else []
                else:
                    stack.append([close, [], False])
                    continue
            elif kind == "num":
                value = self.number(val)
                self.advance()
            elif kind == "ident" and val in _LITERAL_WORDS:
                value = _LITERAL_WORDS[val]
                self.advance()
            elif kind == "str":
                value = self.string(val)
                self.advance()
            else:
                self.fail(f"expected a value but found {self.desc()}")
            while True:  # deliver ``value`` to the enclosing sequences
                if not stack:
                    return value
                top = stack[-1]
                top[1].append(value)
                close = top[0]
                if self.kind == ",":
                    self.advance()
                    top[2] = True
                    if self.kind != close:
                        break
                elif self.kind != close:
                    self.fail(f"expected ',' or '{close}' but found {self.desc()}")
                self.advance()
                stack.pop()
                items = top[1]
                value = items if close == "]" else (tuple(items) if top[2] else items[0])

    def number(self, val: str):
        """A numeric literal: an int in the 64-bit range, or a float that does not overflow float64."""
        if val.lstrip("-").isdigit():
            return self.to_int(val, "integer literal", LITERAL_INT_RANGE)
        value = float(val)
        if math.isinf(value) and "inf" not in val:
            self.fail(f"number {_short(val)} overflows float64 (write inf for infinity)")
        return value

    def type(self):
        """``Tensor[(d, ...), dtype]``, ``dtype`` (scalar), ``(T, ...)``, ``fn (T, ...) -> T``."""
        stack: list = []  # [kind, items, saw_comma]; kind: "tuple" | "fnargs" | "fnret"
        while True:
            kind, val = self.kind, self.val
            if kind == "(":
                self.advance()
                if self.kind == ")":
                    self.advance()
                    value = TupleType(())
                else:
                    stack.append(["tuple", [], False])
                    continue
            elif kind == "ident" and val == "fn":
                self.advance()
                self.expect("(")
                if self.kind == ")":
                    self.advance()
                    self.expect("->")
                    stack.append(["fnret", [], False])
                else:
                    stack.append(["fnargs", [], False])
                continue
            elif kind == "ident" and val == "Tensor":
                value = self.tensor_type()
            elif kind == "ident" and val in ALL_DTYPES:
                self.advance()
                value = TensorType((), val)
            else:
                self.fail(f"expected a type but found {self.desc()}")
            while True:
                if not stack:
                    return value
                top = stack[-1]
                if top[0] == "fnret":
                    stack.pop()
                    value = FuncType(tuple(top[1]), value)
                    continue
                top[1].append(value)
                if self.kind == ",":
                    self.advance()
                    top[2] = True
                    if self.kind != ")":
                        break
                elif self.kind != ")":
                    self.fail(f"expected ',' or ')' but found {self.desc()}")
                self.advance()
                if top[0] == "fnargs":
                    self.expect("->")
                    top[0] = "fnret"
                    break
                stack.pop()
                value = TupleType(tuple(top[1])) if top[2] else top[1][0]

    def tensor_type(self) -> TensorType:
        line, col = self.line, self.col
        self.advance()
        self.expect("[")
        self.expect("(")
        dims: list = []
        while self.kind != ")":
            if self.kind == "?":
                dims.append(Any)
                self.advance()
            else:
                dims.append(self.expect_int("a dimension (an int or '?')", "dimension"))
            if self.kind != ")":
                self.expect(",", "',' or ')'")
        self.advance()
        self.expect(",")
        if self.kind != "ident" or self.val not in ALL_DTYPES:
            self.fail(f"expected a dtype ({', '.join(ALL_DTYPES)}) but found {self.desc()}")
        dtype = self.val
        self.advance()
        self.expect("]")
        size = math.prod(d for d in dims if d is not Any)
        if size > INT64_MAX:
            self.fail(f"a tensor of shape {_shape_text(dims)} has {size} elements, more than {INT64_MAX}", line, col)
        return TensorType(tuple(dims), dtype)

    # -- entry points
    def module(self):

        functions: dict[GlobalVar, Function] = {}
        while self.kind != "eof":
            self.expect_word("def")
            if self.kind != "global":
                self.fail(f"expected a function name '@name' but found {self.desc()}")
            line, col = self.line, self.col
            name = self.global_name(self.val, line, col)
            gv = self.global_var(name, line, col)
            if gv in functions:
                self.fail(f"@{name} is defined twice", line, col)
            self.advance()
            functions[gv] = self.run(self.fn_header(line, col))
        for name, gv in self.globals.items():
            if gv not in functions:
                self.fail(f"undefined global @{name}", *self.global_refs[name])
        self.check_unused(functions)
        return IRModule(functions)


def _bounded_int(text: str, bounds: tuple) -> Optional[int]:
    """``int(text)`` if it lies within ``bounds`` (inclusive), else None; never converts a huge digit string."""
    digits = text.lstrip("-").lstrip("0")
    if len(digits) > _MAX_INT_DIGITS:
        return None
    v = int(digits or "0")
    v = -v if text.startswith("-") else v
    return v if bounds[0] <= v <= bounds[1] else None


def _short(text: str) -> str:
    return text if len(text) <= 30 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


def _shape_text(dims) -> str:
    inner = ", ".join("?" if d is Any else str(d) for d in dims)
    return f"({inner},)" if len(dims) == 1 else f"({inner})"


def _leaves(value):
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        else:
            yield v


def parse(text: str, source_name: str = "<string>"):
    """An ``IRModule`` from its text (``def @name(...) {...}`` per function)."""
    p = _Parser(text, source_name, expr_mode=False)
    try:
        with gc_paused():
            return p.module()
    except ParseError:
        raise
    except PullbackError as e:
        raise ParseError(str(e), p.line, p.col, source_name) from None


def parse_expr(text: str, source_name: str = "<string>") -> Expr:
    """An expression (bindings then a result, or ``fn (...) {...}``); undefined %vars are free."""
    p = _Parser(text, source_name, expr_mode=True)
    try:
        with gc_paused():
            expr = p.run(_Block("eof"))
        p.check_unused({})
        return expr
    except ParseError:
        raise
    except PullbackError as e:
        raise ParseError(str(e), p.line, p.col, source_name) from None
