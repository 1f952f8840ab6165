"""Where a training step through ``pullback.integrations.torch.compile`` spends its time (issue 14, evidence).

Per workload of ``bench/torch_train.py`` and per target (numpy, jax): the integration's step (forward +
backward + SGD), the executables ``@main_fwd`` / ``@main_bwd`` called directly on NumPy arrays, the SGD
update alone, and what is left: the integration's own overhead (torch<->NumPy conversions, the autograd
Function, gathering parameters). The conversions are timed by wrapping the integration's converters.
numpy target (built as the integration builds it: ATen's GEMMs, convolutions, pooling and batch norm):
the per-op profile (``exe.profile``) grouped by kind, the Python time between kernels
(unprofiled wall time minus the kernels' time), and the same program after ``FuseOps`` (the integration
does not fuse today). jax target: the jitted call on device arrays vs on NumPy arrays (the copies in and
out). Also the residual bytes under ``save_all`` and ``min_cut``.

    PYTHONPATH=src .venv/bin/python bench/experiments/profile_targets.py [--only transformer,cnn] [--small]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from common import CLOCK, add_common_args, median_ms, setup

GEMM = ("nn.dense", "nn.batch_matmul", "nn.matmul", "nn.conv2d", "nn.conv2d_transpose", "nn.conv2d_backward_weight")
KINDS = (("gemm/conv", GEMM), ("norm", ("nn.layer_norm", "nn.batch_norm", "nn.softmax", "nn.log_softmax")),
         ("pool", ("nn.max_pool2d", "nn.max_pool2d_grad", "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool2d_grad")),
         ("layout", ("transpose", "reshape", "expand_dims", "squeeze", "strided_slice", "strided_set", "broadcast_to")),
         ("reduce", ("sum", "mean", "collapse_sum_to", "max")))


def kind(label: str) -> str:
    for k, names in KINDS:
        if label in names:
            return k
    return "fused" if label.startswith("fused") else "elementwise"


def profile_workload(name: str, target: str, small: bool, reps: int) -> None:
    import numpy as np
    import torch

    import pullback.integrations.torch as pbt
    from pullback.analysis.saved import saved_bytes
    from pullback.integrations.bridges import build_for
    from pullback.testing.torch_models import make_workload
    from pullback.transform import FuseOps, PartitionForwardBackward

    wl = make_workload(name, small)
    model, inputs = wl.model, wl.example_inputs
    cm = pbt.compile(model, inputs, target=target)
    (tp,) = cm._programs.values()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        cm(*inputs).backward()
        opt.step()

    step_ms = median_ms(step, reps)
    sgd_ms = median_ms(opt.step, reps)
    prog = tp.prog
    state = dict(model.named_parameters())
    state.update(model.named_buffers())
    tensors = list(inputs) + [state[prog.state_key(n)] for n in prog.params]
    np_in = [t.detach().numpy() for t in tensors]
    fwd_ms = median_ms(lambda: tp.fwd(*np_in), reps)
    out, res = tp.fwd(*np_in)
    outs = [out] if prog.single_output else list(out)
    cts = [np.ones_like(np.asarray(o)) for o in outs]
    ct = cts[0] if prog.single_output else tuple(cts)
    bwd_ms = median_ms(lambda: tp.bwd(*res, ct), reps)
    diffs = []  # interleaved, so that drifts in machine load cancel: step - (fwd + bwd + SGD) per iteration
    for _ in range(reps):
        t0 = CLOCK[0]()
        step()
        t1 = CLOCK[0]()
        _, r = tp.fwd(*np_in)
        tp.bwd(*r, ct)
        opt.step()
        diffs.append((t1 - t0) - (CLOCK[0]() - t1))
    overhead = statistics.median(diffs) * 1e3
    print(f"{name:<12s}{target:<6s} step {step_ms:8.2f}  fwd {fwd_ms:8.2f}  bwd {bwd_ms:8.2f}  SGD {sgd_ms:6.2f}  "
          f"rest (integration: bridges, autograd) {overhead:6.2f} ms = {100 * overhead / step_ms:4.1f}%")
    if target == "numpy":
        exe = build_for(tp.mod, target)  # as the integration builds it (numpy: ATen's GEMMs and convolutions)
        by_kind: dict = defaultdict(float)
        per_op: dict = defaultdict(float)
        walls = []
        for func, args in (("main_fwd", np_in), ("main_bwd", [*res, ct])):
            p = exe.profile(*args, func=func)
            for r in p.rows:
                by_kind[kind(r.op)] += r.seconds * 1e3
                per_op[r.op] += r.seconds * 1e3
            walls.append((p.total_seconds * 1e3, sum(r.seconds for r in p.rows) * 1e3))
        wall, kernels = sum(w for w, _ in walls), sum(k for _, k in walls)
        print(f"{'':<18s}profiled run (wall clock): kernels {kernels:7.2f} of {wall:7.2f} ms, the executor between kernels "
              f"{100 * (wall - kernels) / wall:.1f}%; by kind: "
              + ", ".join(f"{k} {100 * v / kernels:.0f}%" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
        print(f"{'':<18s}top ops (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_op.items(), key=lambda kv: -kv[1])[:8]))
        fused = build_for(FuseOps()(tp.mod), target)
        f_fwd = median_ms(lambda: fused["main_fwd"](*np_in), reps)
        f_bwd = median_ms(lambda: fused["main_bwd"](*res, ct), reps)
        print(f"{'':<18s}with FuseOps: fwd {f_fwd:.2f} bwd {f_bwd:.2f} ms (vs {fwd_ms:.2f} {bwd_ms:.2f})")
        mc = PartitionForwardBackward("main_grad", policy="min_cut")(tp.mod)
        sa, mcb = saved_bytes(tp.mod, "main_fwd"), saved_bytes(mc, "main_fwd")
        mexe = build_for(mc, target)
        m_fwd = median_ms(lambda: mexe["main_fwd"](*np_in), reps)
        _, mres = mexe["main_fwd"](*np_in)
        m_bwd = median_ms(lambda: mexe["main_bwd"](*mres, ct), reps)
        print(f"{'':<18s}saved: save_all {sa / 2**20:.2f} MB, min_cut {mcb / 2**20:.2f} MB ({100 * mcb / sa:.0f}%); "
              f"min_cut fwd+bwd {m_fwd + m_bwd:.2f} ms vs save_all {fwd_ms + bwd_ms:.2f} ms")
    elif target == "jax":
        import jax

        jin = [jax.device_put(a) for a in np_in]
        jf = tp.fwd._jitted
        on_dev = median_ms(lambda: jax.block_until_ready(jf(*jin)), reps)
        jout, jres = jf(*jin)
        jb = tp.bwd._jitted
        jct = jax.device_put(ct) if not isinstance(ct, tuple) else tuple(jax.device_put(c) for c in ct)
        on_dev_b = median_ms(lambda: jax.block_until_ready(jb(*jres, jct)), reps)
        print(f"{'':<18s}jitted on device arrays: fwd {on_dev:.2f} bwd {on_dev_b:.2f} ms (through NumPy: "
              f"{fwd_ms:.2f} {bwd_ms:.2f}); copies at the NumPy boundary {fwd_ms + bwd_ms - on_dev - on_dev_b:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="transformer,bert,cnn,resnet")
    ap.add_argument("--targets", default="numpy,jax")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    add_common_args(ap)
    args = ap.parse_args()
    setup(args)
    for w in args.only.split(","):
        for t in args.targets.split(","):
            profile_workload(w, t, args.small, args.reps)


if __name__ == "__main__":
    main()
