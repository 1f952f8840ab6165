"""How FuseOps scales on gradient programs (issue 15: near-linear post-dominators).

Workload: the gradient (FirstOrderGradient, then InferType) of an n-layer MLP
``h = multiply(relu(nn.dense(h, w_i)), s)`` whose scale ``s = sigmoid(p)`` is
shared by every layer, batch 8, width 64, loss ``sum(h)``. The shared value
and the forward values feed consumers far apart in the gradient program: the
post-dominator walk of Relay's partitioner is quadratic there (63 s at 50k
forward ops before), the jump-pointer version O(E log N). With ``--plain`` the
MLP has no shared value (the ``bench/ad_scaling.py`` workload). With ``--chain``
the forward is an elementwise chain ``h = tanh(add(h, 0.1))`` (4x8): every forward
value's post-dominator is in the backward, n nodes away, and the walk along
that path (bounded by ``max_depth`` since) made FuseOps quadratic (22.7 s at 2k
forward ops, 0.74 s at 1k).

For each size: forward ops, gradient-program graph nodes, seconds for
``analysis.fusion.partition`` (graph, post-dominators, grouping) and for the
whole ``FuseOps`` pass (CPU time), microseconds per graph node, and that figure over the
smallest size's (flat = linear).

    .venv/bin/python bench/fuse_scaling.py [--sizes 5000,10000,20000,50000] [--plain | --chain]
"""

from __future__ import annotations

import argparse
import gc
import time

import pullback as pb
from pullback import op
from pullback.analysis import infer_module
from pullback.analysis.fusion import partition
from pullback.ir.traversal import count_calls
from pullback.transform import FirstOrderGradient, FuseOps

BATCH, WIDTH = 8, 64


def mlp(forward_ops: int, shared: bool) -> pb.IRModule:
    """About ``forward_ops`` operator calls (3 per layer)."""
    layers = max(1, forward_ops // 3)
    x, p = pb.var("x", shape=(BATCH, WIDTH)), pb.var("p", shape=(BATCH, WIDTH))
    ws = [pb.var(f"w{i}", shape=(WIDTH, WIDTH)) for i in range(layers)]
    scale = op.sigmoid(p) if shared else pb.const(0.5, "float32")
    h = x
    for w in ws:
        h = op.multiply(op.nn.relu(op.nn.dense(h, w)), scale)
    params = [x, p] + ws if shared else [x] + ws
    return pb.IRModule.from_expr(pb.Function(params, op.sum(h)))


def timed(fn):
    gc.collect()
    t = time.process_time()  # CPU seconds: robust to other processes sharing the machine
    out = fn()
    return out, time.process_time() - t


def chain(forward_ops: int) -> pb.IRModule:
    """An elementwise chain of ``forward_ops`` operator calls (2 per link)."""
    x = pb.var("x", shape=(4, 8))
    h = x
    for _ in range(max(1, forward_ops // 2)):
        h = op.tanh(op.add(h, pb.const(0.1, "float32")))
    return pb.IRModule.from_expr(pb.Function([x], op.sum(h)))


def row(forward_ops: int, shared: bool, is_chain: bool = False):
    mod = chain(forward_ops) if is_chain else mlp(forward_ops, shared)
    infer_module(mod)
    grad = FirstOrderGradient()(mod)
    infer_module(grad)
    fn = grad["main_grad"]
    part, t_part = timed(lambda: partition(fn.body))
    _, t_fuse = timed(lambda: FuseOps()(grad))
    return count_calls(mod["main"]), len(part.nodes), t_part, t_fuse


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5000,10000,20000,50000", help="forward operator counts")
    ap.add_argument("--plain", action="store_true", help="no shared value (plain MLP)")
    ap.add_argument("--chain", action="store_true", help="an elementwise chain instead of the MLP")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    mlp_kind = "plain MLP" if args.plain else "MLP with a scale shared by every layer"
    what = "elementwise chain of tanh(add(h, 0.1)), 4x8" if args.chain else f"{mlp_kind}, batch {BATCH}, width {WIDTH}"
    print(f"FuseOps on gradient programs ({what})")
    print(f"{'fwd ops':>8} {'nodes':>8} {'partition s':>12} {'FuseOps s':>10} {'us/node':>8} {'x smallest':>10}")
    base = None
    for n in sizes:
        fwd, nodes, t_part, t_fuse = row(n, not args.plain, args.chain)
        per = t_fuse / nodes * 1e6
        base = base or per
        print(f"{fwd:>8} {nodes:>8} {t_part:>12.2f} {t_fuse:>10.2f} {per:>8.1f} {per / base:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
