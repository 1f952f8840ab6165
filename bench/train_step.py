"""Training-step benchmark (issue 6): pullback (numpy, jax) vs PyTorch eager, torch.compile and jax.jit.

Each workload is a full forward + backward step, gradients for every parameter,
float32. Prints medians of ``--reps`` runs (after a warm-up) and ratios against
PyTorch eager measured in the same run; FLOPs(gradient)/FLOPs(forward) from
``pullback.analysis.flops``; pullback's static peak memory
(``analysis.peak_memory``) and measured peak (``exe.profile``) next to the bytes
PyTorch saves for backward (``saved_tensors_hooks``; torch.cuda is absent, so
PyTorch's true CPU peak is not measured).

    .venv/bin/python bench/train_step.py [--reps 15] [--only mlp,cnn,transformer] [--no-compile]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np

import pullback
from pullback import op
from pullback.analysis import flops, peak_memory
from pullback.ir.expr import Function, var
from pullback.ir.module import IRModule
from pullback.testing.models import cnn, transformer_layer
from pullback.transform import FirstOrderGradient, FuseOps, standard_cleanup

THREADS = os.cpu_count() or 1

# ------------------------------------------------------------------ workloads (pullback IR)


def mlp4(batch: int = 64, width: int = 512, layers: int = 4):
    """4 dense layers width x width without bias, tanh, loss sum(h*h)."""
    x = var("x", shape=(batch, width), dtype="float32")
    ws = [var(f"w{i}", shape=(width, width), dtype="float32") for i in range(layers)]
    h = x
    for w in ws:
        h = op.tanh(op.nn.dense(h, w))
    fn = Function([x, *ws], op.sum(h * h))

    def make_inputs(seed: int = 0):
        rng = np.random.default_rng(seed)
        return [rng.standard_normal((batch, width)).astype("float32")] + [
            (rng.standard_normal((width, width)) / math.sqrt(width)).astype("float32") for _ in range(layers)]

    return IRModule.from_expr(fn), make_inputs


WORKLOADS = {
    "mlp": mlp4,
    "cnn": lambda: cnn(32, 32, (3, 16, 32), 10),
    "transformer": lambda: transformer_layer(8, 128, 256, 4, 1024),
}
GRAD_ARGS = {"mlp": slice(0, None), "cnn": slice(0, 5), "transformer": slice(0, None)}  # inputs with gradients

# ------------------------------------------------------------------ the same models in torch and jax.numpy


def torch_loss(name: str, F, t):
    def mlp_loss(x, *ws):
        h = x
        for w in ws:
            h = t.tanh(h @ w.T)
        return (h * h).sum()

    def cnn_loss(x, w1, w2, wd, bd, y):
        h = F.max_pool2d(F.relu(F.conv2d(x, w1, padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, w2, padding=1)), 2)
        logits = h.mean((2, 3)) @ wd.T + bd
        return -(F.log_softmax(logits, -1) * y).sum() / x.shape[0]

    def tf_loss(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, b1n, w1, b1, w2, b2, g2, b2n):
        B, S, D = x.shape
        H, dh = 4, D // 4
        x2 = x.reshape(B * S, D)

        def heads(h):
            return h.reshape(B, S, H, dh).transpose(1, 2).reshape(B * H, S, dh)

        q, k, v = heads(x2 @ wq.T + bq), heads(x2 @ wk.T + bk), heads(x2 @ wv.T + bv)
        a = t.softmax(q @ k.transpose(1, 2) / math.sqrt(dh), -1) @ v
        a = a.reshape(B, H, S, dh).transpose(1, 2).reshape(B * S, D)
        h1 = F.layer_norm(x2 + a @ wo.T + bo, (D,), g1, b1n)
        ff = F.gelu(h1 @ w1.T + b1) @ w2.T + b2
        return F.layer_norm(h1 + ff, (D,), g2, b2n).sum()

    return {"mlp": mlp_loss, "cnn": cnn_loss, "transformer": tf_loss}[name]


def jax_loss(name: str, jnp, jax):
    def mlp_loss(x, *ws):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w.T)
        return (h * h).sum()

    def pool(h):
        return jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def conv(h, w):
        return jax.lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)))

    def cnn_loss(x, w1, w2, wd, bd, y):
        h = pool(jax.nn.relu(conv(x, w1)))
        h = pool(jax.nn.relu(conv(h, w2)))
        logits = h.mean((2, 3)) @ wd.T + bd
        return -(jax.nn.log_softmax(logits, -1) * y).sum() / x.shape[0]

    def ln(h, g, b):
        m = h.mean(-1, keepdims=True)
        v = ((h - m) ** 2).mean(-1, keepdims=True)
        return (h - m) / jnp.sqrt(v + 1e-5) * g + b

    def tf_loss(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, b1n, w1, b1, w2, b2, g2, b2n):
        B, S, D = x.shape
        H, dh = 4, D // 4
        x2 = x.reshape(B * S, D)

        def heads(h):
            return h.reshape(B, S, H, dh).transpose(0, 2, 1, 3).reshape(B * H, S, dh)

        q, k, v = heads(x2 @ wq.T + bq), heads(x2 @ wk.T + bk), heads(x2 @ wv.T + bv)
        a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(dh), -1) @ v
        a = a.reshape(B, H, S, dh).transpose(0, 2, 1, 3).reshape(B * S, D)
        h1 = ln(x2 + a @ wo.T + bo, g1, b1n)
        ff = jax.nn.gelu(h1 @ w1.T + b1, approximate=False) @ w2.T + b2
        return ln(h1 + ff, g2, b2n).sum()

    return {"mlp": mlp_loss, "cnn": cnn_loss, "transformer": tf_loss}[name]

# ------------------------------------------------------------------ timing


def median_ms(step, reps: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _na(reason: str) -> str:
    return "n/a (" + reason.splitlines()[0][:60] + ")"


def bench(name: str, reps: int, compile_ok: bool, threads: int, tune_malloc: bool) -> dict:
    mod, make_inputs = WORKLOADS[name]()
    inputs = make_inputs(0)
    gsl = GRAD_ARGS[name]
    row: dict = {}
    t0 = time.perf_counter()
    grad = FuseOps()(standard_cleanup()(FirstOrderGradient()(mod)))
    row["pullback passes s"] = time.perf_counter() - t0
    exe = pullback.build(grad, blas_threads=threads, tune_malloc=tune_malloc)
    row["pullback numpy"] = median_ms(lambda: exe["main_grad"](*inputs), reps)
    row["flop ratio"] = flops(grad, "main_grad") / flops(mod, "main")
    row["pullback static peak MB"] = peak_memory(grad, "main_grad") / 2**20
    row["pullback measured peak MB"] = exe.profile(*inputs, func="main_grad").peak_bytes / 2**20
    try:
        jexe = pullback.build(grad, target="jax")
        row["pullback jax"] = median_ms(lambda: _block(jexe["main_grad"](*inputs)), reps)
    except Exception as e:  # noqa: BLE001 - report, do not stop the benchmark
        row["pullback jax"] = _na(f"{type(e).__name__}: {e}")

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    targs = [torch.tensor(a, requires_grad=(i in range(len(inputs))[gsl])) for i, a in enumerate(inputs)]
    loss_fn = torch_loss(name, F, torch)

    def torch_step(fn):
        def step():
            for a in targs:
                a.grad = None
            fn(*targs).backward()
        return step

    row["torch eager"] = median_ms(torch_step(loss_fn), reps)
    saved = [0]

    def pack(t):
        saved[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(*targs).backward()
    row["torch saved MB"] = saved[0] / 2**20
    if compile_ok and name in ("mlp", "transformer"):
        try:
            cfn = torch.compile(loss_fn)
            t0 = time.perf_counter()
            torch_step(cfn)()
            row["torch.compile s"] = time.perf_counter() - t0
            row["torch.compile"] = median_ms(torch_step(cfn), reps)
        except Exception as e:  # noqa: BLE001
            row["torch.compile"] = _na(f"{type(e).__name__}: {e}")
    else:
        row["torch.compile"] = "n/a (skipped)"

    import jax
    import jax.numpy as jnp

    jf = jax.jit(jax.value_and_grad(jax_loss(name, jnp, jax), argnums=tuple(range(len(inputs)))[gsl]))
    jargs = [jnp.asarray(a) for a in inputs]
    row["jax.jit"] = median_ms(lambda: _block(jf(*jargs)), reps)
    row["tvm relax"] = "not installed"
    return row


def _block(v):
    import jax

    return jax.block_until_ready(v)


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--only", default="mlp,cnn,transformer")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--threads", type=int, default=THREADS, help="BLAS threads for pullback and torch.set_num_threads")
    ap.add_argument("--no-tune-malloc", action="store_true", help="leave glibc malloc as it is (see runtime.tuning)")
    args = ap.parse_args()
    tune = not args.no_tune_malloc
    print(f"threads: {args.threads} for pullback's BLAS and torch.set_num_threads; JAX uses its default; "
          f"glibc malloc tuned for the whole process: {tune}; medians of {args.reps} runs, ms")
    times = ["pullback numpy", "pullback jax", "torch eager", "torch.compile", "jax.jit", "tvm relax"]
    rows = {n: bench(n, args.reps, not args.no_compile, args.threads, tune) for n in args.only.split(",")}
    head = f"{'workload':<12s}" + "".join(f"{c:>16s}" for c in times)
    print(head)
    for n, r in rows.items():
        print(f"{n:<12s}" + "".join(f"{_fmt(r.get(c, 'n/a'))[:15]:>16s}" for c in times))
    print("\nratios (same run): pullback numpy / torch eager, pullback jax / jax.jit; FLOPs(grad)/FLOPs(fwd); memory MB")
    for n, r in rows.items():
        num = r["pullback numpy"] / r["torch eager"]
        pj = r["pullback jax"] / r["jax.jit"] if isinstance(r["pullback jax"], float) else "n/a"
        tc = f", torch.compile compile {r['torch.compile s']:.1f} s" if "torch.compile s" in r else ""
        print(f"{n:<12s} numpy/eager {num:.2f}  jax/jax.jit {_fmt(pj)}  flops {r['flop ratio']:.2f}  "
              f"peak static {r['pullback static peak MB']:.1f} measured {r['pullback measured peak MB']:.1f} "
              f"vs torch saved-for-backward {r['torch saved MB']:.1f}  passes {r['pullback passes s']:.2f} s{tc}")


if __name__ == "__main__":
    main()
