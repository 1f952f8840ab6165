"""Passes at scale, without recursion: a 1,000,000-node chain and a 100,000-wide fan-out
through FirstOrderGradient, standard_cleanup, FuseOps and the executor; memory linear in
program size (the growth of the peak resident memory of a process, 50k-node program vs 25k)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback import transform as T


def chain(n: int) -> pb.IRModule:
    x = pb.var("x", shape=(2,))
    e = x
    for _ in range(n):
        e = op.negative(e)
    return pb.IRModule.from_expr(pb.Function([x], e))


def fan_out(n: int) -> pb.IRModule:
    """``x`` used by ``n`` multiplies with distinct constants, summed by a chain of adds."""
    x = pb.var("x", shape=(2,))
    acc = op.multiply(x, pb.const(0.0))
    for i in range(1, n):
        acc = op.add(acc, op.multiply(x, pb.const(float(i % 7) / 7.0 + i * 1e-9)))
    return pb.IRModule.from_expr(pb.Function([x], acc))


def through_passes(mod: pb.IRModule):
    g = T.FirstOrderGradient()(mod)
    g = T.standard_cleanup()(g)
    return T.FuseOps()(g) if hasattr(T, "FuseOps") else g


@pytest.mark.slow
def test_million_node_chain_through_passes_and_executor():
    n = 1_000_000
    out = through_passes(chain(n))
    x = np.array([1.0, -2.0], "float32")
    value, (dx,) = pb.build(out)["main_grad"](x)
    np.testing.assert_array_equal(value, x)  # n is even
    np.testing.assert_array_equal(dx, np.ones(2, "float32"))


@pytest.mark.slow
def test_hundred_thousand_wide_fan_out():
    n = 100_000
    mod = fan_out(n)
    out = through_passes(mod)
    x = np.array([1.0, -2.0], "float32")
    value, (dx,) = pb.build(out)["main_grad"](x)
    coeffs = np.array([0.0] + [float(i % 7) / 7.0 + i * 1e-9 for i in range(1, n)], "float32")
    want = float(coeffs.astype("float64").sum())
    np.testing.assert_allclose(dx, np.full(2, want), rtol=1e-3)
    np.testing.assert_allclose(value, x * want, rtol=1e-3)


_MEASURE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    from test_scale_passes import chain, through_passes

    def kb(field):  # resident now / at the peak
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field))

    before = kb("VmRSS:")
    out = through_passes(chain({n}))
    print(kb("VmHWM:") - before)
""")


def _peak_kb(n: int) -> int:
    """Growth (kB) of a fresh process's peak resident memory over its resident memory before an ``n``-node chain
    is built and goes through the passes (Linux): Python's objects and NumPy's arrays alike."""
    import pathlib

    code = _MEASURE.format(here=str(pathlib.Path(__file__).parent), n=n)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=900)
    return int(res.stdout.split()[-1])


@pytest.mark.slow
def test_memory_is_linear_in_program_size():
    small, large = _peak_kb(25_000), _peak_kb(50_000)
    assert small > 5000
    assert large < 3 * small, f"peak memory grew by {small} kB for 25k nodes, {large} kB for 50k nodes"
