"""Measured effect of ``standard_cleanup()`` on gradient programs (issue 5).

For the MLP, CNN and transformer-layer models of ``pullback.testing.models``:
number of operator calls, like-operators, identity arithmetic (x+0, x*1, ...),
and the static peak of live bytes (``analysis.peak_memory``, with buffer reuse)
of ``@main_grad`` before and after the clean-up. A model whose operators are
not all available (or whose gradient cannot be built yet) is reported and
skipped. The cleaned program is also run against the raw one on the NumPy
executor to confirm the results are unchanged.

    .venv/bin/python bench/cleanup_effect.py [--small]
"""

from __future__ import annotations

import time

import numpy as np

import pullback as pb
from pullback.analysis import count_identity_arith, count_like_ops, op_histogram, peak_memory
from pullback.testing import models
from pullback.transform import FirstOrderGradient, standard_cleanup

# the training-step benchmark's sizes (issue 6); --small uses the builders' defaults
SIZES = {
    "mlp": dict(batch=64, sizes=(512, 512, 512, 512, 512)),
    "cnn": dict(batch=32, image=32, channels=(3, 16, 32), classes=10),
    "transformer_layer": dict(batch=8, seq=128, d_model=256, heads=4, d_ff=1024),
}
MODELS = tuple(SIZES)


def _flat(v) -> list:
    out, stack = [], [v]
    while stack:
        x = stack.pop()
        if isinstance(x, (tuple, list)):
            stack.extend(reversed(x))
        else:
            out.append(np.asarray(x))
    return out


def _stats(mod: pb.IRModule) -> tuple:
    return (sum(op_histogram(mod, "main_grad").values()), count_like_ops(mod, "main_grad"),
            count_identity_arith(mod, "main_grad"), peak_memory(mod, "main_grad"))


def measure(name: str, small: bool):
    builder = getattr(models, name, None)
    if builder is None:
        return None, f"no builder pullback.testing.models.{name}"
    try:
        mod, make_inputs = builder() if small else builder(**SIZES[name])
        grad = FirstOrderGradient()(mod)
    except pb.PullbackError as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
    t0 = time.perf_counter()
    clean = standard_cleanup()(grad)
    seconds = time.perf_counter() - t0
    args = make_inputs(0)
    raw = _flat(pb.build(grad)["main_grad"](*args))
    new = _flat(pb.build(clean)["main_grad"](*args))
    same = len(raw) == len(new) and all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(raw, new))
    return (_stats(grad), _stats(clean), seconds, same), None


def main() -> None:
    import sys

    small = "--small" in sys.argv[1:]
    print(f"sizes: {'the builders defaults (--small)' if small else 'those of bench/train_step.py'}")
    head = f"{'model':<18} {'ops':>11} {'like-ops':>9} {'identity':>9} {'peak live bytes':>21} {'cleanup s':>9}  same"
    print(head)
    print("-" * len(head))
    for name in MODELS:
        row, why = measure(name, small)
        if row is None:
            print(f"{name:<18} skipped: {why}")
            continue
        (o0, l0, i0, m0), (o1, l1, i1, m1), secs, same = row
        print(f"{name:<18} {o0:>5}->{o1:<5} {l0:>4}->{l1:<4} {i0:>4}->{i1:<4} {m0:>10}->{m1:<10} {secs:>9.3f}  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
