"""Direct ATen calls for the torch target's most frequent operators.

The shared kernels reach torch through array-api-compat's namespace, whose wrappers (type promotion
checks, axis normalisation, ``as_array``) cost 1-8 microseconds per call: on the training workloads,
with 170-750 operator calls per step, as much as the small kernels themselves. For a call whose
operand types are known, ``fast_kernel(call)`` returns the ATen call the wrapper ends in, with what
can be decided from the types decided once (axes, static shapes, permutations): elementwise
arithmetic, comparisons, ``clip`` and math on one float dtype, ``where`` (against a +0.0 constant: a bitwise
AND), sums, means, maxima and minima over static axes, layout changes to static shapes, ``nn.dense`` (``F.linear``),
``nn.linear`` and the matmuls (oneDNN's inner product for float32 and bfloat16 rows on the CPU, with the bias),
``zeros``/``ones``, ``strided_set`` (a slice assigned into a copy). Anything else (other dtypes, ``?`` dimensions, operators not listed) keeps the
operator's own kernel, so results are the kernel's in every case
(``tests/runtime/test_torch_target.py`` runs the op table through this target).

``inplace_kernel(call, i)`` is the elementwise call writing its result into argument ``i``
(``torch.mul(a, b, out=a)``), a slice assigned into ``strided_set``'s first argument, ``index_add``'s updates
added into its first, or a softmax's gradient written into its output gradient's tensor, for the plan's buffer reuse (``runtime.plan``); ``allocates(call)``
says the call's result is a new tensor sharing memory with nothing else.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from ..ir.expr import Call, Constant
from ..ir.types import DTYPES, FLOAT_DTYPES, INT_DTYPES, TensorType
from ..ops import onednn
from ..ops.conv import conv2d_backward_weight_torch_maker, conv2d_torch_maker, conv2d_transpose_torch_maker
from ..ops.common import broadcast_shapes
from ..ops.kernels import merged_axes
from ..ops.layout import collapse_axes
from ..ops.nn import dense_in_memory_order, linear_rows
from ..ops.registry import array_namespace

torch = None  # set by _load()

# pullback op -> torch function, on tensors of one float dtype (results: a new tensor of that dtype)
BINARY = {"add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "power": "pow",
          "maximum": "maximum", "minimum": "minimum"}
UNARY = {"negative": "neg", "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "abs": "abs",
         "square": "square", "reciprocal": "reciprocal", "sin": "sin", "cos": "cos", "log1p": "log1p", "log2": "log2",
         "sigmoid": "sigmoid", "rsqrt": "rsqrt"}
# comparisons: operands of any one dtype, a new bool tensor
COMPARE = {"equal": "eq", "not_equal": "ne", "less": "lt", "less_equal": "le", "greater": "gt", "greater_equal": "ge"}


def _load():
    global torch
    if torch is None:
        import torch as _torch

        torch = _torch
    return torch


def _static(t) -> bool:
    return isinstance(t, TensorType) and t.is_static


def _same_type(a, b) -> bool:
    return isinstance(a, TensorType) and isinstance(b, TensorType) and a.dtype == b.dtype and a.shape == b.shape


def _one_dtype(call: Call) -> Optional[str]:
    """The one dtype of the call's result and tensor arguments, else None."""
    out = call._checked_type
    if not isinstance(out, TensorType):
        return None
    for a in call.args:
        t = a.checked_type
        if not isinstance(t, TensorType) or t.dtype != out.dtype:
            return None
    return out.dtype


def _float_args(call: Call) -> Optional[str]:
    """The one float dtype of the call's result and tensor arguments, else None."""
    dtype = _one_dtype(call)
    return dtype if dtype in FLOAT_DTYPES else None


def _same_dtype_args(call: Call) -> bool:
    types = [a.checked_type for a in call.args]
    return all(isinstance(t, TensorType) for t in types) and len({t.dtype for t in types}) == 1


# integer arithmetic ATen computes as NumPy does (wrapping), when the operands and the result share one dtype
_EXACT_ON_INTEGERS = frozenset({"add", "subtract", "multiply", "maximum", "minimum"})


def _binary(call: Call):
    dtype = _one_dtype(call)
    if dtype not in FLOAT_DTYPES and not (dtype in INT_DTYPES and call.op.name in _EXACT_ON_INTEGERS):
        return None  # (batch norm's num_batches_tracked + 1: 7 us through the shared kernel, 1 us so)
    x, k = call.args
    if (call.op.name == "power" and isinstance(k, Constant) and k.data.size == 1
            and x.checked_type.shape == call.checked_type.shape):
        # a Python exponent: ATen multiplies for 2 and 3 (and uses sqrt/reciprocal for +-0.5, -1, -2); pow by a
        # 0-d tensor is its generic kernel (x ** 2: 0.37 vs 0.02 ms, x ** 3: 1.45 ms on GPT-2's GELU input)
        e, pow_ = float(k.data.reshape(-1)[0]), torch.pow
        return lambda a, b, attrs=None: pow_(a, e)
    f = getattr(torch, BINARY[call.op.name])
    return lambda a, b, attrs=None: f(a, b)


def _unary(call: Call):
    if _float_args(call) is None:
        return None
    f = getattr(torch, UNARY[call.op.name])
    return lambda x, attrs=None: f(x)


def _relu(call: Call):
    """``clamp_min(x, 0)``: ATen's relu itself, which has an in-place form (``inplace_kernel``: a batch norm's
    output that dies at its relu, as eager's ``ReLU(inplace=True)``)."""
    if _float_args(call) is None:
        return None
    return lambda x, attrs=None: torch.clamp_min(x, 0.0)


def _clip(call: Call):
    if _float_args(call) is None:
        return None
    lo, hi, clamp = call.attrs.a_min, call.attrs.a_max, torch.clamp
    return lambda x, attrs=None: clamp(x, lo, hi)


def _compare(call: Call):
    if not _same_dtype_args(call):
        return None
    f = getattr(torch, COMPARE[call.op.name])
    return lambda a, b, attrs=None: f(a, b)


_BITS = {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64"}


def _plus_zero(e) -> bool:
    """Is ``e`` a float Constant whose every element is +0.0 (bit pattern 0)?"""
    return isinstance(e, Constant) and e.data.dtype.kind == "f" and e.data.size > 0 and not e.data.view(
        f"u{e.data.dtype.itemsize}").any()


def _where(call: Call):
    c, x, y = (a.checked_type for a in call.args)
    out = call.checked_type
    if not (isinstance(c, TensorType) and c.dtype == "bool" and out.dtype in FLOAT_DTYPES
            and all(isinstance(t, TensorType) and t.dtype == out.dtype for t in (x, y))):
        return None
    where = torch.where
    keep = 2 if _plus_zero(call.args[1]) else 1 if _plus_zero(call.args[2]) else None
    kept = None if keep is None else call.args[keep].checked_type
    if kept is None or not _static(out) or broadcast_shapes("where", (), c.shape, kept.shape) != tuple(out.shape):
        return lambda c, x, y, attrs=None: where(c, x, y)
    # a select against +0.0 (the gradients of clip and where): the kept branch's bits ANDed with the condition
    # as a mask, bit for bit ``where``'s result; ATen's CPU ``where`` takes 4.1-4.5 ms on 2M float32 elements,
    # this 0.7-0.9 ms (1.6-3.3 ms where the condition and the branch differ in memory layout)
    bits, dtype, zero_on_false = getattr(torch, _BITS[out.dtype]), getattr(torch, out.dtype), keep == 1

    def select_or_zero(c, x, y, attrs=None):
        v = x if zero_on_false else y
        if not v.is_cpu:
            return where(c, x, y)
        mask = c.to(bits)
        mask = mask.neg_() if zero_on_false else mask.sub_(1)  # all ones where v is kept
        return torch.bitwise_and(v.view(bits), mask).view(dtype)

    return select_or_zero


def _reduce_axes(call: Call) -> Optional[tuple]:
    from ..ops.reduce import reduced_axes

    xt = call.args[0].checked_type
    if _float_args(call) is None or call.attrs is None:
        return None
    axes = reduced_axes(call.op.name, [xt], call.attrs, xt.ndim)
    return axes or None  # torch reduces every axis for dim=(): leave that to the kernel


def _sum(call: Call):
    axes = _reduce_axes(call)
    if axes is None:
        return None
    return _summing(call.args[0].checked_type, axes, call.attrs.keepdims, call.checked_type)


def _summing(xt: TensorType, axes: tuple, keep: bool, out: TensorType, reshape: bool = False):
    """``torch.sum(x, axes, keep)`` (then reshaped to ``out``'s shape if ``reshape``); a contiguous ``x`` of a
    static shape that ``merged_axes`` merges: summed as that view."""
    f = torch.sum
    merged = merged_axes(tuple(xt.shape), axes) if _static(xt) else None
    if merged is None:
        if reshape:
            shape = tuple(out.shape)
            return lambda x, attrs=None: f(x, axes, keep).reshape(shape)
        return lambda x, attrs=None: f(x, axes, keep)
    (view, merged_at), shape = merged, tuple(out.shape)

    def run(x, attrs=None):
        if x.is_contiguous():
            return f(x.view(view), merged_at).view(shape)
        return f(x, axes, keep).reshape(shape)

    return run


def _mean(call: Call):
    axes = _reduce_axes(call)
    if axes is None or call.checked_type.dtype == "float16":  # NumPy accumulates float16 in float32
        return None
    keep, f = call.attrs.keepdims, torch.mean
    return lambda x, attrs=None: f(x, axes, keep)


def _extreme(fn: str):
    def make(call: Call):
        axes = _reduce_axes(call)
        if axes is None:
            return None
        keep, f = call.attrs.keepdims, getattr(torch, fn)
        return lambda x, attrs=None: f(x, axes, keep)

    return make


def _collapse_sum_to(call: Call):
    x, out = call.args[0].checked_type, call.checked_type
    if _float_args(call) is None or not (_static(x) and _static(out)) or tuple(x.shape) == tuple(out.shape):
        return None
    return _summing(x, collapse_axes(tuple(x.shape), tuple(out.shape)), True, out, reshape=True)


def _to_static_shape(method: str):
    """``x.<method>(result shape)`` where the result shape is static: ``reshape`` (for reshape, expand_dims,
    squeeze) or ``expand`` (broadcast_to, a view)."""

    def specialize(call: Call):
        out = call.checked_type
        if not _static(out):
            return None
        shape, fn = tuple(out.shape), getattr(torch.Tensor, method)
        return lambda x, attrs=None: fn(x, shape)

    return specialize


_reshape = _to_static_shape("reshape")


def _transpose(call: Call):
    xt = call.args[0].checked_type
    if not isinstance(xt, TensorType):
        return None
    axes, nd = call.attrs.axes, xt.ndim
    perm = tuple(range(nd - 1, -1, -1)) if axes is None else tuple(a % nd for a in axes)
    return lambda x, attrs=None: x.permute(perm)


def _rows_times(call: Call, base: Callable, weight: Callable, rows: Optional[Callable] = None) -> Callable:
    """``base`` (``fn(x, y, attrs)``, or ``fn(x, y, bias, attrs)`` for ``nn.linear``: a GEMM of x's rows, or of
    ``rows(x)``'s: ``x.T`` for a matmul's ``transpose_a``) with float32 and bfloat16 rows sent to oneDNN's inner
    product as ``rows(x) @ weight(y).T (+ bias)`` where it is faster (``ops.onednn``: float32, a large enough GEMM
    and rows it takes; bfloat16, contiguous rows: eager's ``F.linear`` bit for bit)."""
    x_type, out = call.args[0].checked_type, call.checked_type
    k, n = x_type.shape[-2 if rows is not None else -1], out.shape[-1]
    m = math.prod(out.shape[:-1]) if all(isinstance(d, int) for d in out.shape[:-1]) else None
    if out.dtype == "bfloat16":
        f, takes = onednn.bfloat16_linear(), onednn.takes_contiguous_rows
    else:
        f, takes = (onednn.float32_linear() if out.dtype == "float32" and onednn.big(k, n, m) else None), onednn.takes_rows
    if f is None:
        return base
    biased = len(call.args) == 3
    rows = rows or (lambda x: x)

    def gemm(x, y, *rest):  # rest: (attrs,) or (bias, attrs)
        r = rows(x)
        if takes(r, n):
            return f(r, weight(y), rest[0] if biased else None, "none", [], "")
        return base(x, y, *rest)

    return gemm


def _gemm_of_rows(in_memory_order: Callable) -> Callable:
    """The kernel maker of ``nn.dense`` / ``nn.linear``: one ``F.linear`` for a matrix or N-D contiguous rows (an
    ``addmm`` with the bias over the flattened rows: eager's bits, and a small layer's GEMM and separate add cost
    more than its work; ATen folds the rows without the permutes and reshapes of ``in_memory_order`` in Python, 12
    us a call), ``in_memory_order`` for other N-D layouts (``F.linear`` runs a transposed (S, B, K) view as S small
    GEMMs)."""

    def make(call: Call):
        if _float_args(call) is None:
            return None
        linear, nd = torch.nn.functional.linear, call.args[0].checked_type.ndim > 2

        def base(x, w, *rest):  # rest: (attrs,) or (bias, attrs)
            if nd and not x.is_contiguous():
                return in_memory_order(x, w, *rest)
            return linear(x, w, *rest[:-1])

        return _rows_times(call, base, lambda w: w)

    return make


_dense, _linear = _gemm_of_rows(dense_in_memory_order), _gemm_of_rows(linear_rows)


def _matmul(call: Call):
    if _float_args(call) is None:
        return None
    a = call.attrs
    ta, tb = getattr(a, "transpose_a", False), getattr(a, "transpose_b", False)
    at, bt = (t.checked_type for t in call.args)
    # bmm where the batches match: matmul would expand, reshape and view both operands around the same bmm
    # (five ATen calls, ~15 us, per product of a LeViT's attention)
    mm = torch.bmm if call.op.name == "nn.batch_matmul" and _static(at) and _static(bt) and at.shape[0] == bt.shape[0] \
        else torch.matmul
    if ta and tb:
        base = lambda x, y, attrs=None: mm(x.transpose(-1, -2), y.transpose(-1, -2))  # noqa: E731
    elif ta:
        base = lambda x, y, attrs=None: mm(x.transpose(-1, -2), y)  # noqa: E731
    elif tb:
        base = lambda x, y, attrs=None: mm(x, y.transpose(-1, -2))  # noqa: E731
    else:
        base = lambda x, y, attrs=None: mm(x, y)  # noqa: E731
    if call.op.name != "nn.matmul" or call.args[1].checked_type.ndim != 2:
        return base  # nn.batch_matmul, or a batch of right-hand matrices: no one weight
    if ta and call.args[0].checked_type.ndim != 2:
        return base  # a batch of transposed matrices: not rows
    return _rows_times(call, base, (lambda y: y) if tb else (lambda y: y.t()), (lambda x: x.t()) if ta else None)


def _cast(call: Call):
    x, out = call.args[0].checked_type, call.checked_type
    if not isinstance(x, TensorType) or x.dtype not in DTYPES:
        return None  # a complex operand keeps its real part: the op's kernel
    dtype = getattr(torch, out.dtype)
    return lambda x, attrs=None: x.to(dtype)


def _slot(call: Call) -> Optional[tuple]:
    """``strided_set``'s index (positive-step slices, decided from the static shape), or None."""
    x = call.args[0].checked_type
    if not _static(x) or not _same_dtype_args(call):
        return None
    index, flipped = call.attrs.forward_index(tuple(x.shape))
    return None if flipped else index


def _strided_set(call: Call, into: bool = False):
    """The slice assigned into a copy of x (``x.clone()[index] = v``), or, ``into``, into x itself: the plan's
    buffer reuse when x's buffer dies here (a loop's ``attn[..., i, :i] = ...``: one copy of the whole tensor per
    update otherwise)."""
    index = _slot(call)
    if index is None:
        return None

    def write(x, v, attrs=None):
        out = x if into else x.clone()
        out[index] = v
        return out

    return write


def _strided_view(call: Call):
    """``x[index]``: a view of x (positive-step slices), as eager's slicing, ``unbind`` and ``chunk`` give, where
    the view's rows stay dense (``_dense_rows``); otherwise the op's kernel (a contiguous copy)."""
    index = _slot(call)
    if index is None or not _dense_rows(tuple(call.args[0].checked_type.shape), index):
        return None
    return lambda x, attrs=None: x[index]


def _stack(call: Call):
    """Tensors stacked on a new innermost axis, copied into its columns of a new tensor: ``torch.stack`` there
    joins them element by element (an interleave of two (2048, 256) float32 halves: 1.8 ms against 0.5)."""
    t = call.checked_type
    if not _static(t) or t.dtype not in DTYPES or not _same_dtype_args(call) or call.attrs.axis % t.ndim != t.ndim - 1:
        return None
    shape, dtype = tuple(t.shape), getattr(torch, t.dtype)

    def columns(*xs):
        out = torch.empty(shape, dtype=dtype)
        for i, x in enumerate(xs[:-1]):
            out.select(-1, i).copy_(x)
        return out

    return columns


def _dense_rows(shape: tuple, index: tuple) -> bool:
    """Whether slicing a row-major tensor of ``shape`` by ``index`` (slices, one per axis) leaves its innermost
    axis of more than one element at unit stride. A GEMM reads such a view as it is; a sparse one (a 3x3
    convolution weight's centre tap: every ninth element) ATen copies element by element first, 2.4x the time of
    one contiguous copy (a 512x512 tap, 0.58 against 0.24 ms), at every use, forward and backward."""
    for d in reversed(range(len(shape))):
        start, stop, step = index[d].indices(shape[d])
        if len(range(start, stop, step)) > 1:
            return step == 1 and all(n == 1 for n in shape[d + 1:])
    return True


def _index_add(call: Call, into: bool = False):
    """``index_add``'s own kernel where it needs no widening to float32 (``runtime.opmath``): float32 and float64,
    and ``sequential`` sums in float16/bfloat16, whose ATen ``index_put_`` with ``accumulate`` rounds after each
    addition in index order, as eager's embedding and indexing backward do. It returns new memory, so the plan
    may let it add ``into`` its data operand's buffer when that dies here (``inplace_kernel``): a gradient of an
    embedding is ``index_add(zeros, ids, g)``, and copying the zeros first took 15 ms a step for BERT-base's 94 MB
    vocabulary (three times eager's ``embedding_dense_backward``)."""
    a, x, u = call.attrs, call.args[0].checked_type, call.args[2].checked_type
    if not _same_type(x, call.checked_type) or u.dtype != x.dtype:
        return None
    if x.dtype not in ("float32", "float64") and not (a.sequential and x.dtype in ("float16", "bfloat16")):
        return None
    if not into:
        return call.op.impl("torch")
    kernel, xp = call.op.kernel, array_namespace("torch")
    return lambda x, idx, u, attrs: kernel(xp, x, idx, u, attrs, True)


def _own_kernel(call: Call, *operands: int) -> Optional[Callable]:
    """The op's own torch kernel (one ATen call, new memory) where the result and the arguments at ``operands`` share
    one static float32 or float64 type, else None: listed so (``ALLOCATING``), the result may take the place of a
    dying buffer read last by an in-place kernel."""
    out = call._checked_type
    if not _static(out) or out.dtype not in ("float32", "float64") or \
            not all(_same_type(call.args[i].checked_type, out) for i in operands):
        return None
    return call.op.impl("torch")


def _nll_loss_grad(call: Call):
    """ATen's ``nll_loss_backward`` (the op's kernel): a new tensor, which a ``log_softmax_grad`` reading it last may
    write into (``_softmax_backward``)."""
    return _own_kernel(call, 1)


def _softmax_backward(aten: str, out: str):
    """ATen's ``_softmax_backward_data`` / ``_log_softmax_backward_data`` (the op's kernel) on float32 and float64
    rows. ``into``: written into the output gradient's tensor (``out``: the name of the ``.out`` overload's output
    argument) where it and the forward output are dense (row-major) and the rows lie along the last axis: ATen reads
    each row before writing it, with eager's bits (a cross-entropy's gradient, ``log_softmax_grad(nll_loss_grad(...))``,
    then holds two tensors of the logits' size where eager holds three: at GPT-2's 50,257-token vocabulary and 1024
    tokens, 393 against 589 MiB)."""

    def make(call: Call, into: bool = False):
        own = _own_kernel(call, 0, 1)
        if own is None or not into:
            return own
        ndim = len(call.checked_type.shape)
        if call.attrs.axis % ndim != ndim - 1:
            return None
        _load()
        f, axis, dtype = getattr(torch.ops.aten, aten).out, ndim - 1, getattr(torch, call.checked_type.dtype)

        def into_g(g, y, attrs=None):  # ATen's kernel writes its output as a dense array: a strided one gets a new one
            if g.is_contiguous() and y.is_contiguous():
                return f(g, y, axis, dtype, **{out: g})
            return own(g, y, attrs)

        return into_g

    return make


def _init(fn: str):
    def make(call: Call):
        out = call.checked_type
        if not _static(out) or out.dtype not in FLOAT_DTYPES:
            return None
        shape, dtype, f = tuple(out.shape), getattr(torch, out.dtype), getattr(torch, fn)
        return lambda attrs=None: f(shape, dtype=dtype)
    return make


MAKERS: dict = {**{k: _binary for k in BINARY}, **{k: _unary for k in UNARY}, **{k: _compare for k in COMPARE},
                "where": _where, "clip": _clip, "nn.relu": _relu, "sum": _sum, "mean": _mean, "max": _extreme("amax"), "min": _extreme("amin"), "collapse_sum_to": _collapse_sum_to,
                "reshape": _reshape, "expand_dims": _reshape, "squeeze": _reshape,
                "transpose": _transpose, "broadcast_to": _to_static_shape("expand"), "nn.dense": _dense, "nn.linear": _linear,
                "nn.batch_matmul": _matmul, "nn.matmul": _matmul, "zeros": _init("zeros"), "ones": _init("ones"), "cast": _cast,
                "strided_set": _strided_set, "strided_slice": _strided_view, "index_add": _index_add, "stack": _stack,
                "nn.nll_loss_grad": _nll_loss_grad, "nn.log_softmax_grad": _softmax_backward("_log_softmax_backward_data", "out"),
                "nn.softmax_grad": _softmax_backward("_softmax_backward_data", "grad_input"),
                "nn.conv2d": conv2d_torch_maker, "nn.conv2d_bias": conv2d_torch_maker,
                "nn.conv2d_transpose": conv2d_transpose_torch_maker, "nn.conv2d_backward_weight": conv2d_backward_weight_torch_maker}

# operators whose fast kernel always returns a new tensor (no view of an argument)
ALLOCATING = frozenset({*BINARY, *UNARY, *COMPARE, "where", "clip", "nn.relu", "sum", "mean", "max", "min", "collapse_sum_to", "nn.dense", "nn.linear",
                        "nn.batch_matmul", "nn.matmul", "zeros", "ones", "strided_set", "stack", "index_add",
                        "nn.nll_loss_grad", "nn.log_softmax_grad", "nn.softmax_grad"})


def autocast_off(device_type: str = "cpu"):
    """A context turning a ``torch.autocast`` region of ``device_type`` off while kernels run, or None when no
    region is open: a program computes in the dtypes of its types (an autocast ``F.linear`` would return
    bfloat16 where the program says float32, and a backward would then mix the two)."""
    import torch

    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return None


def fast_kernel(call: Call) -> Optional[Callable]:
    """The direct ATen call for ``call`` (``fn(*tensors, attrs)``), or None to use the op's kernel."""
    make = MAKERS.get(call.op.name)
    if make is None or call._checked_type is None:
        return None
    _load()
    return make(call)


def allocates(call: Call) -> bool:
    """Does ``fast_kernel(call)`` return a new tensor that shares memory with no other value?"""
    return call.op.name in ALLOCATING and fast_kernel(call) is not None


# operators whose torch kernel returns a tuple whose first field is always a new tensor (ATen's batch norm: its
# output; the other fields may be the moving statistics given to it)
FIRST_ALLOCATING = frozenset({"nn.native_batch_norm", "nn.batch_norm"})


def allocates_first(call: Call) -> bool:
    """Does ``call``'s torch kernel return a tuple whose first field shares memory with no other value?"""
    return getattr(call.op, "name", None) in FIRST_ALLOCATING


def inplace_kernel(call: Call, i: int) -> Optional[Callable]:
    """``fn(*tensors, attrs)`` computing ``call`` into argument ``i``'s tensor (of the result's type), or None."""
    name = call.op.name
    if name in ("strided_set", "index_add", "nn.log_softmax_grad", "nn.softmax_grad"):
        return MAKERS[name](call, into=True) if i == 0 else None
    if name not in BINARY and name not in UNARY and name != "nn.relu" or _float_args(call) is None:
        return None
    if not _same_type(call.args[i].checked_type, call.checked_type):
        return None
    _load()
    if name == "nn.relu":
        return lambda x, attrs=None: x.clamp_min_(0.0)
    if name in UNARY:
        f = getattr(torch, UNARY[name])
        return lambda x, attrs=None: f(x, out=x)
    f = getattr(torch, BINARY[name])
    if i == 0:
        return lambda a, b, attrs=None: f(a, b, out=a)
    return lambda a, b, attrs=None: f(a, b, out=b)


__all__ = ["fast_kernel", "allocates", "allocates_first", "inplace_kernel", "autocast_off"]
