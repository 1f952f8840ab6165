"""How printing and parsing scale with If nesting depth (issue 15).

Workload: ``h = If(c, tanh(h), negative(x))`` repeated ``depth`` times, each If
inside the then-branch of the next (x of shape (2,)), so the printed text nests
``depth`` blocks deep. Blocks indent two spaces per level up to 32 levels and no
further, so the text grows linearly (it grew quadratically before: 64 MB at
depth 4000, and depth 20000 did not print in 60 s).

Columns for each depth, CPU seconds (the machine may be shared): text size;
``print`` (``astext``), of which ``scopes`` (``ir.scope.ScopeInfo``, which the
printer uses to place nodes in branches); ``parse``; then microseconds per
level of print and parse, and each over the previous row's (1.0: linear; 2.0 per
doubling of the depth: quadratic). Every row checks the round trip
(``parse(astext(m))`` structurally equal to ``m``).

    .venv/bin/python bench/nesting.py [--depths 1000,2000,4000,8000,20000]
"""

from __future__ import annotations

import argparse
import gc
import time

import pullback as pb
from pullback import op
from pullback.ir.scope import ScopeInfo


def nested(depth: int) -> pb.IRModule:
    x, c = pb.var("x", shape=(2,)), pb.var("c", shape=(), dtype="bool")
    h = x
    for _ in range(depth):
        h = pb.If(c, op.tanh(h), op.negative(x))
    return pb.IRModule.from_expr(pb.Function([x, c], h))


def timed(fn, *args):
    gc.collect()
    t = time.process_time()
    out = fn(*args)
    return out, time.process_time() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="1000,2000,4000,8000,20000")
    args = ap.parse_args(argv)
    print("print / parse of If nested DEPTH deep (CPU seconds; per level: microseconds, ratio to the row above)")
    print(f"{'depth':>6} {'text MB':>8} {'print':>7} {'scopes':>7} {'parse':>7} "
          f"{'print/lvl':>10} {'ratio':>6} {'parse/lvl':>10} {'ratio':>6}")
    prev = None
    for depth in [int(d) for d in args.depths.split(",")]:
        mod = nested(depth)
        text, t_print = timed(pb.astext, mod)
        _, t_scopes = timed(ScopeInfo, mod["main"].body)
        back, t_parse = timed(pb.parse, text)
        pb.assert_structural_equal(back, mod)
        per = (t_print / depth * 1e6, t_parse / depth * 1e6)
        ratios = [f"{p / q:6.2f}" if prev else f"{'':>6}" for p, q in zip(per, prev or per)]
        print(f"{depth:>6} {len(text) / 1e6:>8.2f} {t_print:>7.2f} {t_scopes:>7.2f} {t_parse:>7.2f} "
              f"{per[0]:>10.1f} {ratios[0]} {per[1]:>10.1f} {ratios[1]}", flush=True)
        prev = per


if __name__ == "__main__":
    main()
