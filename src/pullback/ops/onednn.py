"""oneDNN's inner product for the torch kernels' float32 and bfloat16 GEMMs (``mkldnn._linear_pointwise``, what
Inductor calls; bfloat16: ``bfloat16_linear``).

float32 (``float32_linear``): on CPUs that MKL does not tune for, oneDNN runs GEMMs about twice as fast as MKL's
sgemm, which ``torch.mm`` and eager PyTorch call (an AMD EPYC, 2 cores, torch 2.13: 465 against 202 GFLOP/s;
1024 x 256 x 1024: 1.12 against 2.53 ms), rows of other strides too (a weight gradient's transposed dY: oneDNN
reorders them itself, faster than a copy first: 1.54 against 2.71 ms), and adds a bias as it writes the rows. On
Intel CPUs MKL is at its best and oneDNN is not faster (a Xeon with AMX, 2 cores: 1024 x 256 x 1024 1.44 against
1.49 ms, 0.9-0.95x MKL's speed on the other forward GEMMs of a ViT, 0.55-0.75x on its weight gradients' strided
rows): there the torch kernels keep MKL, as eager does. The choice is made once per process from the CPU's
vendor, not by timing, so a program's float32 results do not depend on how busy the machine was.

Where oneDNN is used, it loses where its per-call cost (~12 us against MKL's ~4) or its reordering outweighs the
GEMM: small GEMMs (M * K * N under ``MIN_MACS``; K = 0 has no primitive at all) and strided rows making a small
result (under ``MIN_STRIDED_OUT`` elements: a 32 x 32 weight's gradient over 4096 rows, 0.10 against 0.05 ms).
Where the row count is not known (a dynamic batch), a weight of ``MIN_WEIGHT`` elements decides. ``MIN_MACS`` is
measured as a training step meets its GEMMs, the weight and often the rows cold in the caches (each touched once
a forward or backward): with 64 MB written between calls (AMD EPYC, 2 threads, torch 2.13), oneDNN with a bias
takes 1.2-1.56x MKL's ``addmm`` time at 2^22-2^23 multiply-adds (128 x 128 x 512: 285 against 182 us; warm, both
take ~120 us), 0.94-1.10x at 2^26, 0.77-0.93x from 2^27 up. In a ConvNeXt's training step (hidden 32-256,
GEMMs of 2^23 multiply-adds) its GEMMs took 5.4 ms a step through oneDNN and 4.7-4.9 through MKL (eager's: 4.5-4.8);
in a transformer layer's (2^26-2^28), 24.8 through oneDNN and 29.4 through MKL. ``bench/experiments/gemm_crossover.py``
measures the crossover on a machine.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

MIN_MACS = 1 << 24
MIN_WEIGHT = 256 * 256
MIN_STRIDED_OUT = 128 * 128


@lru_cache(maxsize=1)
def _linear_op():
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def linear() -> Optional[Callable]:
    """``fn(rows, weight, bias, "none", [], "")`` = ``rows @ weight.T (+ bias)`` on CPU tensors, or None."""
    return _linear_op()


def float32_linear() -> Optional[Callable]:
    """``linear()`` where the torch kernels' float32 GEMMs go to oneDNN (``prefers_onednn``), else None."""
    return linear() if _float32_preferred() else None


def prefers_onednn(vendor: str, mkl: bool) -> bool:
    """Does oneDNN beat eager's float32 GEMMs on a CPU of ``vendor`` (``/proc/cpuinfo``'s ``vendor_id``)? Not
    where torch's BLAS is MKL on an Intel CPU (module docstring)."""
    return not (mkl and vendor == "GenuineIntel")


def cpu_vendor() -> str:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``, ...), or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return "GenuineIntel" if "Intel" in platform.processor() else ""


@lru_cache(maxsize=1)
def _float32_preferred() -> bool:
    import torch

    return prefers_onednn(cpu_vendor(), torch.backends.mkl.is_available())


def bfloat16_linear() -> Optional[Callable]:
    """``linear()`` where this CPU runs oneDNN's bfloat16 inner product natively (AVX512-BF16, AMX), else None.
    There it is what eager's ``F.linear`` / ``addmm`` compute in bfloat16, bit for bit, the bias added in its
    epilogue (one rounding), and as fast as ``torch.mm`` or faster at every size measured (1024 x 256 x 1024 with
    the bias: 554 against 614 us for ``mm`` and an in-place add); but 1.6-2.5x slower on rows of other strides (a
    weight gradient's transposed dY), which it is therefore not given (``takes_contiguous_rows``)."""
    return linear() if _native_bfloat16() else None


@lru_cache(maxsize=1)
def _native_bfloat16() -> bool:
    import torch

    return _linear_op() is not None and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def takes_contiguous_rows(x, n: int) -> bool:
    """Rows oneDNN's bfloat16 inner product takes: contiguous CPU data."""
    return x.is_cpu and x.is_contiguous()


def big(k, n, m=None) -> bool:
    """Is a GEMM of ``m`` rows, inner size ``k`` and ``n`` outputs a row large enough for oneDNN (static ints; ``m``
    not an int: by the weight's size)?"""
    if not (isinstance(k, int) and isinstance(n, int)):
        return False
    return m * k * n >= MIN_MACS if isinstance(m, int) else k * n >= MIN_WEIGHT


def takes_rows(x, n: int) -> bool:
    """Rows oneDNN takes as they are, for ``n`` outputs a row: CPU data, contiguous (an N-D batch of rows), or
    a matrix of other strides making a result of ``MIN_STRIDED_OUT`` elements or more."""
    if not x.is_cpu:
        return False
    return x.is_contiguous() or x.ndim == 2 and x.shape[0] * n >= MIN_STRIDED_OUT


def rows_times_t(a, b):
    """``a @ b.T`` for matrices (torch tensors): oneDNN's inner product for float32 operands where it is faster
    (``big``, ``takes_rows``), else ``torch.mm``."""
    k, n = a.shape[1], b.shape[0]
    if a.dtype == b.dtype and str(a.dtype) == "torch.float32" and big(k, n, a.shape[0]) and takes_rows(a, n):
        f = float32_linear()
        if f is not None:
            return f(a, b, None, "none", [], "")
    return a @ b.T


__all__ = ["MIN_MACS", "MIN_WEIGHT", "MIN_STRIDED_OUT", "linear", "float32_linear", "prefers_onednn", "cpu_vendor",
           "bfloat16_linear", "big", "takes_rows", "takes_contiguous_rows", "rows_times_t"]
