"""The main job (``make demo``): build a model, show it, type it, run it."""

from __future__ import annotations

import time

import numpy as np

from .analysis import infer_module
from .ir.printer import astext
from .runtime import build
from .testing.models import mlp


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 68 - len(title)))


def run_demo(torch: bool = False, steps: int = 3) -> int:
    """Run the demo; returns a process exit code."""
    mod, make_inputs = mlp()
    _section("a small MLP written with pullback ops")
    infer_module(mod)
    print(astext(mod))
    inputs = make_inputs(0)
    exe = build(mod)
    t0 = time.perf_counter()
    loss = exe["main"](*inputs)
    dt = time.perf_counter() - t0
    ref = inputs[0]
    for w in inputs[1:]:
        ref = np.tanh(ref @ w.T)
    ref = ref.sum()
    _section("run on the NumPy executor")
    print(f"loss = {float(loss):.6f}   (NumPy reference {float(ref):.6f}, {dt * 1e3:.2f} ms)")
    if not np.allclose(loss, ref, rtol=1e-5, atol=1e-5):
        print("MISMATCH against the NumPy reference")
        return 1
    return 0
