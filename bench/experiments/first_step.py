"""Where the first step's seconds go (issue 14: first step < 3 s): each stage of
``pullback.integrations.torch.compile`` timed separately, per workload and target.

Stages: ``torch.export`` (+ Core-ATen decompositions), import into pullback, ``FirstOrderGradient``,
``standard_cleanup``, ``PartitionForwardBackward``, ``build``, the first forward + backward call (the
jax target traces and compiles there).

    PYTHONPATH=src .venv/bin/python bench/experiments/first_step.py [--only transformer,resnet] [--targets numpy,jax]
"""

from __future__ import annotations

import argparse
import time


def stages(name: str, target: str) -> dict:
    import numpy as np

    from pullback.frontend.torch_importer import export, import_exported
    from pullback.integrations.torch import float_wrt
    from pullback.runtime import build
    from pullback.testing.torch_models import make_workload
    from pullback.transform import FirstOrderGradient, PartitionForwardBackward, standard_cleanup

    wl = make_workload(name)
    t = {}
    t0 = time.perf_counter()
    ep = export(wl.model, wl.example_inputs)
    t["export"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prog = import_exported(ep)
    t["import"] = time.perf_counter() - t0
    wrt = float_wrt(prog, prog.inputs) + prog.trainable
    t0 = time.perf_counter()
    mod = FirstOrderGradient("main", wrt=wrt, mode="vjp")(prog.mod)
    t["AD"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    mod = standard_cleanup()(mod)
    t["cleanup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    mod = PartitionForwardBackward("main_grad")(mod)
    t["partition"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe = build(mod, target=target)
    fwd, bwd = exe["main_fwd"], exe["main_bwd"]
    t["build"] = time.perf_counter() - t0
    state = dict(wl.model.named_parameters())
    state.update(wl.model.named_buffers())
    arrays = [x.numpy() for x in wl.example_inputs] + [state[prog.state_key(n)].detach().numpy() for n in prog.params]
    out_types = [mod["main_fwd"].body.checked_type.fields[0]]
    t0 = time.perf_counter()
    out, res = fwd(*arrays)
    ct = tuple(np.ones(ty.shape, ty.dtype) for ty in out_types[0].fields) if not prog.single_output else np.ones((), "float32")
    bwd(*res, ct)
    t["first call"] = time.perf_counter() - t0
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="transformer,bert,cnn,resnet")
    ap.add_argument("--targets", default="numpy,jax")
    args = ap.parse_args()
    for w in args.only.split(","):
        for tg in args.targets.split(","):
            t = stages(w, tg)
            print(f"{w:<12s}{tg:<6s} total {sum(t.values()):5.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in t.items()))


if __name__ == "__main__":
    main()
