"""What an ATen converter may ask while the importer converts one FX node (``ConvertContext``), the random
inputs that keep imported programs pure (``RandomInput``), and where a node came from in the user's code.
"""

from __future__ import annotations

import ast
import linecache
import re
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..analysis.type_infer import infer_expr
from ..ir.errors import PullbackError
from ..ir.expr import Expr, Var, const
from ..ir.types import ALL_DTYPES, Any, TensorType

RANDOM_KINDS = ("bernoulli", "uniform", "normal", "randperm", "randint", "exponential", "cauchy", "geometric",
                "log_normal")


@dataclass(frozen=True)
class RandomInput:
    """A random input parameter of ``@main``, drawn at each call exactly as eager PyTorch draws it.

    ``kind``: ``bernoulli`` (0/1 values, 1 with probability ``1 - rate``: a dropout mask, ``rate`` being the
    drop rate), ``uniform`` (``torch.rand``, or ``uniform_(*params)``), ``normal`` (``torch.randn``),
    ``randperm`` (a permutation of ``shape[0]``), ``randint`` (``torch.randint(*params, shape)``: integers in
    ``[low, high)``), or one of Tensor's in-place samplers called with ``params``:
    ``exponential`` (``F.gumbel_softmax``'s noise), ``cauchy``, ``geometric``, ``log_normal``. ``stride``: the
    strides eager fills the tensor in (``empty_like`` of a permuted input is permuted too), or None for contiguous.
    ``shape``: sizes, None for the batch (``dynamic_batch``), or ``(k, axis)`` for a dynamic size that user input
    ``k`` carries at ``axis`` (a sequence length).
    """

    name: str
    shape: tuple
    dtype: str
    rate: float = 0.0
    kind: str = "bernoulli"
    stride: Optional[tuple] = None
    params: tuple = ()

    def draw(self, batch: Optional[int] = None, inputs: Sequence = ()):
        """A fresh value (a torch tensor, contiguous) consuming PyTorch's RNG as eager does; ``batch`` gives the
        size of a dynamic (None) dimension, ``inputs`` (the user inputs) those of the sizes they carry."""
        import torch

        dtype = getattr(torch, self.dtype)
        shape = tuple(batch if d is None else inputs[d[0]].shape[d[1]] if isinstance(d, tuple) else d for d in self.shape)
        if None in shape:
            raise PullbackError(f"random input %{self.name} has a dynamic dimension: draw it with the batch size")
        if self.kind == "randperm":
            return torch.randperm(shape[0], dtype=dtype)
        if self.kind == "randint":
            return torch.randint(*map(int, self.params), shape, dtype=dtype)
        if self.kind in ("uniform", "normal") and not self.params:
            return (torch.rand if self.kind == "uniform" else torch.randn)(shape, dtype=dtype)
        t = torch.empty_strided(shape, self.stride, dtype=dtype) if self.stride else torch.empty(shape, dtype=dtype)
        if self.kind == "bernoulli":
            return t.bernoulli_(1.0 - self.rate).contiguous()
        return getattr(t, self.kind + "_")(*self.params).contiguous()


DropoutMask = RandomInput  # the name of earlier releases (a dropout mask is a bernoulli random input)


def torch_dtype_name(dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in ALL_DTYPES:
        raise PullbackError(f"from_torch: dtype {dtype} is not supported (supported: {', '.join(ALL_DTYPES)})")
    return name


def static_dim(d):
    """An int for a static torch dimension, ``Any`` for a symbolic one (a ``SymInt`` without a constant value)."""
    if isinstance(d, int):
        return d
    node = getattr(d, "node", None)
    value = node.maybe_as_int() if node is not None and hasattr(node, "maybe_as_int") else None
    return int(value) if value is not None else Any


def size_key(d):
    """A torch size as a key that does not fix it: an int, or a symbolic size's expression as text."""
    node = getattr(d, "node", None)
    return d if node is None else str(node.expr)


def torch_shape(shape) -> tuple:
    """A pullback shape from a torch size: ints, ``Any`` where symbolic."""
    return tuple(static_dim(d) for d in shape)


# ------------------------------------------------------------------ source lines


def _statement(path: str, lineno: int) -> str:
    """The whole statement of ``path`` that contains line ``lineno`` (all its lines, stripped and joined)."""
    lines = linecache.getlines(path)
    if not lines or lineno > len(lines):
        return ""
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return lines[lineno - 1].strip()
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While,
                                     ast.With, ast.Try)) or node.lineno == lineno:
                if best is None or node.lineno >= best.lineno:
                    best = node
    if best is None:
        return lines[lineno - 1].strip()
    end = best.end_lineno or best.lineno
    if isinstance(best, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef)):
        end = best.lineno
    return " ".join(line.strip() for line in lines[best.lineno - 1:end])


def source_line(node) -> str:
    """Where ``node`` came from: ``file:line in function: <the whole statement>`` (the innermost user frame of
    ``node.meta["stack_trace"]``), or the node's name when torch recorded no trace."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    for i in range(len(trace) - 1, -1, -1):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', trace[i])
        if m:
            path, lineno, fn = m.group(1), int(m.group(2)), m.group(3)
            code = _statement(path, lineno) or (trace[i + 1].strip() if i + 1 < len(trace) else "")
            return f"{path}:{lineno} in {fn}" + (f" ({code})" if code else "")
    return f"node %{node.name} (no stack trace)"


# ------------------------------------------------------------------ the converter's context


class Names:
    """Fresh ``%name``s: a suffix ``_1``, ``_2``... when a name is taken."""

    def __init__(self):
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name


@dataclass
class Shaped:
    """A value's shape and dtype when there is no torch value to read them from."""

    shape: tuple
    dtype_name: str

    @property
    def dtype(self):
        return self.dtype_name


class ConvertContext:
    """What a converter may ask about the node it converts (see ``aten_table``)."""

    def __init__(self, names: Names):
        self.node = None
        self._meta: dict[int, tuple] = {}
        self._names = names
        self.masks: list[RandomInput] = []
        self.mask_vars: list[Var] = []
        self._sizes: dict[str, tuple] = {}  # symbolic size -> (expression, axis) that carries it first
        self.symbolic_inputs: list = []  # (user input's name, axis, torch size) of each dynamic input size
        self.user_inputs: list[Var] = []  # the program's user inputs, in order
        self.ranges: dict = {}  # arange(n) over a dynamic size n -> the size's key (``aten_table.dynamic_range``)
        self.functions: dict = {}  # module functions the conversion adds (custom Functions' forward and backward)
        self.function_keys: dict = {}  # what they were made for -> name (frontend.custom_vjp)
        self.trainable: set[int] = set()  # ids of the Vars of parameters (and inputs) that require grad
        self._learnable: dict[int, bool] = {}
        self._variable: dict[int, bool] = {}

    def note_sizes(self, v: Expr, val) -> None:
        """Remember which axis of ``v`` (a user input, or a result whose length depends on the data such as
        ``unique``'s; torch value ``val``) carries each symbolic size."""
        for axis, d in enumerate(val.shape):
            if static_dim(d) is Any and hasattr(d, "node"):  # a torch SymInt (not a random input's Any)
                self._sizes.setdefault(size_key(d), (v, axis))

    def size_zeros(self, size, dtype: str) -> Expr:
        """A 1-D tensor of zeros of the symbolic length ``size`` (a ``SymInt``), read off the user input or the
        result that carries it: what broadcasts a tensor to a dynamic size it does not have."""
        return self._zeros_of(size_key(size), size, dtype)

    def _zeros_of(self, key, size, dtype: str) -> Expr:
        from ..ops.registry import get_op

        src = self._sizes.get(key)
        if src is None:
            raise PullbackError(f"a dynamic size {size} that no input carries (only input sizes can be dynamic)")
        v, axis = src
        z = get_op("zeros_like")(v)
        others = tuple(i for i in range(self.ndim_of(v)) if i != axis)
        z = get_op("sum")(z, others, False) if others else z
        return z if self.dtype_of(v) == dtype else get_op("cast")(z, dtype)

    def size_scalar(self, size, dtype: str) -> Expr:
        """The symbolic size ``size`` (a ``SymInt``) as a rank-0 tensor: counted off the input that carries it, or
        computed from such sizes (torch's formula over them: ``Mod(s0 + 1, s0)``, a roll's start)."""
        expr = getattr(getattr(size, "node", None), "expr", None)
        if expr is not None and size_key(size) not in self._sizes and not expr.is_Symbol:
            return self._size_formula(expr, dtype)
        return self._counted(size_key(size), size, dtype)

    def _counted(self, key, size, dtype: str) -> Expr:
        """The size of key ``key`` (``size_key``) as a rank-0 tensor: the ones along the axis that carries it."""
        from ..ops.registry import get_op

        ones = get_op("add")(self._zeros_of(key, size, dtype), const(np.ones((), dtype)))
        return get_op("sum")(ones, (0,), False)

    def _size_formula(self, expr, dtype: str) -> Expr:
        """A sympy formula of symbolic sizes as a rank-0 tensor of ``dtype`` (sums, products, Python's ``%`` and
        ``//``, max and min of integers; iteratively, operands first)."""
        from ..ops.registry import get_op

        ops = {"Add": "add", "Mul": "multiply", "Mod": "remainder", "PythonMod": "remainder", "FloorDiv": "floor_divide",
               "Max": "maximum", "Min": "minimum"}
        done: dict = {}
        stack = [(expr, False)]
        while stack:
            e, ready = stack.pop()
            if e in done:
                continue
            name = type(e).__name__
            if e.is_Integer:
                done[e] = const(np.asarray(int(e), dtype))
            elif e.is_Symbol:
                done[e] = self._counted(str(e), e, dtype)
            elif name not in ops:
                raise PullbackError(f"a dynamic size {expr} ({name} of sizes) cannot be computed by the program")
            elif not ready:
                stack.append((e, True))
                stack.extend((a, False) for a in e.args)
            else:
                out = done[e.args[0]]
                for a in e.args[1:]:
                    out = get_op(ops[name])(out, done[a])
                done[e] = out
        return done[expr]

    def learnable(self, e: Expr) -> bool:
        """Does ``e`` depend on a parameter that requires grad (would eager's autograd differentiate it)?"""
        return _reaches(e, self._learnable, lambda n: id(n) in self.trainable)

    def constant(self, e: Expr) -> bool:
        """Is ``e`` computed from constants alone (no input, parameter or buffer)?"""
        return not _reaches(e, self._variable, lambda n: isinstance(n, Var))

    def record(self, expr: Expr, val) -> None:
        if isinstance(expr, Expr) and hasattr(val, "shape") and hasattr(val, "dtype"):
            shape = torch_shape(val.shape)
            self._meta[id(expr)] = (shape, torch_dtype_name(val.dtype))
            if Any in shape:
                self.note_sizes(expr, val)

    def _info(self, e: Expr) -> tuple:
        info = self._meta.get(id(e))
        if info is None:
            t = infer_expr(e)  # an expression a converter built (its operands are typed Vars/recorded)
            if not isinstance(t, TensorType):
                raise PullbackError(f"from_torch: an operand of %{self.node.name} is not a tensor ({t!r})")
            info = self._meta[id(e)] = (tuple(t.shape), t.dtype)
        return info

    def shape_of(self, e: Expr) -> tuple:
        return self._info(e)[0]

    def dtype_of(self, e: Expr) -> str:
        return self._info(e)[1]

    def ndim_of(self, e: Expr) -> int:
        return len(self._info(e)[0])

    @property
    def val(self):
        """The torch (fake) value of the node's result."""
        return self.node.meta.get("val")

    def arg_val(self, i: int):
        """The torch value of the node's argument ``i`` (a fake tensor, a Python value, or None)."""
        args = self.node.args
        if i >= len(args):
            return None
        a = args[i]
        return a.meta.get("val") if hasattr(a, "meta") else a

    @property
    def out_shape(self) -> tuple:
        return torch_shape(self.val.shape)

    @property
    def out_shapes(self) -> list:
        return [torch_shape(v.shape) if v is not None else None for v in self.val]

    @property
    def out_dtype(self) -> str:
        v = self.val
        if isinstance(v, (list, tuple)):
            v = next(x for x in v if hasattr(x, "dtype"))
        return torch_dtype_name(v.dtype)

    def random_input(self, kind: str, shape: Sequence, dtype: str, rate: float = 0.0, stride=None, params: tuple = ()) -> Var:
        """A new random input parameter (see ``RandomInput``); ``bernoulli`` ones are named ``%dropout_mask_K``."""
        prefix = "dropout_mask" if kind == "bernoulli" else kind
        name = self._names.fresh(f"{prefix}_{len(self.masks)}")
        drawn = tuple(None if d is Any else self._carrier(d) if static_dim(d) is Any else int(static_dim(d)) for d in shape)
        shape = tuple(d if isinstance(d, int) else Any for d in drawn)
        static = Any not in shape
        stride = tuple(int(s) for s in stride) if static and stride is not None and _dense_permuted(shape, stride) else None
        v = Var(name, TensorType(shape, dtype))
        self.masks.append(RandomInput(name, drawn, dtype, float(rate), kind, stride, tuple(float(p) for p in params)))
        self.mask_vars.append(v)
        self.record(v, Shaped(shape, dtype))
        return v

    def _carrier(self, size) -> tuple:
        """``(k, axis)``: the user input ``k`` whose dimension ``axis`` carries the symbolic size ``size``."""
        v, axis = self._sizes.get(size_key(size), (None, None))
        k = next((k for k, u in enumerate(self.user_inputs) if u is v), None)
        if k is None:
            raise PullbackError(f"a random draw of the dynamic size {size}, which no input carries")
        return k, axis

    def dropout_mask(self, shape: Sequence[int], rate: float, stride=None) -> Var:
        """A dropout mask parameter ``%dropout_mask_K``: 0/1 values in the data's dtype, 1 with probability
        ``1 - rate``, filled in ``stride`` order as eager's ``empty_like(x).bernoulli_(1 - rate)``."""
        return self.random_input("bernoulli", shape, self.out_dtype, rate, stride)


def _dense_permuted(shape: tuple, stride: tuple) -> bool:
    """``stride`` is a permutation of a contiguous layout other than the contiguous one itself."""
    order = sorted(range(len(shape)), key=lambda i: (stride[i], -i), reverse=True)
    expect, ok = 1, True
    for i in reversed(order):
        if shape[i] != 1 and stride[i] != expect:
            ok = False
        expect *= max(shape[i], 1)
    contiguous = all(stride[i] >= stride[i + 1] for i in range(len(stride) - 1))
    return ok and not contiguous


def _reaches(e: Expr, memo: dict, hit) -> bool:
    """Does ``e`` or an expression it is computed from satisfy ``hit``? (An iterative walk; ``memo`` maps node ids
    to the answer and is shared between calls.)"""
    stack = [(e, False)]
    while stack:
        n, done = stack.pop()
        k = id(n)
        if k in memo:
            continue
        kids = n.children()
        if done:
            memo[k] = hit(n) or any(memo[id(c)] for c in kids)
            continue
        stack.append((n, True))
        stack.extend((c, False) for c in kids if id(c) not in memo)
    return memo[id(e)]


def higher_order(name: str):
    """``torch.ops.higher_order.<name>``, the operator a graph's node targets (None when this torch has none, or
    not yet: some are made when the module defining them is first imported, e.g. Dynamo's ``register_hook``)."""
    import torch

    return getattr(torch.ops.higher_order, name, None)


__all__ = ["higher_order", "ConvertContext", "RandomInput", "DropoutMask", "Names", "Shaped", "source_line", "torch_dtype_name",
           "torch_shape", "static_dim", "RANDOM_KINDS"]
