"""ATen's kernels for the NumPy target's heavy operators, on the arrays' own memory (``build(..., aten=True)``).

Where PyTorch is in the process (the PyTorch integration), the numpy target can run its GEMMs,
convolutions, pooling, batch norm, constant padding, maxima and minima, activations and softmaxes (and their
gradients) with PyTorch's CPU kernels (oneDNN, ATen's pooling) on zero-copy views of the NumPy arrays
(``torch.from_numpy`` / ``Tensor.numpy()``), and everything else with NumPy. A result that is not new
memory is handed on as a read-only view, and a later
ATen kernel reads it through a writable view of the same memory (never a copy).

The GEMMs go with the convolutions on purpose: OpenBLAS (NumPy's GEMMs) and PyTorch's OpenMP each keep
a pool of workers that busy-wait after every parallel call, so a program alternating between the two
has each pool's spinning workers steal the cores from the other's. Measured on the 2-core bench machine
(ResNet-18 layout, batch 16, training step through the integration): ATen convolutions and pooling with
NumPy's GEMMs 113-116 ms, the same with ATen's GEMMs too 51 ms, NumPy alone 72 ms.

A ``torch.autocast`` region around a call does not reach the kernels (``torch_kernels.autocast_off``, as on
the torch target). Only calls whose tensors are all float32 or float64 (a loss's targets: integers) take ATen's
kernel, that of the torch target (its
direct ATen call, ``torch_kernels.fast_kernel``, or the operator's torch override); the rest (other dtypes,
a matmul with a ``?`` dimension, operators not listed) run the operator's NumPy kernel.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..ir.expr import Call
from ..ir.types import INT_DTYPES, TensorType, TupleType
from .torch_kernels import fast_kernel
from .values import read_only  # a read-only view: a later ATen kernel reads its memory through a writable one

ATEN_DTYPES = frozenset({"float32", "float64"})
GEMMS = frozenset({"nn.dense", "nn.linear", "nn.matmul", "nn.batch_matmul"})
CONVOLUTIONS = frozenset({"nn.conv2d", "nn.conv2d_bias", "nn.conv2d_transpose", "nn.conv2d_backward_weight"})
# activations, softmaxes and their gradients, one or two passes over memory: ATen runs them on both cores (NumPy
# and the numba loops on one). Measured step against step in one process (NumPy's kernels -> these ATen's): BN-CNN
# 0.89x, transformer layer 0.97x, BERT layer 0.96x, GPT-2 0.97x. Small ones too: in a training step each NumPy call
# runs cold, the ATen kernel before it having evicted the interpreter's and NumPy's own data from the caches (a
# classifier's (32, 10) log-softmax, seven ufunc calls: 124 us in the BN-CNN's step, 11 us in a loop; ATen's
# 17 us), so taking them too made the BN-CNN's step 0.97-0.98x and the transformer's 0.99x. The binary elementwise
# operators stay NumPy's: through ATen, BERT's step took 1.03x (NumPy's run in place in the plan's reused buffers).
# Some NumPy forms are far slower still, on (8, 128, 1024) float32: silu (logaddexp) 14.5 ms, leaky_relu and its
# gradient (where) 4.1 ms, against ATen's 0.07-0.3 ms.
ELEMENTWISE = frozenset({"nn.relu", "nn.threshold_grad", "clip", "nn.clip_grad", "nn.leaky_relu", "nn.leaky_relu_grad",
                         "nn.gelu", "nn.gelu_grad", "nn.silu", "nn.silu_grad", "sigmoid", "nn.softmax", "nn.softmax_grad",
                         "nn.log_softmax", "nn.log_softmax_grad", "nn.softplus", "nn.softplus_grad",
                         "nn.mish", "nn.mish_grad"})
# constant padding (ATen's ``constant_pad_nd``: always new memory, filled on both cores): ResNet-18's single-tap
# weight gradients pad 1 MB to 9.4 MB each (0.52 -> 0.38 ms in the step); its step 0.96-0.99x in one process
PADS = frozenset({"nn.pad"})
# maxima and minima (a masked softmax's row maxima): NumPy's loop checks for NaN element by element, 6.5x ATen's on
# Swin's (256, 3, 16, 16) attention rows (0.62 against 0.09 ms)
EXTREMES = frozenset({"max", "min"})
# the negative log-likelihood and its gradient (integer targets), binary cross-entropy with logits (one kernel where
# NumPy takes eight passes): NumPy's pick, range check and weighted mean took
# ten calls, 130 + 70 us in the BN-CNN's step, cold (ATen's 25 + 36 us; the loss is then eager's bits too)
LOSSES = frozenset({"nn.nll_loss", "nn.nll_loss_grad", "nn.binary_cross_entropy_with_logits"})
# attention (ATen's flash kernel): NumPy's batched GEMMs beside ATen's would have the two thread pools fight
ATTENTION = frozenset({"nn.attention", "nn.attention_grad"})
# a mixture of experts' grouped GEMMs (integer offsets): NumPy's BLAS between ATen's kernels fought its thread pool,
# 6-22 ms a call where ATen's mm takes 1-3 (Mixtral's training step on this target: 3.1x eager's -> 1.04x)
GROUPED = frozenset({"nn.grouped_matmul", "nn.grouped_transpose_matmul"})
# layer norm over the last axis and its gradient (ATen's fused kernels, on both cores): NumPy's are numba's, whose
# import and cached machine code cost the first call of a program 0.4-1.2 s (first step through the integration:
# transformer layer 2.00 -> 0.76 s, BERT layer 0.95 -> 0.55 s); the steps within the noise (in one process, steps
# alternating with eager's: transformer layer 1.029-1.049x with numba's kernels, 1.038-1.071x with ATen's; BERT 1.036
# and 1.031x)
NORMS = frozenset({"nn.layer_norm", "nn.native_layer_norm", "nn.layer_norm_grad", "nn.native_layer_norm_grad"})
# an embedding's gradient (``index_add`` of rows at integer positions): ATen's ``index_add`` (eager's embedding
# backward's sums, on both cores) where NumPy's is a numba loop, whose import and cached machine code cost the first
# call of a program ~0.6 s (GPT-2's first step through the integration 2.2-2.6 -> 1.6-1.7 s)
INDEXING = frozenset({"index_add"})
# bilinear resizing and its gradient (a U-Net's decoder): ATen's kernels on both cores, where NumPy's are four
# gathers and blends forward and four scatters backward, each one pass over memory
RESIZING = frozenset({"image.resize2d", "image.resize2d_grad"})
# recurrent layers and their gradients: eager's kernels (oneDNN's fused LSTM layer, ATen's GRU and RNN), where
# NumPy's kernels loop over the steps; the forward's graph kept for the gradient while the array of its hidden
# states lives (``ops.rnn.tie``)
LAYERS = frozenset({"nn.lstm", "nn.gru", "nn.rnn"})
RECURRENT = LAYERS | {f"{name}_grad" for name in LAYERS}
ATEN_OPS = (GEMMS | CONVOLUTIONS | ELEMENTWISE | PADS | EXTREMES | LOSSES | ATTENTION | GROUPED | NORMS | INDEXING | RESIZING
            | RECURRENT
            | frozenset({
    "nn.max_pool2d", "nn.max_pool2d_grad", "nn.max_pool2d_gather", "nn.avg_pool2d", "nn.avg_pool2d_grad", "nn.adaptive_avg_pool2d",
    "nn.adaptive_avg_pool2d_grad", "nn.batch_norm", "nn.batch_norm_grad", "nn.native_batch_norm", "nn.native_batch_norm_grad"}))
# operators whose ATen kernel always returns new memory, shared with no other value
ALLOCATING = GEMMS | CONVOLUTIONS | ELEMENTWISE | PADS | EXTREMES | GROUPED | INDEXING | RESIZING | {"nn.layer_norm"}


def _float_tensors(t) -> bool:
    if isinstance(t, TensorType):
        return t.dtype in ATEN_DTYPES
    return isinstance(t, TupleType) and all(_float_tensors(f) for f in t.fields)


def _aten_operand(call: Call, t) -> bool:
    """An operand ATen's kernel takes: a float32/float64 tensor, or a loss's integer targets, grouped GEMM's
    offsets or ``index_add``'s positions."""
    return _float_tensors(t) or (call.op.name in LOSSES | GROUPED | INDEXING and isinstance(t, TensorType)
                                 and t.dtype in INT_DTYPES)


def takes(call: Call) -> bool:
    """Does ``call`` run ATen's kernel on this target (a listed operator on float32/float64 tensors, with a
    torch kernel of its own)?"""
    return _torch_kernel(call) is not None


def _last_axis(call: Call) -> bool:
    """Does a layer norm (or its gradient) normalise its first operand's last axis, as ATen's fused kernel does?"""
    rank = len(call.args[0].checked_type.shape)
    return rank > 0 and call.attrs.axis % rank == rank - 1


def _torch_kernel(call: Call) -> Optional[Callable]:
    out = call.checked_type
    if not (call.op.name in ATEN_OPS and _float_tensors(out) and all(_aten_operand(call, a.checked_type) for a in call.args)):
        return None
    if call.op.name in PADS and call.attrs.pad_mode != "constant":  # the others: not ATen's, maybe not new memory
        return None
    if call.op.name in NORMS and not _last_axis(call):  # (the data or its gradient first, of one shape)
        return None
    # the direct ATen call or the operator's torch override, not the shared kernel: no array-api-compat needed
    return fast_kernel(call) or call.op.impls.get("torch")


def as_tensor(torch, a: np.ndarray):
    """A tensor on ``a``'s memory: a read-only array (an input, a view of one) through a writable view of
    the same memory (ATen's kernels never write into their operands); a copy where no view can be made
    (memory that is read-only at its source, negative strides); a NumPy scalar as a 0-d tensor."""
    if not isinstance(a, np.ndarray):
        a = np.array(a)
    elif not a.flags.writeable:
        v = a.view()
        try:
            v.flags.writeable = True
            a = v
        except ValueError:  # read-only at its source
            a = np.array(a)
    try:
        return torch.from_numpy(a)
    except ValueError:  # negative strides
        return torch.from_numpy(np.ascontiguousarray(a))


def aten_kernel(call: Call) -> Optional[Callable]:
    """``fn(*arrays, attrs)`` running ``call`` with ATen's kernel on NumPy arrays, or None (not ``takes``)."""
    fn = _torch_kernel(call)
    if fn is None:
        return None
    import torch

    if call.op.name in ALLOCATING:
        def run(*args):
            *arrays, attrs = args
            return fn(*[as_tensor(torch, a) for a in arrays], attrs).numpy()

        return run

    def run_read_only(*args):
        # a result may be a view (a global pool's gradient broadcasts its input): read-only, as views are here
        *arrays, attrs = args
        out = fn(*[as_tensor(torch, a) for a in arrays], attrs)
        return tuple(read_only(o.numpy()) for o in out) if isinstance(out, tuple) else read_only(out.numpy())

    if call.op.name in LAYERS:  # the layer's graph kept for the gradient while its y's array lives
        from ..ops.rnn import tie

        def run_taped(*args):
            *arrays, attrs = args
            out = fn(*[as_tensor(torch, a) for a in arrays], attrs)
            results = tuple(read_only(o.numpy()) for o in out)
            tie(out[0], results[0])
            return results

        return run_taped
    return run_read_only


__all__ = ["ATEN_OPS", "takes", "aten_kernel", "as_tensor"]
