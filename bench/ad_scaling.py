"""How FirstOrderGradient scales with depth (issue 4, Speed; issue 12 item 7).

Workloads, batch 8, width 64, loss ``sum(h)``:

- ``mlp`` (3 forward operators per layer): ``h = multiply(relu(matmul(h, w_i)), 0.5)``;
- ``mlp_scaled`` (4 per layer: the issue-12 target, 12,000 forward operators at
  3,000 layers): ``h = multiply(relu(add(matmul(h, w_i), b_i)), s_i)`` with a bias
  ``b_i`` and a learned scalar scale ``s_i`` per layer.

For each n: forward op count, seconds for FirstOrderGradient alone (best of
``--repeat`` runs, wall clock and CPU time: the machine may be shared) and with
``standard_cleanup``, CPU microseconds per forward op and its ratio to the first
row of at least 1,000 layers (flat is linear), gradient program size; in the same
run ``jax.make_jaxpr(jax.grad(f))`` and TVM Relax's ``relax.transform.Gradient``
when installed, with ratios.

    .venv/bin/python bench/ad_scaling.py [--sizes 100,1000,3000] [--workloads mlp,mlp_scaled]
        [--jax-max 3000] [--cleanup-max 10000] [--repeat 3]
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
WORKLOADS = {
    "mlp": "h = multiply(relu({mm}(h, w_i)), 0.5)",
    "mlp_scaled": "h = multiply(relu(add({mm}(h, w_i), b_i)), s_i)",
}


def _matmul(h, w):
    return op.nn.matmul(h, w) if has_op("nn.matmul") else op.nn.dense(h, w)


def mlp(n: int, workload: str = "mlp") -> pb.IRModule:
    x = pb.var("x", shape=(BATCH, WIDTH))
    params = [x]
    half = pb.const(0.5, "float32")
    h = x
    for i in range(n):
        w = pb.var(f"w{i}", shape=(WIDTH, WIDTH))
        params.append(w)
        if workload == "mlp":
            h = op.multiply(op.nn.relu(_matmul(h, w)), half)
        else:
            b, s = pb.var(f"b{i}", shape=(WIDTH,)), pb.var(f"s{i}", shape=())
            params += [b, s]
            h = op.multiply(op.nn.relu(op.add(_matmul(h, w), b)), s)
    return pb.IRModule.from_expr(pb.Function(params, op.sum(h)))


def timed(fn, repeat: int = 1):
    """(result, best wall seconds, best CPU seconds) over ``repeat`` runs."""
    wall = cpu = float("inf")
    out = None
    for _ in range(repeat):
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return out, wall, cpu


def pullback_row(n: int, workload: str, with_cleanup: bool, repeat: int):
    from pullback.analysis import infer_module
    from pullback.transform import FirstOrderGradient

    mod = mlp(n, workload)
    infer_module(mod)  # the forward program comes typed, as after InferType
    fwd_ops = count_calls(mod["main"])
    gmod, t_ad, c_ad = timed(lambda: FirstOrderGradient()(mod), repeat)
    size = len(post_order(gmod["main_grad"].body))
    t_clean = None
    if with_cleanup:
        try:
            from pullback.transform import standard_cleanup
        except ImportError:
            standard_cleanup = None
        if standard_cleanup is not None:
            _, t_c, _ = timed(lambda: standard_cleanup()(gmod))
            t_clean = t_ad + t_c
    return fwd_ops, t_ad, c_ad, t_clean, size


def jax_seconds(n: int, workload: str):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    def layer(h, w, b, s):
        return jnp.maximum(h @ w, 0.0) * 0.5 if workload == "mlp" else jnp.maximum(h @ w + b, 0.0) * s

    def f(x, ws, *extra):
        h = x
        for i, w in enumerate(ws):
            h = layer(h, w, *(e[i] for e in extra)) if extra else layer(h, w, None, None)
        return jnp.sum(h)

    x = jnp.zeros((BATCH, WIDTH), jnp.float32)
    ws = [jnp.zeros((WIDTH, WIDTH), jnp.float32) for _ in range(n)]
    extra = [] if workload == "mlp" else [[jnp.zeros((WIDTH,), jnp.float32)] * n, [jnp.ones((), jnp.float32)] * n]
    argnums = tuple(range(2 + len(extra)))
    _, t, _ = timed(lambda: jax.make_jaxpr(jax.grad(f, argnums=argnums))(x, ws, *extra))
    return t


def relax_available() -> bool:
    try:
        import tvm  # noqa: F401
        from tvm import relax  # noqa: F401
    except ImportError:
        return False
    return True


def table(workload: str, sizes: list, args) -> None:
    mm = "nn.matmul" if has_op("nn.matmul") else "nn.dense"
    print(f"\n{workload}: n-layer MLP {WORKLOADS[workload].format(mm=mm)}, batch {BATCH}, width {WIDTH}")
    head = (f"{'n':>8} {'fwd ops':>8} {'AD s':>8} {'AD cpu s':>9} {'cpu us/op':>9} {'flat':>5} {'grad size':>10} "
            f"{'AD+clean s':>11} {'jax s':>8} {'jax/AD':>7}")
    print(head)
    print("-" * len(head))
    base = None
    for n in sizes:
        repeat = args.repeat if n <= 10_000 else 1
        fwd, t_ad, c_ad, t_clean, size = pullback_row(n, workload, n <= args.cleanup_max, repeat)
        t_jax = jax_seconds(n, workload) if n <= args.jax_max else None
        per_op = 1e6 * c_ad / fwd
        if base is None and n >= 1000:
            base = per_op
        flat = f"{per_op / base:5.2f}" if base else f"{'-':>5}"
        clean = f"{t_clean:11.3f}" if t_clean is not None else f"{'-':>11}"
        jx = f"{t_jax:8.3f}" if t_jax is not None else f"{'-':>8}"
        ratio = f"{t_jax / t_ad:7.1f}" if t_jax is not None else f"{'-':>7}"
        print(f"{n:>8} {fwd:>8} {t_ad:8.3f} {c_ad:9.3f} {per_op:9.1f} {flat} {size:>10} {clean} {jx} {ratio}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,3000,10000,100000")
    ap.add_argument("--workloads", default="mlp,mlp_scaled", help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    ap.add_argument("--jax-max", type=int, default=3000, help="largest n timed with jax")
    ap.add_argument("--cleanup-max", type=int, default=10000, help="largest n timed with standard_cleanup")
    ap.add_argument("--repeat", type=int, default=3, help="runs per size up to 10,000 layers (best is shown)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    print("TVM Relax Gradient:", "installed (not measured by this script)" if relax_available() else "not installed")
    print("flat: CPU us/op relative to the first row of at least 1,000 layers (1.00 everywhere is linear)")
    for w in workloads:
        table(w, sizes, args)


if __name__ == "__main__":
    main()
