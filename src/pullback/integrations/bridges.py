"""How the PyTorch integration runs ``@main_fwd`` / ``@main_bwd`` on each target, from torch tensors to torch tensors.

A ``Bridge`` takes the autograd Function's tensors to the target, runs the executables and hands torch
tensors back; the residuals stay the target's own arrays between forward and backward:

- ``torch``: no conversion at all: the kernels run on the tensors themselves (ATen, oneDNN); the residuals
  are the tensors the forward produced, handed to the backward's plan, which frees each after its last reader
  (eager frees each autograd node's saved tensors after it runs; kept to the end, BERT-base's residuals and its
  weight gradients made the backward's peak 1.6x eager's), their versions checked as autograd checks saved
  tensors; under a ``saved_tensors_hooks`` context (``save_on_cpu``) they go through ``ctx.save_for_backward``
  so that the hooks see each;
- ``numpy``: zero-copy views both ways (``Tensor.numpy()`` / ``torch.from_numpy``; a read-only or
  non-contiguous result is copied once, a tensor cannot be read-only); built with ``aten=True``: GEMMs,
  convolutions, pooling and batch norm run ATen's kernels on the arrays (``runtime.aten_on_numpy``);
- ``jax``: DLPack both ways (``jnp.from_dlpack`` / ``torch.from_dlpack``), residuals kept as jax arrays.

Around each program run, the cores change hands (``runtime.tuning.CoreHandover``): NumPy's OpenBLAS
workers exit after it (numpy target), PyTorch's idle OpenMP workers before it (jax target), so neither
pool's spinning workers slow the other side's next calls (the optimizer's update, the next forward).

The forward's inputs are checked against ``@main_fwd``'s parameters like every executable's, with a fast
path: tensors on the CPU whose shapes and dtypes are the (static) parameters' own go straight to the
target's ``take``; the backward's residuals are the forward's own results and go in unchecked
(``CompiledFunction.call_native(check=False)``).
"""

from __future__ import annotations

from bisect import bisect_right
from operator import methodcaller
from typing import Optional, Sequence

import numpy as np

from ..ir.types import TensorType, is_inexact
from ..runtime import build
from ..runtime.tuning import CoreHandover
from ..runtime.values import numpy_tensor, tensor_numpy


def version(t) -> Optional[int]:
    """A tensor's version counter (bumped by every in-place write); None for anything else and for inference
    tensors, which have none."""
    try:
        return t._version
    except (AttributeError, RuntimeError):
        return None


_STORAGE = methodcaller("untyped_storage")


def unshared(tensors: list) -> list:
    """``tensors`` with each one that starts at the memory of an earlier one copied: a program may give one value
    as two gradients (an LSTM's two biases); autograd would accumulate each parameter's next gradient in place
    into the memory of both."""
    seen = set()
    for i, t in enumerate(tensors):
        p = t.data_ptr()
        if p in seen and t.numel():
            tensors[i] = t.clone()
        seen.add(p)
    return tensors


class Bridge:
    """Runs built ``@main_fwd`` / ``@main_bwd`` of one target on torch tensors.

    ``out_types``: the types of the forward's flat outputs (their cotangents' types);
    ``single``: the program returns one tensor (else a tuple); ``inert``: the outputs whose cotangents the
    backward never propagates (their zeros are made once and reused)."""

    saves_tensors = False  # residuals are torch tensors (ctx.save_for_backward) rather than other arrays
    handover: Optional[CoreHandover] = None  # what the cores do at the crossings (None: nothing)
    build_options: dict = {}  # the target's options of ``build`` in the integration

    def __init__(self, fwd, bwd, out_types: Sequence, single: bool, inert: Sequence[int] = ()):
        import torch

        self.torch = torch
        self.inert = frozenset(inert)
        self.inert_zeros: dict = {}
        self.fwd, self.bwd = fwd, bwd
        self.single = single
        self.out_dtypes = [t.dtype for t in out_types]
        self.torch_dtypes = [getattr(torch, d) for d in self.out_dtypes]
        self.expected = _expected(torch, [p.checked_type for p in fwd.params])
        self.take = fwd._exe.target.take

    def forward(self, tensors: Sequence) -> tuple[list, tuple]:
        """``(outputs, residuals)``: the flat outputs as torch tensors, the residuals as the target keeps them."""
        out, res = self.call(tensors)
        return self.outputs(out), res

    def infer(self, tensors: Sequence) -> list:
        """The flat outputs as torch tensors, where ``fwd`` is a program without residuals (``@main``; a gradient
        program of ``higher_order``: its gradients each in memory of their own, ``unshared``)."""
        return unshared(self.outputs(self.call(tensors)))

    def call(self, tensors: Sequence):
        """``fwd``'s result on the torch tensors ``tensors``."""
        want = self.expected
        if want is not None and len(tensors) == len(want) and all(
                t.shape == s and t.dtype == d and t.is_cpu for t, (s, d) in zip(tensors, want)):
            take = self.take
            return self.run(self.fwd, [take(t) for t in tensors], check=False)
        return self.run(self.fwd, tensors, check=True)  # checked: the error says which input is wrong

    def outputs(self, out) -> list:
        return [self.to_torch(o) for o in ([out] if self.single else out)]

    def backward(self, residuals: Sequence, grads: Sequence, shapes: Sequence, consume: bool = False) -> list:
        """The gradients (torch tensors, one per ``wrt``) from the residuals and the outputs' gradients
        (None for an output that got none, and past the end of ``grads`` for the written-back values: zeros of
        its ``shapes`` entry). ``consume``: ``residuals`` is a list the caller gives up, emptied once the plan holds
        its values, so that each is freed after its last reader (``CompiledFunction.call_native``)."""
        grads = (*grads, *[None] * (len(shapes) - len(grads)))
        cts = [self.cotangent(g, i, s) if g is not None or i not in self.inert else self.inert_zero(i, s)
               for i, (g, s) in enumerate(zip(grads, shapes))]
        ct = cts[0] if self.single else tuple(cts)
        if consume:
            residuals.append(ct)
            args = residuals
        else:
            args = [*residuals, ct]
        gs = self.run(self.bwd, args, check=False, consume=consume)
        return unshared([self.to_torch(g) for g in gs])

    def run(self, fn, args: Sequence, check: bool, consume: bool = False):
        """``fn.call_native(args, check, consume)``, the cores handed over before and after."""
        h = self.handover
        if h is None:
            return fn.call_native(args, check=check, consume=consume)
        h.enter()
        try:
            return fn.call_native(args, check=check, consume=consume)
        finally:
            h.leave()

    def inert_zero(self, i: int, shape):
        key = (i, tuple(shape))
        z = self.inert_zeros.get(key)
        if z is None:
            z = self.inert_zeros[key] = self.cotangent(None, i, shape)
        return z

    def unalias(self, residuals: Sequence, mutated: Sequence) -> tuple:
        """``residuals`` with a copy of each one whose memory lies in one of the ``mutated`` tensors'. Plain
        Python (bisect over the storages' spans): it runs right after the forward's kernels, whose memory traffic
        has evicted the interpreter's caches, and there each NumPy call cost ~25 us (a ResNet's 125 residuals
        against 60 buffers: 250 us through NumPy, 115 us so)."""
        spans = sorted({(p, p + s.nbytes()) for s in map(_STORAGE, mutated) if (p := s.data_ptr())})
        if not spans:  # nothing but empty storages
            return tuple(residuals)
        starts = [p for p, _ in spans]
        hits = [k for k, at in enumerate(self.addresses(residuals))
                if (j := bisect_right(starts, at) - 1) >= 0 and at < spans[j][1]]
        if not hits:
            return tuple(residuals)
        out = list(residuals)
        for k in hits:
            out[k] = self.copy(out[k])
        return tuple(out)

    def addresses(self, residuals: Sequence) -> list:
        """The address of each residual's first element; 0 for one that cannot alias a tensor."""
        return [0] * len(residuals)

    def viewed(self, residuals: Sequence) -> tuple:
        """The caller's tensors whose memory residuals of this target view without autograd knowing (a
        tensor written in place before the backward would change them): ``(tensor, version)`` pairs."""
        return ()

    def copy(self, value):
        return value

    def cotangent(self, g, i: int, shape):
        """The gradient of output ``i`` as the target's value of the output's dtype."""
        raise NotImplementedError

    def to_torch(self, value):
        """A result of the target as a torch tensor."""
        raise NotImplementedError


def _expected(torch, types: Sequence) -> Optional[list]:
    """``(torch.Size, torch dtype)`` per parameter type, or None when one is not a static tensor type."""
    out = []
    for t in types:
        dtype = getattr(torch, t.dtype, None) if isinstance(t, TensorType) else None
        if not isinstance(dtype, torch.dtype) or not t.is_static:
            return None
        out.append((torch.Size(t.shape), dtype))
    return out


def _detached_if_tracked(t):
    """``t``, or ``t.detach()`` where it requires grad: no kernel records a graph, and none sees
    ``requires_grad`` (``torch.matmul`` folds a batch of rows into one GEMM for a weight that requires grad: other
    bits than eager's). A detach costs 0.3-1 us: a LeViT passes 338 tensors, half of them buffers."""
    return t.detach() if t.requires_grad else t


class TorchBridge(Bridge):
    """The torch target: tensors in, tensors out, no conversion."""

    saves_tensors = True

    def __init__(self, fwd, bwd, out_types: Sequence, single: bool, inert: Sequence[int] = ()):
        super().__init__(fwd, bwd, out_types, single, inert)
        if fwd._exe.target.device.type == "cpu":  # ``call`` checked that the tensors are CPU ones: no conversion
            self.take = _detached_if_tracked

    def cotangent(self, g, i: int, shape):
        dtype = self.torch_dtypes[i]
        if g is None or not is_inexact(self.out_dtypes[i]):
            return self.torch.zeros(shape, dtype=dtype)
        return g if g.dtype == dtype else g.to(dtype)

    @staticmethod
    def to_torch(value):
        return value

    @staticmethod
    def viewed(residuals: Sequence) -> tuple:
        # kept out of autograd (``ctx.residuals``), every residual is checked as autograd checks saved tensors
        return tuple((r, v) for r in residuals if (v := version(r)) is not None)

    @staticmethod
    def addresses(residuals: Sequence) -> list:
        return [r.data_ptr() for r in residuals]  # an empty one inside a span is copied: harmless

    @staticmethod
    def copy(value):
        return value.clone()


class NumpyBridge(Bridge):
    """The numpy target: zero-copy views of the tensors' memory; GEMMs, convolutions, pooling and batch norm
    run ATen's kernels on them (``runtime.aten_on_numpy``), so one thread pool (PyTorch's) serves the step."""

    handover = CoreHandover(openmp=False, blas=True)
    build_options = {"aten": True}

    def cotangent(self, g, i: int, shape):
        dtype = self.out_dtypes[i]
        if g is None or not is_inexact(dtype):
            return np.zeros(shape, dtype)
        return tensor_numpy(g.detach().resolve_conj()).astype(dtype, copy=False)

    @staticmethod
    def addresses(residuals: Sequence) -> list:
        return [r.ctypes.data if isinstance(r, np.ndarray) and r.size else 0 for r in residuals]

    @staticmethod
    def copy(value):
        return np.array(value)

    @staticmethod
    def viewed(residuals: Sequence) -> tuple:
        # a NumPy view of a tensor's memory (``Tensor.numpy()``) has at the end of its bases a torch tensor that
        # shares the version counter of the caller's tensor; the kernels' own arrays end in an ndarray or None
        out = []
        for r in residuals:
            while isinstance(r, np.ndarray):
                r = r.base
            if r is not None and (v := version(r)) is not None:
                out.append((r, v))
        return tuple(out)

    def to_torch(self, value):
        a = np.asarray(value)
        if not a.flags.writeable or not a.flags.c_contiguous:
            a = np.array(a, copy=True)
        return numpy_tensor(self.torch, a)


class JaxBridge(Bridge):
    """The jax target: DLPack both ways; residuals stay jax arrays (results of XLA: they never alias an input,
    so ``unalias`` has nothing to copy)."""

    handover = CoreHandover(openmp=True, blas=False)

    def __init__(self, fwd, bwd, out_types: Sequence, single: bool, inert: Sequence[int] = ()):
        super().__init__(fwd, bwd, out_types, single, inert)
        import jax

        self.jax = jax
        self.x64 = fwd._exe.x64

    def call(self, tensors: Sequence):
        with self.jax.enable_x64(self.x64):  # int64 inputs stay int64
            return super().call(tensors)

    def backward(self, residuals: Sequence, grads: Sequence, shapes: Sequence, consume: bool = False) -> list:
        with self.jax.enable_x64(self.x64):
            return super().backward(residuals, grads, shapes, consume)

    def cotangent(self, g, i: int, shape):
        import jax.numpy as jnp

        dtype = self.out_dtypes[i]
        if g is None or not is_inexact(dtype):
            return jnp.zeros(shape, dtype)
        t = self.torch_dtypes[i]
        return jnp.from_dlpack(g.detach().to(t).contiguous())

    def to_torch(self, value):
        return self.torch.from_dlpack(value)


BRIDGES = {"torch": TorchBridge, "numpy": NumpyBridge, "jax": JaxBridge}


def build_for(mod, target: str):
    """``mod`` built for ``target`` with the integration's options of that target (``Bridge.build_options``)."""
    return build(mod, target=target, **BRIDGES[target].build_options)


__all__ = ["Bridge", "TorchBridge", "NumpyBridge", "JaxBridge", "BRIDGES", "build_for"]
