"""RecognizeOps: rewrite the decomposed formula of an operator back into the operator.

An importer sees what a model's Python computed. Hugging Face's ``gelu_new`` (``NewGELUActivation``:
GPT-2, GPT-Neo, T5 v1.1, ...) is ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` in eight
elementwise calls, which an op-by-op executor runs as eight passes over memory forward and about twenty
in the backward. The rule turns it into ``nn.gelu(x, approximate="tanh")``: one kernel forward and one
``nn.gelu_grad`` backward. Each commutative call may take its operands in either order, ``x^3`` may be
``power(x, 3)`` or ``x * x * x``, and each constant is matched to float32 precision (a scalar or any
tensor holding that one value); the match must have ``x``'s type. Attention written out becomes
``nn.attention``, and a softmax of its input less its maximum the softmax of its input. The frontend runs it on
every imported program (``frontend.import_exported``), before differentiation.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..analysis.tracking import tracked_children
from ..ir.expr import Call, Constant, Expr, TupleGetItem, Var
from ..ir.types import FLOAT_DTYPES, Any, TensorType, is_inexact
from ..ops.activation import gelu
from ..ops.attention import attention
from ..ops.elemwise import add
from ..ops.layout import reshape
from ..ops.registry import is_call_to
from ..pattern import is_op, wildcard
from .eliminate_identity import uniform_value
from .fold_constant import fold_expr
from .pass_infra import RewritePass

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _is_value(e: Expr, value: float) -> bool:
    u = uniform_value(e)
    return u is not None and abs(float(u) - value) <= 1e-6 * abs(value)


def _with_constant(e: Expr, name: str, value: float) -> Optional[Expr]:
    """``y`` when ``e`` is ``name(y, value)`` or ``name(value, y)``, else None."""
    if not is_call_to(e, name) or len(e.args) != 2:
        return None
    a, b = e.args
    return a if _is_value(b, value) else (b if _is_value(a, value) else None)


def _is_cube_of(e: Expr, x: Expr) -> bool:
    """``e`` is ``power(x, 3)`` or ``x * x * x`` (either grouping)."""
    if is_call_to(e, "power"):
        return e.args[0] is x and _is_value(e.args[1], 3.0)
    if not is_call_to(e, "multiply"):
        return False
    a, b = e.args
    square = b if a is x else (a if b is x else None)
    return is_call_to(square, "multiply") and square.args[0] is x and square.args[1] is x


def _tanh_gelu_input(node: Call) -> Optional[Expr]:
    """``x`` when ``node`` computes ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, else None."""
    for half, rest in (node.args, node.args[::-1]):
        x = _with_constant(half, "multiply", 0.5)
        t = _with_constant(rest, "add", 1.0) if x is not None else None  # rest = t + 1, t = tanh(...)
        s = _with_constant(t.args[0], "multiply", _SQRT_2_OVER_PI) if is_call_to(t, "tanh") else None
        inner = s if is_call_to(s, "add") else None
        if inner is None or not (inner.args[0] is x or inner.args[1] is x):
            continue
        cube = _with_constant(inner.args[1] if inner.args[0] is x else inner.args[0], "multiply", 0.044715)
        if cube is not None and _is_cube_of(cube, x):
            return x
    return None


def _tanh_gelu(node: Call, c: dict) -> Optional[Expr]:
    x = _tanh_gelu_input(node)
    if x is None or x._checked_type is None or x._checked_type != node._checked_type:
        return None
    return gelu(x, approximate="tanh")


def _unflattened(e: Expr) -> Optional[Expr]:
    """``x`` when ``e`` is ``reshape(x, (-1, m, n))`` of a rank-4 ``x`` (the importer's lowering of a 4-D matmul)."""
    if not is_call_to(e, "reshape"):
        return None
    x = e.args[0]
    t = x._checked_type
    return x if isinstance(t, TensorType) and t.ndim == 4 and tuple(e.checked_type.shape[1:]) == tuple(t.shape[2:]) else None


def _scale_of(scores: Expr) -> tuple:
    """``(s, scale)`` when ``scores`` is ``s * c``, ``c * s`` or ``s / c`` for a constant ``c``; ``(scores, 1.0)``
    otherwise."""
    if is_call_to(scores, "multiply"):
        for s, c in (scores.args, scores.args[::-1]):
            u = uniform_value(c)
            if u is not None and c._checked_type.ndim == 0:
                return s, float(u)
    if is_call_to(scores, "divide") and scores.args[1]._checked_type.ndim == 0:
        u = uniform_value(scores.args[1])
        if u is not None and float(u) != 0.0:
            return scores.args[0], 1.0 / float(u)
    return scores, 1.0


def _scores_of(x: Expr) -> Optional[tuple]:
    """``(qk, scale, biases)`` when ``x`` is the 4-D scores ``qk * scale``, maybe plus an additive mask (``s + mask``
    or ``mask + s``), ``qk`` a 3-D ``batch_matmul`` reshaped to 4-D, maybe with a bias of the 3-D scores added
    before the reshape (Bloom's ALiBi: ``baddbmm(alibi, q, k^T, alpha=scale)``, the mask added after it);
    ``biases`` the additive parts as 4-D tensors (None for a missing one); None otherwise."""
    candidates = [(x, None)]
    if is_call_to(x, "add"):
        candidates += [(x.args[0], x.args[1]), (x.args[1], x.args[0])]
    for s, bias in candidates:
        scores, scale = _scale_of(s)
        if not is_call_to(scores, "reshape"):
            continue
        inner = scores.args[0]
        if is_call_to(inner, "nn.batch_matmul"):
            return inner, scale, [bias]
        if scale != 1.0 or not is_call_to(inner, "add"):
            continue
        for s3, b3 in (inner.args, inner.args[::-1]):
            qk, scale = _scale_of(s3)
            inner_bias = _heads_bias(b3, scores.checked_type)
            if is_call_to(qk, "nn.batch_matmul") and inner_bias is not None:
                return qk, scale, [bias, inner_bias]
    return None


def _heads_bias(b: Expr, scores: TensorType) -> Optional[Expr]:
    """``b``, a bias of the 3-D scores (batch and heads flattened, or 1; ALiBi's (B * H, 1, S)) of their dtype,
    reshaped to the 4-D scores' rank; None when it is not one."""
    t = b.checked_type
    if not (isinstance(t, TensorType) and t.ndim == 3 and t.dtype == scores.dtype and t.is_static and scores.is_static):
        return None
    n, h = scores.shape[0], scores.shape[1]
    lead = (n, h) if t.shape[0] == n * h else (1, 1) if t.shape[0] == 1 else None
    if lead is None or any(d != 1 and d != f for d, f in zip(t.shape[1:], scores.shape[2:])):
        return None
    return reshape(b, lead + tuple(t.shape[1:]))


def _is_bias(bias: Expr, scores: TensorType) -> bool:
    """A rank-4 mask of the scores' dtype that broadcasts to them."""
    t = bias.checked_type
    return isinstance(t, TensorType) and t.ndim == 4 and t.dtype == scores.dtype and \
        all(d == 1 or d == f for d, f in zip(t.shape, scores.shape))


def _learnt(bias: Expr, learnable: frozenset) -> bool:
    """Whether autograd tracks a parameter named in ``learnable`` into ``bias`` (``analysis.tracked_children``: a
    learnt position bias, T5's, Swin's, Inkling's); a walk back from ``bias`` that stops at the first one."""
    stack, seen = [bias], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        t = e.checked_type
        if isinstance(e, Var) and e.name_hint in learnable and isinstance(t, TensorType) and is_inexact(t.dtype):
            return True  # (an integer one, a padding mask, carries no gradient)
        stack.extend(tracked_children(e))
    return False


# the most mask elements evaluated to see what a mask keeps (a 4096-token sequence's)
CAUSAL_CHECK_ELEMENTS = 1 << 24
_FACTS: "weakref.WeakKeyDictionary[Expr, tuple]" = weakref.WeakKeyDictionary()


def causal_mask(mask: Expr, length, keys) -> bool:
    """Whether ``mask``, computed from constants, keeps exactly the lower triangle of each (length, keys) block,
    top-left aligned (``is_causal``'s): a boolean one True there, an additive one 0 there and -inf or the dtype's
    least value elsewhere. Hugging Face's causal mask, which torch.export materialises where eager passes
    ``is_causal`` (flash attention then skips the blocks above the diagonal and reads no mask)."""
    return _mask_facts(mask)[1] == (length, keys)


def keeps_every_key(mask: Expr) -> bool:
    """Whether ``mask``, computed from constants, masks nothing: a boolean one True everywhere, an additive one 0
    everywhere (Hugging Face's bidirectional mask for a batch without padding, which torch.export materialises
    where eager passes none: ViT's). Attention without it is the same, and reads no bias."""
    return _mask_facts(mask)[0]


def _mask_facts(mask: Expr) -> tuple:
    """``(whether it keeps every key, the (length, keys) block whose lower triangle it keeps exactly, or None)``
    of ``mask`` (``_kept``; a broadcast over the batch and heads looked through), evaluated once per mask node:
    one mask, every layer's attention."""
    while is_call_to(mask, "broadcast_to"):
        mask = mask.args[0]
    if mask not in _FACTS:
        keep = _kept(mask)
        if keep is None:
            _FACTS[mask] = (False, None)
        else:
            block = keep.shape[-2:] if keep.ndim >= 2 else None
            triangle = block is not None and bool(np.all(keep == np.tril(np.ones(block, dtype=bool))))
            _FACTS[mask] = (bool(np.all(keep)), block if triangle else None)
    return _FACTS[mask]


def _kept(mask: Expr) -> Optional[np.ndarray]:
    """Where ``mask`` keeps a key, when it is computed from constants (at most ``CAUSAL_CHECK_ELEMENTS``): a
    boolean mask itself; an additive one of 0 and -inf or the dtype's least value, where it is 0; else None."""
    t = mask.checked_type
    if not (isinstance(t, TensorType) and t.is_static) or math.prod(t.shape) > CAUSAL_CHECK_ELEMENTS:
        return None
    folded = fold_expr(mask, max_new_elements=CAUSAL_CHECK_ELEMENTS)
    if not isinstance(folded, Constant):
        return None
    v = folded.data
    if v.dtype == np.bool_:
        return v
    if np.issubdtype(v.dtype, np.floating) and np.all((v == 0) | (v <= np.finfo(v.dtype).min)):
        return v == 0
    return None


def beside_causal(mask: Expr, length, keys, causal: Optional[Callable[[Expr], bool]] = None) -> Optional[Expr]:
    """The boolean mask ``rest`` when ``mask`` keeps the causal triangle and ``rest`` (``causal & rest``, or
    ``where(causal & rest, 0, -inf)``; the triangle as ``causal_mask`` finds it, or as ``causal(part)`` says):
    attention under it is attention with ``is_causal`` under ``rest`` alone, the same bits from ATen's flash
    kernel, which then skips the blocks above the diagonal (Hugging Face's mask over a padded batch under
    torch.export); else None."""
    causal = causal or (lambda part: causal_mask(part, length, keys))
    while is_call_to(mask, "cast") and mask.args[0].checked_type.dtype in FLOAT_DTYPES:  # 0 and -inf stay
        mask = mask.args[0]
    if is_call_to(mask, "where") and uniform_value(mask.args[1]) == 0 and uniform_value(mask.args[2]) == -np.inf:
        mask = mask.args[0]
    elif mask.checked_type.dtype != "bool":
        return None
    if not (is_call_to(mask, "bitwise_and") or is_call_to(mask, "logical_and")):
        return None
    a, b = mask.args
    return b if causal(a) else a if causal(b) else None


def _attention(node: Call, c: dict, learnable: frozenset = frozenset()) -> Optional[Expr]:
    """``softmax(q k^T * scale [+ mask]) v`` (Hugging Face's eager attention: two 4-D ``matmul`` with a softmax
    between, an additive mask or none, no dropout; Bloom's ALiBi added to the flattened scores too) in
    float32/float64 as ``nn.attention``, the masks its bias (none for one that masks nothing, ``keeps_every_key``;
    none and ``is_causal`` for the causal mask, ``causal_mask``; two masks summed): its backward recomputes the
    probabilities instead of keeping them. Not where a mask may be learnt (``_learnt``: it reaches a parameter of
    ``learnable``): its gradient needs the probabilities, which the forward then computes once, as eager does,
    instead of in flash attention and again for the backward. bfloat16 keeps eager's form, so its roundings stay
    eager's. (A row whose mask is -inf everywhere gives 0 where eager's softmax gives NaN.)"""
    if node.attrs.transpose_a or node.attrs.transpose_b or not is_call_to(node.args[0], "reshape"):
        return None
    sm = node.args[0].args[0]
    if not is_call_to(sm, "nn.softmax") or sm.attrs.axis not in (-1, 3) or sm.checked_type.ndim != 4:
        return None
    parts = _scores_of(sm.args[0])
    if parts is None:
        return None
    qk, scale, biases = parts
    if qk.attrs.transpose_a:
        return None
    q, v = _unflattened(qk.args[0]), _unflattened(node.args[1])
    k = _unflattened(qk.args[1])
    if not qk.attrs.transpose_b:  # k^T: transpose(k, (0, 1, 3, 2)) flattened, or the flattened k transposed
        kt = qk.args[1]
        if is_call_to(kt, "transpose") and tuple(kt.attrs.axes) == (0, 2, 1):
            k = _unflattened(kt.args[0])
        else:
            k = k.args[0] if is_call_to(k, "transpose") and tuple(k.attrs.axes) == (0, 1, 3, 2) else None
    if q is None or k is None or v is None:
        return None
    tq, tk, tv = q.checked_type, k.checked_type, v.checked_type
    if tq.dtype not in ("float32", "float64") or not tq.dtype == tk.dtype == tv.dtype or tk.shape != tv.shape or \
            tq.shape[:2] != tk.shape[:2] or tq.shape[3] != tk.shape[3] or Any in tq.shape[2:] + tk.shape[2:]:
        return None
    biases = [b for b in biases if b is not None and not keeps_every_key(b)]
    if any(tq.shape[1] is Any or not _is_bias(b, sm.checked_type) or _learnt(b, learnable) for b in biases):
        return None
    causal = next((b for b in biases if causal_mask(b, tq.shape[2], tk.shape[2])), None)
    biases = [b for b in biases if b is not causal]
    bias = None if not biases else biases[0] if len(biases) == 1 else add(*biases)
    out = TupleGetItem(attention(q, k, v, *([] if bias is None else [bias]), scale=scale, is_causal=causal is not None), 0)
    return reshape(out, tuple(node.checked_type.shape)) if Any not in node.checked_type.shape else None


def _shifted_softmax(node: Call, c: dict) -> Optional[Expr]:
    """``softmax(x - max(x))`` (or ``log_softmax``) over one axis, the maximum kept or detached -> the op on ``x``,
    which subtracts the maximum itself, the same values (``x - m`` rounds as the kernel's own subtraction does,
    and the shifted maximum is 0). Its gradient no longer goes through the maximum: mathematically zero, it cost a
    comparison with the maximum, a count and a division over the whole input (GPT-OSS's attention with sinks: 60
    ms of a 600 ms step at 1024 tokens), as JAX's softmax leaves the maximum out of its gradient."""
    shifted = node.args[0]
    if not is_call_to(shifted, "subtract"):
        return None
    x, m = shifted.args
    if is_call_to(m, "stop_gradient"):
        m = m.args[0]
    t = x.checked_type
    if not (is_call_to(m, "max") and m.args[0] is x and m.attrs.keepdims and not m.attrs.exclude and m.attrs.axis
            and isinstance(t, TensorType) and shifted.checked_type == t):
        return None
    axes = {a % t.ndim for a in m.attrs.axis}
    if axes != {node.attrs.axis % t.ndim}:
        return None
    return node.op(x, axis=node.attrs.axis)


def recognize_rules(learnable: frozenset = frozenset()) -> list:
    """The rewrite table of RecognizeOps (``learnable``: its option)."""
    return [(is_op("multiply")(wildcard(), wildcard()), _tanh_gelu),
            (is_op("nn.softmax", "nn.log_softmax")(wildcard()), _shifted_softmax),
            (is_op("nn.batch_matmul")(wildcard(), wildcard()), functools.partial(_attention, learnable=frozenset(learnable)))]


@dataclass(frozen=True)
class RecognizeOps(RewritePass):
    """Decomposed formulas of operators back into the operators (the tanh form of GELU, attention).
    ``learnable``: names of the parameters whose gradients may be wanted (the importer's: those requiring grad);
    attention whose mask one of them reaches keeps its form."""

    learnable: frozenset = frozenset()
    name = "RecognizeOps"

    def rules(self) -> list:
        return recognize_rules(self.learnable)


__all__ = ["RecognizeOps", "recognize_rules", "causal_mask", "beside_causal", "keeps_every_key"]
