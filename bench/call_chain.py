"""How FirstOrderGradient scales with a chain of calls (issue 15: linear cost on hostile shapes).

Workload: ``@f1 -> @f2 -> ... -> @fn``, each ``f_k(x) = f_{k+1}(0.5 x) + x`` and ``f_n = tanh``, ``@main``
sums ``f1(x)`` (x of shape (3,)). AD inlines the calls first: top-down, each body once per call site
(inlining every function bottom-up copied each callee's inlined body into its caller: 2,000 functions
took 21 s of CPU). Columns: CPU seconds of FirstOrderGradient (the machine may be shared), microseconds
per function and its ratio to the previous row (1.0: linear; 2.0 per doubling: quadratic).

    .venv/bin/python bench/call_chain.py [--sizes 1000,2000,4000,8000,16000]
"""

from __future__ import annotations

import argparse
import gc
import time

import pullback as pb
from pullback import op
from pullback.transform import FirstOrderGradient


def call_chain(n: int) -> pb.IRModule:
    fns = {}
    for k in range(n, 0, -1):
        x = pb.var("x", shape=(3,))
        if k == n:
            fns[pb.GlobalVar(f"f{k}")] = pb.Function([x], op.tanh(x))
        else:
            inner = pb.Call(pb.GlobalVar(f"f{k + 1}"), [op.multiply(x, pb.const(0.5))])
            fns[pb.GlobalVar(f"f{k}")] = pb.Function([x], op.add(inner, x))
    x = pb.var("x", shape=(3,))
    fns[pb.GlobalVar("main")] = pb.Function([x], op.sum(pb.Call(pb.GlobalVar("f1"), [x])))
    return pb.IRModule(fns)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,4000,8000,16000")
    args = ap.parse_args(argv)
    print(f"{'functions':>10s}{'AD cpu s':>10s}{'us/fn':>8s}{'ratio':>7s}")
    prev = None
    for n in (int(s) for s in args.sizes.split(",")):
        mod = call_chain(n)
        gc.collect()
        t = time.process_time()
        FirstOrderGradient()(mod)
        dt = time.process_time() - t
        per = dt / n * 1e6
        print(f"{n:>10d}{dt:>10.2f}{per:>8.0f}{per / prev if prev else float('nan'):>7.2f}", flush=True)
        prev = per


if __name__ == "__main__":
    main()
