# ruff: noqa: B023  (closures are timed inside the loop iteration that defines them)
"""Candidate means for issue 14, measured kernel by kernel at the bench workloads' sizes (float32, 2 threads).

Sections (``--only``): ``elementwise`` (GELU forward+backward, a BN-backward-like chain), ``softmax``,
``layernorm`` (forward + backward each), ``conv`` (forward, grad-input, grad-weight), ``pool`` (max-pool
gradient), ``dlpack`` (torch <-> jax), ``torch-views`` (the cost of handing NumPy buffers to ATen). Each
row is the best of 30 runs in ms. "pullback" rows run pullback itself: the vjp program of the op
(``FirstOrderGradient(mode="vjp")`` + ``standard_cleanup``) built for the numpy target, or the op's NumPy
kernel from the registry; the other rows are candidates written here: plain NumPy, numexpr, numba
(single-pass, ``parallel=True``), torch ATen kernels called on ``torch.from_numpy`` views, and jax.jit.

    PYTHONPATH=src .venv/bin/python bench/experiments/kernel_candidates.py [--only softmax,conv] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from common import add_common_args, samples, setup


def timeit(fn, reps: int = 30, warmup: int = 3) -> float:
    """Best of ``reps`` (ms): on a machine shared with other processes the minimum is the kernel's own cost."""
    return min(samples(fn, reps, warmup)) * 1e3


def check(got, want, what: str) -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-3, atol=2e-4, err_msg=what)


def report(section: str, rows: list) -> None:
    """rows: (variant, ms or exception text); ratio to the first torch row."""
    ref = next((ms for v, ms in rows if v.startswith("torch") and isinstance(ms, float)), None)
    print(f"\n## {section}")
    for v, ms in rows:
        if isinstance(ms, float):
            ratio = f"{ms / ref:6.2f}x torch" if ref else ""
            print(f"  {v:<58s}{ms:9.3f} ms  {ratio}")
        else:
            print(f"  {v:<58s}{ms}")


def first_call_s(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def pb_vjp(build_fn, arrays: list):
    """pullback's vjp program (numpy target) of ``build_fn(*vars)``: callable(*arrays, ct) -> (out, grads)."""
    import pullback as pb
    from pullback.ir.expr import Function, var
    from pullback.transform import FirstOrderGradient, standard_cleanup

    vs = [var(f"a{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    mod = pb.IRModule.from_expr(Function(vs, build_fn(*vs)))
    mod = standard_cleanup()(FirstOrderGradient(mode="vjp")(mod))
    return pb.build(mod)["main_grad"]


def _numexpr():
    try:
        import numexpr
        return numexpr
    except ImportError:
        return None


def _numba():
    try:
        import numba
        return numba
    except ImportError:
        return None


# ------------------------------------------------------------------ elementwise chains


def elementwise(rng) -> None:
    ne = _numexpr()
    import torch

    from pullback import op

    x = rng.standard_normal((1024, 1024), dtype=np.float32)  # the FF hidden of the transformer: B*S x d_ff
    g = rng.standard_normal((1024, 1024), dtype=np.float32)
    tx, tg = torch.from_numpy(x), torch.from_numpy(g)
    rows = []
    f = pb_vjp(lambda a: op.nn.gelu(a), [x])
    rows.append(("pullback numpy target: gelu vjp program (fwd+bwd)", timeit(lambda: f(x, g))))

    def numpy_gelu():
        c = np.float32(1 / math.sqrt(2))
        from scipy.special import erf
        cdf = 0.5 * (1 + erf(x * c))
        y = x * cdf
        pdf = np.exp(-0.5 * x * x) * np.float32(1 / math.sqrt(2 * math.pi))
        return y, g * (cdf + x * pdf)

    rows.append(("NumPy+scipy erf, one temporary per op", timeit(numpy_gelu)))
    # numexpr has no erf: the tanh form (GPT-2's gelu_new) is the closest it can do
    env = {"x": x, "g": g, "k0": np.float32(math.sqrt(2 / math.pi)), "k1": np.float32(0.044715)}
    if ne is None:
        rows.append(("numexpr", "not installed"))
    else:
        rows.append(("numexpr tanh-GELU fwd+bwd (no erf in numexpr)", timeit(lambda: (
            ne.evaluate("0.5*x*(1+tanh(k0*(x+k1*x*x*x)))", local_dict=env),
            ne.evaluate("g*(0.5*(1+tanh(k0*(x+k1*x*x*x))) + 0.5*x*(1-tanh(k0*(x+k1*x*x*x))**2)*k0*(1+3*k1*x*x))",
                        local_dict=env)))))
    nb = _numba()
    if nb is not None:
        @nb.njit(parallel=True, fastmath=True)
        def gelu_fb(x, g, y, dx):
            for i in nb.prange(x.shape[0]):
                for j in range(x.shape[1]):
                    v = x[i, j]
                    cdf = 0.5 * (1.0 + math.erf(v * 0.7071067811865476))
                    y[i, j] = v * cdf
                    dx[i, j] = g[i, j] * (cdf + v * math.exp(-0.5 * v * v) * 0.3989422804014327)

        y, dx = np.empty_like(x), np.empty_like(x)
        c = first_call_s(gelu_fb, x, g, y, dx)
        check(dx, torch.ops.aten.gelu_backward(tg, tx), "numba gelu backward")
        rows.append((f"numba single pass fwd+bwd (first call {c:.2f} s)", timeit(lambda: gelu_fb(x, g, y, dx))))
        vec = nb.vectorize(["float32(float32)"], target="parallel")(lambda v: v * 0.5 * (1 + math.erf(v * 0.7071067811865476)))
        rows.append(("numba @vectorize(parallel) forward only", timeit(lambda: vec(x))))
    rows.append(("torch ATen gelu + gelu_backward on from_numpy views", timeit(lambda: (
        torch.nn.functional.gelu(tx), torch.ops.aten.gelu_backward(tg, tx)))))
    rows.append(("torch ATen gelu forward only", timeit(lambda: torch.nn.functional.gelu(tx))))
    try:
        import jax
        import jax.numpy as jnp

        jf = jax.jit(lambda a, b: jax.vjp(lambda t: jax.nn.gelu(t, approximate=False), a)[1](b))
        ja, jb = jax.device_put(x), jax.device_put(g)
        rows.append(("jax.jit vjp(gelu) on device arrays", timeit(lambda: jax.block_until_ready(jf(ja, jb)))))
        del jnp
    except ImportError as e:
        rows.append(("jax", f"n/a ({e})"))
    report("elementwise: GELU (erf) forward + backward, (1024, 1024)", rows)

    # a batch-norm-backward-like chain: dx = (g - mean_g - xhat * mean_gx) * inv * gamma, per channel
    n, c_, h, w = 16, 64, 8, 8
    xh = rng.standard_normal((n, c_, h, w), dtype=np.float32)
    gg = rng.standard_normal((n, c_, h, w), dtype=np.float32)
    mg = rng.standard_normal((1, c_, 1, 1), dtype=np.float32)
    mgx, inv, gam = (rng.standard_normal((1, c_, 1, 1), dtype=np.float32) for _ in range(3))
    rows = [("NumPy, one temporary per op", timeit(lambda: (gg - mg - xh * mgx) * inv * gam))]
    env = {"gg": gg, "mg": mg, "xh": xh, "mgx": mgx, "inv": inv, "gam": gam}
    if ne is not None:
        rows.append(("numexpr one pass", timeit(lambda: ne.evaluate("(gg - mg - xh * mgx) * inv * gam", local_dict=env))))
    tt = [torch.from_numpy(a) for a in (xh, gg, mg, mgx, inv, gam)]
    rows.append(("torch ATen (5 ops)", timeit(lambda: (tt[1] - tt[2] - tt[0] * tt[3]) * tt[4] * tt[5])))
    out = np.empty_like(xh)

    def with_out():
        np.multiply(xh, mgx, out=out)
        np.subtract(gg, out, out=out)
        np.subtract(out, mg, out=out)
        np.multiply(out, inv, out=out)
        np.multiply(out, gam, out=out)

    rows.append(("NumPy ufuncs with out= (pullback's fused groups)", timeit(with_out)))
    if nb is not None:
        @nb.njit(parallel=True, fastmath=True)
        def chain(xh, gg, mg, mgx, inv, gam, out):
            n, c, h, w = xh.shape
            for ci in nb.prange(c):
                a, b, s = mg[0, ci, 0, 0], mgx[0, ci, 0, 0], inv[0, ci, 0, 0] * gam[0, ci, 0, 0]
                for ni in range(n):
                    for i in range(h):
                        for j in range(w):
                            out[ni, ci, i, j] = (gg[ni, ci, i, j] - a - xh[ni, ci, i, j] * b) * s

        cc = first_call_s(chain, xh, gg, mg, mgx, inv, gam, out)
        check(out, (gg - mg - xh * mgx) * inv * gam, "numba chain")
        rows.append((f"numba one pass (first call {cc:.2f} s)", timeit(lambda: chain(xh, gg, mg, mgx, inv, gam, out))))
    report(f"elementwise: BN-backward chain on (16, 64, 8, 8) = {xh.nbytes >> 10} KiB", rows)


# ------------------------------------------------------------------ softmax and layer_norm


def softmax(rng) -> None:
    import torch

    from pullback import op

    x = rng.standard_normal((32, 128, 128), dtype=np.float32)  # (B*H, S, S) attention scores
    g = rng.standard_normal(x.shape, dtype=np.float32)
    f = pb_vjp(lambda a: op.nn.softmax(a, axis=-1), [x])
    rows = [("pullback numpy target: softmax vjp program", timeit(lambda: f(x, g)))]

    def numpy_two_pass():
        e = np.exp(x - x.max(-1, keepdims=True))
        y = e / e.sum(-1, keepdims=True)
        return y, y * (g - (g * y).sum(-1, keepdims=True))

    rows.append(("NumPy expression (same passes)", timeit(numpy_two_pass)))
    nb = _numba()
    if nb is not None:
        @nb.njit(parallel=True, fastmath=True)
        def sm_fb(x, g, y, dx):
            r = x.reshape(-1, x.shape[-1])
            gr, yr, dr = g.reshape(r.shape), y.reshape(r.shape), dx.reshape(r.shape)
            for i in nb.prange(r.shape[0]):
                m = r[i].max()
                s = 0.0
                for j in range(r.shape[1]):
                    e = math.exp(r[i, j] - m)
                    yr[i, j] = e
                    s += e
                inv = 1.0 / s
                dot = 0.0
                for j in range(r.shape[1]):
                    yr[i, j] *= inv
                    dot += gr[i, j] * yr[i, j]
                for j in range(r.shape[1]):
                    dr[i, j] = yr[i, j] * (gr[i, j] - dot)

        y, dx = np.empty_like(x), np.empty_like(x)
        c = first_call_s(sm_fb, x, g, y, dx)
        check(dx, numpy_two_pass()[1], "numba softmax backward")
        rows.append((f"numba fused row kernel fwd+bwd (first call {c:.2f} s)", timeit(lambda: sm_fb(x, g, y, dx))))
    tx, tg = torch.from_numpy(x), torch.from_numpy(g)

    def torch_sm():
        y = torch._softmax(tx, -1, False)
        return torch._softmax_backward_data(tg, y, -1, torch.float32)

    rows.append(("torch ATen _softmax + _softmax_backward_data", timeit(torch_sm)))
    report("softmax forward + backward, (32, 128, 128)", rows)


def layernorm(rng) -> None:
    import torch

    from pullback import op

    x = rng.standard_normal((1024, 256), dtype=np.float32)
    gam = (1 + 0.1 * rng.standard_normal(256)).astype(np.float32)
    bet = (0.1 * rng.standard_normal(256)).astype(np.float32)
    g = rng.standard_normal(x.shape, dtype=np.float32)
    f = pb_vjp(lambda a, b, c: op.nn.layer_norm(a, b, c, axis=-1), [x, gam, bet])
    rows = [("pullback numpy target: layer_norm vjp program", timeit(lambda: f(x, gam, bet, g)))]
    nb = _numba()
    if nb is not None:
        @nb.njit(parallel=True, fastmath=True)
        def ln_fwd(x, gam, bet, y, mean, rstd):
            n, d = x.shape
            for i in nb.prange(n):
                s = 0.0
                ss = 0.0
                for j in range(d):
                    s += x[i, j]
                    ss += x[i, j] * x[i, j]
                m = s / d
                r = 1.0 / math.sqrt(max(ss / d - m * m, 0.0) + 1e-5)
                mean[i], rstd[i] = m, r
                for j in range(d):
                    y[i, j] = (x[i, j] - m) * r * gam[j] + bet[j]

        @nb.njit(parallel=True, fastmath=True)
        def ln_bwd_dx(x, gam, g, mean, rstd, dx):
            n, d = x.shape
            for i in nb.prange(n):
                a = 0.0
                b = 0.0
                for j in range(d):
                    xh = (x[i, j] - mean[i]) * rstd[i]
                    gy = g[i, j] * gam[j]
                    a += gy
                    b += gy * xh
                a /= d
                b /= d
                for j in range(d):
                    xh = (x[i, j] - mean[i]) * rstd[i]
                    dx[i, j] = (g[i, j] * gam[j] - a - xh * b) * rstd[i]

        y, dx = np.empty_like(x), np.empty_like(x)
        mean, rstd = np.empty(1024, np.float32), np.empty(1024, np.float32)

        def nb_ln():
            ln_fwd(x, gam, bet, y, mean, rstd)
            ln_bwd_dx(x, gam, g, mean, rstd, dx)
            xh = (x - mean[:, None]) * rstd[:, None]  # dgamma, dbeta: two column reductions
            return (g * xh).sum(0), g.sum(0)

        c = first_call_s(nb_ln)
        ref = torch.ops.aten.native_layer_norm_backward(
            torch.from_numpy(g), torch.from_numpy(x), [256], *torch.ops.aten.native_layer_norm(
                torch.from_numpy(x), [256], torch.from_numpy(gam), torch.from_numpy(bet), 1e-5)[1:],
            torch.from_numpy(gam), torch.from_numpy(bet), [True, True, True])
        check(dx, ref[0], "numba layer_norm dx")
        rows.append((f"numba row kernels fwd + dx, NumPy dgamma/dbeta (first call {c:.2f} s)", timeit(nb_ln)))
    tx, tg, tgam, tbet = (torch.from_numpy(a) for a in (x, g, gam, bet))

    def torch_ln():
        y, m, r = torch.ops.aten.native_layer_norm(tx, [256], tgam, tbet, 1e-5)
        return torch.ops.aten.native_layer_norm_backward(tg, tx, [256], m, r, tgam, tbet, [True, True, True])

    rows.append(("torch ATen native_layer_norm + _backward", timeit(torch_ln)))
    report("layer_norm forward + backward, (1024, 256)", rows)


# ------------------------------------------------------------------ convolution and pooling

CONVS = [  # (name, x shape, w shape, stride, padding)
    ("cnn conv1", (32, 3, 32, 32), (16, 3, 3, 3), 1, 1),
    ("cnn conv2", (32, 16, 16, 16), (32, 16, 3, 3), 1, 1),
    ("resnet stem 7x7/2", (16, 3, 32, 32), (64, 3, 7, 7), 2, 3),
    ("resnet layer1 3x3", (16, 64, 8, 8), (64, 64, 3, 3), 1, 1),
    ("resnet layer3 3x3", (16, 256, 2, 2), (256, 256, 3, 3), 1, 1),
]


def conv(rng) -> None:
    import torch
    from numpy.lib.stride_tricks import sliding_window_view

    from pullback.ops.registry import get_op

    fwd, gx_op, gw_op = get_op("nn.conv2d"), get_op("nn.conv2d_transpose"), get_op("nn.conv2d_backward_weight")
    for name, xs, ws, s, p in CONVS:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        tx, tw = torch.from_numpy(x), torch.from_numpy(w)
        y = torch.conv2d(tx, tw, stride=s, padding=p).numpy()
        g = rng.standard_normal(y.shape, dtype=np.float32)
        tg = torch.from_numpy(g)
        a = fwd.make_attrs(strides=(s, s), padding=(p, p))
        k = ws[2:]
        op_pad = tuple((xs[2 + i] + 2 * p - k[i]) % s for i in range(2))
        ta = gx_op.make_attrs(strides=(s, s), padding=(p, p), output_padding=op_pad)
        wa = gw_op.make_attrs(kernel_size=k, strides=(s, s), padding=(p, p))
        f, fx, fw = fwd.impl("numpy"), gx_op.impl("numpy"), gw_op.impl("numpy")

        def swv_gemm():
            xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
            v = sliding_window_view(xp, k, axis=(2, 3))[:, :, ::s, ::s]  # (N, C, OH, OW, KH, KW), no copy
            return np.einsum("nchwij,ocij->nohw", v, w, optimize=True)

        flop = 2 * np.prod(y.shape) * np.prod(ws[1:])
        rows = [("pullback nn.conv2d kernel (im2col + tensordot)", timeit(lambda: f(x, w, a))),
                ("sliding_window_view + einsum(optimize) (no explicit im2col)", timeit(swv_gemm)),
                ("torch.conv2d on from_numpy views (oneDNN)", timeit(lambda: torch.conv2d(tx, tw, stride=s, padding=p))),
                ("pullback nn.conv2d_transpose (grad input)", timeit(lambda: fx(g, w, ta))),
                ("pullback nn.conv2d_backward_weight (grad weight)", timeit(lambda: fw(g, x, wa))),
                ("torch convolution_backward (input + weight)", timeit(lambda: torch.ops.aten.convolution_backward(
                    tg, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, [True, True, False])))]
        report(f"conv {name}: x{xs} w{ws} stride {s} pad {p}, {flop / 1e6:.0f} MFLOP forward", rows)


def pool(rng) -> None:
    import torch

    from pullback.ops.registry import get_op

    x = rng.standard_normal((32, 16, 32, 32), dtype=np.float32)  # the BN-CNN's first pool
    tx = torch.from_numpy(x)
    y, idx = torch.ops.aten.max_pool2d_with_indices(tx, [2, 2], [2, 2])
    g = rng.standard_normal(tuple(y.shape), dtype=np.float32)
    tg = torch.from_numpy(g)
    gop = get_op("nn.max_pool2d_grad")
    a = gop.make_attrs(pool_size=(2, 2), strides=(2, 2))
    rows = [("pullback nn.max_pool2d_grad kernel", timeit(lambda: gop.impl("numpy")(g, x, a)))]

    def mask_no_scatter():  # non-overlapping windows: a reshape, a compare and a broadcast multiply
        n, c, h, w = x.shape
        v = x.reshape(n, c, h // 2, 2, w // 2, 2)
        m = v.max(axis=(3, 5), keepdims=True)
        # ties would all receive the gradient; PyTorch's first-maximum rule needs one more pass over the mask
        return ((v == m) * g.reshape(n, c, h // 2, 1, w // 2, 1)).reshape(x.shape)

    rows.append(("NumPy mask * broadcast (reshape, no scatter; ties: all)", timeit(mask_no_scatter)))
    rows.append(("torch max_pool2d_with_indices_backward (indices saved)", timeit(
        lambda: torch.ops.aten.max_pool2d_with_indices_backward(tg, tx, [2, 2], [2, 2], [0, 0], [1, 1], False, idx))))
    rows.append(("torch forward+backward (recomputes the indices)", timeit(lambda: torch.ops.aten.max_pool2d_with_indices_backward(
        tg, tx, [2, 2], [2, 2], [0, 0], [1, 1], False, torch.ops.aten.max_pool2d_with_indices(tx, [2, 2], [2, 2])[1]))))
    report("max_pool2d 2x2/2 gradient, x (32, 16, 32, 32)", rows)


# ------------------------------------------------------------------ conversions


def dlpack(rng) -> None:
    import jax
    import jax.numpy as jnp
    import torch

    rows = []
    for mb in (1, 4, 16):
        a = rng.standard_normal((mb << 18,), dtype=np.float32)  # mb MiB
        t = torch.from_numpy(a.copy())
        j = jax.device_put(a)
        jax.block_until_ready(j)
        rows.append((f"{mb:2d} MiB torch -> jax: jax.device_put(t.numpy()) (copy)",
                     timeit(lambda: jax.block_until_ready(jax.device_put(t.numpy())))))
        rows.append((f"{mb:2d} MiB torch -> jax: jnp.from_dlpack(t) (zero copy)", timeit(lambda: jnp.from_dlpack(t))))
        rows.append((f"{mb:2d} MiB jax -> torch: torch.from_numpy(np.array(j)) (copy)",
                     timeit(lambda: torch.from_numpy(np.array(j)))))
        rows.append((f"{mb:2d} MiB jax -> torch: torch.from_dlpack(j) (zero copy)", timeit(lambda: torch.from_dlpack(j))))
        rows.append((f"{mb:2d} MiB torch -> numpy -> torch (the numpy target: zero copy)",
                     timeit(lambda: torch.from_numpy(t.detach().numpy()))))
    report("conversions torch <-> jax / numpy (per tensor)", rows)


def torch_views(rng) -> None:
    """What a zero-copy torch target pays per kernel call: wrapping NumPy buffers and dispatching to ATen."""
    import torch

    a = rng.standard_normal((64,), dtype=np.float32)
    t = torch.from_numpy(a)
    rows = [("torch.add on two tiny tensors (ATen dispatch)", timeit(lambda: torch.add(t, t), reps=2000)),
            ("np.add on two tiny arrays", timeit(lambda: np.add(a, a), reps=2000)),
            ("torch.from_numpy(a) (wrap a NumPy buffer)", timeit(lambda: torch.from_numpy(a), reps=2000)),
            ("t.numpy() (view a torch tensor)", timeit(lambda: t.numpy(), reps=2000))]
    report("per-call overheads (tiny tensors: the fixed cost of one kernel call)", rows)


SECTIONS = {"elementwise": elementwise, "softmax": softmax, "layernorm": layernorm, "conv": conv, "pool": pool,
            "dlpack": dlpack, "torch-views": torch_views}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS))
    add_common_args(ap)
    args = ap.parse_args()
    setup(args, tune_malloc=False)
    nb = _numba()
    if nb is not None:
        nb.set_num_threads(args.threads)
    print(f"threads {args.threads}; numba {getattr(nb, '__version__', 'not installed')}")
    rng = np.random.default_rng(0)
    for s in args.only.split(","):
        SECTIONS[s](rng)


if __name__ == "__main__":
    main()
