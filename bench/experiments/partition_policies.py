"""save_all vs min_cut: residual bytes and forward+backward time, per workload, target and cost table.

For each workload the vjp-mode gradient is built as the integration builds it (import, FirstOrderGradient,
standard_cleanup), then partitioned by ``PartitionForwardBackward`` under ``save_all`` and ``min_cut`` with
each cost table (``--costs``: the ``RECOMPUTE_NS`` target whose recomputation costs the cut weighs) and
budget (``--budgets``: ``recompute_ns_per_byte``, the most recomputation time one byte is worth). Each
partition is built for each executor (``--targets``) and ``@main_fwd`` + ``@main_bwd`` are timed on the
process's CPU time, rounds interleaved across the configurations (the machine is shared; ``--threads 1``
for figures that other processes barely move). Bytes: ``total`` counts every residual (a parameter once,
as PyTorch's saved-tensor hooks count storages), ``act`` leaves out the residuals that are parameters
(weights and inputs the caller holds anyway). Ratios are to ``save_all`` on the same executor. The ``eager``
row is PyTorch's: the storages autograd saves in one forward (saved-tensor hooks, as ``bench/torch_train.py``
counts them; ``act`` without parameters and inputs), untimed.

    .venv/bin/python bench/experiments/partition_policies.py [--only transformer,bert] [--targets numpy,jax]
        [--costs numpy] [--budgets 1,4] [--rounds 5] [--reps 3] [--threads 1] [--small]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import add_common_args, setup

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torch_train import _saved_bytes_eager  # noqa: E402


def gradient_program(name: str, small: bool):
    """The workload's cleaned vjp-mode gradient module and its inputs (NumPy arrays, as the integration passes)."""
    import numpy as np

    from pullback.frontend.torch_importer import export, import_exported, tied_keys
    from pullback.integrations.torch import draw_masks, float_wrt
    from pullback.testing.torch_models import make_workload
    from pullback.transform import FirstOrderGradient, standard_cleanup

    wl = make_workload(name, small)
    model, inputs = wl.model, wl.example_inputs
    prog = import_exported(export(model, inputs), tied=tied_keys(model))
    wrt = float_wrt(prog, prog.inputs) + prog.trainable
    mod = standard_cleanup()(FirstOrderGradient("main", wrt=wrt, mode="vjp")(prog.mod))
    state = dict(model.named_parameters(remove_duplicate=False))
    state.update(model.named_buffers(remove_duplicate=False))
    tensors = list(inputs) + [state[prog.state_key(n)] for n in prog.params] + draw_masks(prog, inputs)
    return mod, [np.array(t.detach().numpy()) for t in tensors]


def _cotangent(out):
    import numpy as np

    if isinstance(out, tuple):
        return tuple(_cotangent(o) for o in out)
    a = np.asarray(out)
    return np.ones(a.shape, a.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="transformer,bert")
    ap.add_argument("--targets", default="numpy,jax", help="executors to time (numpy, jax, torch)")
    ap.add_argument("--costs", default="numpy", help="RECOMPUTE_NS tables min_cut is run with")
    ap.add_argument("--budgets", default="1,4", help="recompute_ns_per_byte values min_cut is run with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="fwd+bwd runs per configuration and round (the round keeps the min)")
    ap.add_argument("--small", action="store_true")
    add_common_args(ap)
    args = ap.parse_args()
    args.cpu_clock = True
    setup(args)
    import torch

    from pullback.analysis.saved import saved_bytes
    from pullback.runtime import build
    from pullback.transform import PartitionForwardBackward

    policies = [("save_all", "numpy", None)] + [("min_cut", c, float(b)) for c in args.costs.split(",")
                                                for b in args.budgets.split(",")]
    print(f"threads {args.threads}; CPU ms of @main_fwd + @main_bwd: median over {args.rounds} interleaved rounds "
          f"(best of {args.reps} per round)\n")
    print(f"{'workload':<12s}{'exec':<7s}{'policy (costs, ns/B)':<21s}{'total MB':>9s}{'':>6s}{'act MB':>8s}{'':>6s}"
          f"{'fwd+bwd ms':>11s}{'':>7s}{'partition s':>12s}")
    for name in args.only.split(","):
        mod, inputs = gradient_program(name, args.small)
        parts = {}
        for policy, costs, budget in policies:
            t0 = time.perf_counter()
            opts = {} if budget is None else dict(recompute_ns_per_byte=budget)
            pm = PartitionForwardBackward(policy=policy, target=costs, **opts)(mod)
            parts[(policy, costs, budget)] = (pm, time.perf_counter() - t0)
        eager_tot, eager_act = eager_saved_bytes(name, args.small)
        for target in args.targets.split(","):
            runs = {}
            for key, (pm, _) in parts.items():
                exe = build(pm, target=target)
                args_in = [torch.from_numpy(a) for a in inputs] if target == "torch" else inputs
                out, res = exe["main_fwd"](*args_in)
                ct = _cotangent(out if target == "numpy" else _to_numpy(out))
                if target == "torch":
                    ct = _to_torch(ct)

                def run(exe=exe, args_in=args_in, ct=ct):
                    _, r = exe["main_fwd"](*args_in)
                    exe["main_bwd"](*r, ct)

                run()
                runs[key] = (run, [])
            for _ in range(args.rounds):
                for run, times in runs.values():
                    best = float("inf")
                    for _ in range(args.reps):
                        t0 = time.process_time()
                        run()
                        best = min(best, time.process_time() - t0)
                    times.append(best)
            base_key = policies[0]
            base_t = statistics.median(runs[base_key][1])
            base_pm = parts[base_key][0]
            base_tot, base_act = saved_bytes(base_pm), saved_bytes(base_pm, inputs=False)
            for key, (pm, part_s) in parts.items():
                t = statistics.median(runs[key][1])
                tot, act = saved_bytes(pm), saved_bytes(pm, inputs=False)
                label = key[0] if key[0] == "save_all" else f"{key[0]} ({key[1]}, {key[2]:g})"
                print(f"{name:<12s}{target:<7s}{label:<21s}{tot / 2**20:>9.2f}{tot / base_tot:>6.0%}{act / 2**20:>8.2f}"
                      f"{act / base_act:>6.0%}{t * 1e3:>11.1f}{t / base_t:>6.2f}x{part_s:>12.2f}")
        print(f"{name:<12s}{'torch':<7s}{'eager':<21s}{eager_tot / 2**20:>9.2f}{eager_tot / base_tot:>6.0%}"
              f"{eager_act / 2**20:>8.2f}{eager_act / base_act:>6.0%}")
        print()


def eager_saved_bytes(name: str, small: bool) -> tuple[int, int]:
    """(all, activations) bytes PyTorch's autograd saves in one forward of the workload."""
    from pullback.testing.torch_models import make_workload

    wl = make_workload(name, small)
    inputs = wl.example_inputs
    held = list(wl.model.parameters()) + list(wl.model.buffers()) + list(inputs)
    return _saved_bytes_eager(lambda: wl.model(*inputs), held)


def _to_numpy(x):
    import numpy as np

    return tuple(_to_numpy(v) for v in x) if isinstance(x, tuple) else np.asarray(x)


def _to_torch(x):
    import torch

    return tuple(_to_torch(v) for v in x) if isinstance(x, tuple) else torch.from_numpy(x)


if __name__ == "__main__":
    main()
