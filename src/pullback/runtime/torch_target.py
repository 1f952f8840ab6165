"""The torch target: ``build(mod, target="torch", device=None)``.

Every operator runs ``op.impl("torch")`` (its kernel on array-api-compat's torch
namespace, or a torch override: ATen kernels, oneDNN convolutions on the CPU)
in the shared evaluator (``runtime.evaluator``), on tensors of ``device``
(``"cpu"`` by default, ``"cuda"`` when given one). Inputs are checked like on
every target; NumPy inputs become tensors without a copy when they are writable
(else they are copied: a tensor cannot be read-only), torch tensors are used
as they are (detached, moved to ``device`` if needed). Results are torch
tensors, nested in tuples; like torch's own ``reshape``, a result may share
memory with an input. Fused groups run op by op (as calls). A ``torch.autocast`` region does not reach the
kernels: a program computes in its own dtypes.

torch is imported on first build only (``import pullback`` does not import it).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir.errors import ExecutionError, PullbackError
from ..ir.module import IRModule
from ..ops.registry import FusionKind, array_namespace
from .evaluator import DEFAULT_MAX_CALL_DEPTH, Executable, Target
from .opmath import in_float32, involves_bfloat16, native_or, torch_narrow, torch_widen
from .torch_kernels import allocates, allocates_first, autocast_off, fast_kernel, inplace_kernel
from .values import as_is, numpy_tensor, to_numpy


def _load_torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is a test dependency
        raise PullbackError(f"target 'torch' needs the torch package: {e}") from None
    return torch


class TorchTarget(Target):
    """Kernels on torch tensors of one device."""

    name = "torch"

    def __init__(self, device=None, fast: bool = True):
        torch = self.torch = _load_torch()
        self.fast = self.reuses_buffers = fast
        array_namespace("torch")  # array-api-compat: a clear error here rather than "no kernel" later
        try:
            self.device = torch.device("cpu" if device is None else device)
            torch.empty(0, device=self.device)
        except (RuntimeError, TypeError, AssertionError) as e:  # unknown or unavailable device
            raise ExecutionError(f"target 'torch': cannot use device {device!r}: {e}") from None

    def kernel(self, call):
        """A direct ATen call where the types allow one (``torch_kernels``), else the op's torch kernel.
        On bfloat16 operands, a kernel of several torch calls (the shared one) computes in float32
        (``runtime.opmath``), as one ATen kernel does inside: not an ATen call (fast or the op's torch
        override) nor an operator that only moves data."""
        fast = self.fast and fast_kernel(call)
        if fast:
            return fast
        op = call.op
        if op.pattern == FusionKind.INJECTIVE or op.half_native or not involves_bfloat16(call):
            return op.impl("torch")
        wide = in_float32(op.impl("torch"), call, torch_widen, torch_narrow)
        return wide if "torch" not in op.impls else native_or(op.impl("torch"), wide)

    def allocates(self, call) -> bool:
        return self.fast and allocates(call)

    def allocates_first(self, call) -> bool:
        return self.fast and allocates_first(call)

    def inplace_kernel(self, call, i: int):
        return inplace_kernel(call, i) if self.fast else None

    def run_context(self):
        """Autocast off while the kernels run, when a ``torch.autocast`` region is open (``autocast_off``)."""
        return autocast_off(self.device.type)

    def constant(self, data: np.ndarray):
        return numpy_tensor(self.torch, np.array(data)).to(self.device)  # a copy: the Constant stays intact

    def take(self, arr):
        torch = self.torch
        if isinstance(arr, torch.Tensor):
            t = arr.detach()
        else:
            a = to_numpy(arr)
            if not a.flags.writeable or any(s < 0 for s in a.strides):
                a = np.array(a)  # torch has no read-only tensors nor negative strides
            t = numpy_tensor(torch, a)
        return t if t.device == self.device else t.to(self.device)

    output = staticmethod(as_is)

    @staticmethod
    def fresh(value):
        return value.clone()

    def buffer(self, value) -> Optional[tuple]:
        if not isinstance(value, self.torch.Tensor):
            return None
        storage = value.untyped_storage()
        return storage, storage.nbytes()


class TorchExecutable(Executable):
    """A module built for the torch target; ``exe["main"](*tensors)`` runs a function.

    ``fast=True`` calls ATen directly where the types allow (``runtime.torch_kernels``) and lets an
    elementwise result take a dying operand's tensor (``runtime.plan.buffer_reuse``); ``fast=False``
    runs every operator's own torch kernel into new tensors."""

    def __init__(self, mod: IRModule, check_outputs: bool = False, device=None,
                 max_call_depth: int = DEFAULT_MAX_CALL_DEPTH, fast: bool = True):
        super().__init__(mod, TorchTarget(device, fast), check_outputs, max_call_depth)
        self._check_kernels()

    @property
    def device(self):
        """The torch device the kernels run on."""
        return self.target.device


__all__ = ["TorchExecutable", "TorchTarget"]
