"""How FirstOrderGradient, print, parse and build+run scale with If nesting depth (issue 15).

Workload: ``h = If(c, add(h, multiply(exp(tanh(h)), 0.01)), sin(x))`` repeated
``depth`` times, each If inside the then-branch of the next (nesting depth
``depth``; x of shape (3,)); the backward of every level reads residuals
(``exp``, ``tanh`` and the inner If's result), so the If residual scheme is
exercised at every level.

Columns, CPU seconds for each depth (the machine may be shared), then
microseconds per level and the ratio of that per-level time to the previous
row's (1.0: linear; 2.0 per doubling of the depth: quadratic):

- ``AD``: ``FirstOrderGradient`` on the typed module; ``scopes``: of which
  ``ir.scope.ScopeInfo`` on the forward body (AD builds it once);
- ``print`` / ``parse``: ``astext`` of the forward module, ``parse`` of that text;
- ``run``: ``build`` on numpy plus one call (c true: every level runs);
- ``grad run``: the same for the gradient function.

A column whose last time exceeded ``--budget`` / 4 seconds is not measured at
larger depths (``-``); an error is shown as ``err`` and listed under the table.

    .venv/bin/python bench/nested_if.py [--depths 500,1000,2000,4000,8000] [--budget 120]
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

import pullback as pb
from pullback import op
from pullback.analysis import infer_module
from pullback.ir.expr import Function, If
from pullback.ir.scope import ScopeInfo
from pullback.transform import FirstOrderGradient

COLUMNS = ("AD", "scopes", "print", "parse", "run", "grad run")


def nested(depth: int) -> pb.IRModule:
    c, x = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(3,))
    h = x
    for _ in range(depth):
        h = If(c, op.add(h, op.multiply(op.exp(op.tanh(h)), pb.const(0.01))), op.sin(x))
    return pb.IRModule.from_expr(Function([c, x], h))


def seconds(fn):
    gc.collect()
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def measure(depth: int, skip: set, errors: list) -> dict:
    """Seconds per column for ``depth`` (None: skipped or failed)."""
    mod = nested(depth)
    infer_module(mod)
    args = (np.array(True), np.linspace(-1, 1, 3).astype("float32"))
    steps = {
        "AD": lambda: FirstOrderGradient()(mod),
        "scopes": lambda: ScopeInfo(mod["main"].body),
        "print": lambda: mod.astext(),
        "parse": lambda: pb.parse(out["print"]),
        "run": lambda: pb.build(mod)["main"](*args),
        "grad run": lambda: pb.build(out["AD"])["main_grad"](*args),
    }
    needs = {"parse": "print", "grad run": "AD"}
    out: dict = {}
    times: dict = {}
    for name in COLUMNS:
        if name in skip or (name in needs and out.get(needs[name]) is None):
            times[name] = None
            continue
        try:
            out[name], times[name] = seconds(steps[name])
        except Exception as e:  # a benchmark reports failures, it does not stop at them
            out[name] = times[name] = None
            skip.add(name)
            errors.append(f"{name} at depth {depth}: {type(e).__name__}: {str(e)[:200]}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="500,1000,2000,4000,8000")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds one measurement may take (about)")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    print(__doc__.split("\n\n")[1].replace("\n", " "))
    head = f"{'depth':>6} " + " ".join(f"{c + ' s':>9} {'us/lvl':>7} {'ratio':>5}" for c in COLUMNS)
    print("CPU seconds; us/lvl: microseconds per nesting level; ratio: us/lvl over the previous row's")
    print(head)
    print("-" * len(head))
    skip: set = set()
    errors: list = []
    prev: dict = {}
    for depth in depths:
        times = measure(depth, skip, errors)
        cells = []
        for c in COLUMNS:
            t = times[c]
            if t is None:
                cells.append(f"{'err' if any(e.startswith(c + ' at depth ' + str(depth)) for e in errors) else '-':>9} {'':>7} {'':>5}")
                continue
            per = 1e6 * t / depth
            ratio = f"{per / prev[c]:5.2f}" if c in prev else f"{'':>5}"
            prev[c] = per
            cells.append(f"{t:9.3f} {per:7.0f} {ratio}")
            if t > args.budget / 4:
                skip.add(c)
        print(f"{depth:>6} " + " ".join(cells), flush=True)
    for e in errors:
        print("error:", e)


if __name__ == "__main__":
    main()
