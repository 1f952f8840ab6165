"""Training on sequences of varying length: PyTorch eager against pullback's compiled module with automatic dynamic
sizes (the default: the second shape is exported with the length dynamic) and with one export per shape
(``dynamic=False``).

For each sequence workload of ``bench/torch_train.py`` (transformer layer, BERT layer, tiny GPT-2; torch target):

- ``steady``: median step ms at the bench's length (128) of eager, of the static program (the first shape's) and
  of the dynamic program (after a call of another length), and dynamic / static;
- ``loop``: seconds for a loop of ``--steps`` SGD steps over lengths drawn from [64, 128] (a padded batch per
  step), first call included, eager against both pullback modes, with the number of exports each made.

    PYTHONPATH=src .venv/bin/python bench/dynamic_lengths.py [--only transformer,bert,gpt2] [--steps 24]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_train import set_threads  # noqa: E402

WORKLOADS = ("transformer", "bert", "gpt2")


def _cut(inputs, length):
    """The batch with dimension 1 (the sequence) of every input of rank 2 or more cut to ``length``."""
    return [x[:, :length].contiguous() if x.ndim >= 2 else x for x in inputs]


def steady(name: str, reps: int) -> dict:
    """Median step ms of eager, the static program and the dynamic program at the full length (alternating)."""
    from pullback.integrations.torch import compile as pb_compile
    from pullback.testing.torch_models import make_workload

    wl = make_workload(name)
    model, inputs = wl.model, wl.example_inputs
    full = inputs[0].shape[1]
    static = pb_compile(copy.deepcopy(model), inputs, target="torch", dynamic=False)
    dynamic = pb_compile(copy.deepcopy(model), _cut(inputs, full - 1), target="torch")
    dynamic(*_cut(inputs, full - 2)).backward()  # the second shape: the length is dynamic from here
    eager = copy.deepcopy(model)
    runs = {"eager": eager, "static": static, "dynamic": dynamic}
    for m in runs.values():
        for _ in range(3):
            m(*inputs).backward()
    times = {k: [] for k in runs}
    for _ in range(reps):
        for k, m in runs.items():
            t0 = time.perf_counter()
            m(*inputs).backward()
            times[k].append(1e3 * (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in times.items()}


def loop(name: str, steps: int, seed: int = 0) -> dict:
    """Seconds for ``steps`` SGD steps over random lengths in [64, 128], first call included, and exports made."""
    import random

    import torch

    from pullback.integrations.torch import compile as pb_compile
    from pullback.testing.torch_models import make_workload

    wl = make_workload(name)
    model, inputs = wl.model, wl.example_inputs
    rng = random.Random(seed)
    lengths = [rng.randint(64, inputs[0].shape[1]) for _ in range(steps)]
    out = {}
    for label, options in (("eager", None), ("automatic", {}), ("per shape", {"dynamic": False})):
        m = copy.deepcopy(model)
        run = m if options is None else None
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        t0 = time.perf_counter()
        for length in lengths:
            batch = _cut(inputs, length)
            if run is None:
                run = pb_compile(m, batch, target="torch", **options)
            with warnings.catch_warnings():  # the per-shape row's warning at its 4th export is the point measured
                warnings.simplefilter("ignore", UserWarning)
                loss = run(*batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        out[label] = (time.perf_counter() - t0, None if options is None else len(run._imports))
    out["lengths"] = len(set(lengths))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    set_threads(args.threads)
    names = [n for n in args.only.split(",") if n]
    print(f"steady state at the bench's length (median ms, {args.reps} alternating rounds, torch target)")
    print(f"{'workload':12s} {'eager':>8s} {'static':>8s} {'dynamic':>8s} {'dyn/static':>10s} {'dyn/eager':>9s}")
    for name in names:
        r = steady(name, args.reps)
        print(f"{name:12s} {r['eager']:8.1f} {r['static']:8.1f} {r['dynamic']:8.1f} {r['dynamic'] / r['static']:10.3f} "
              f"{r['dynamic'] / r['eager']:9.3f}")
    print(f"\na loop of {args.steps} steps over lengths drawn from [64, 128] (seconds, first call included; exports)")
    print(f"{'workload':12s} {'lengths':>7s} {'eager':>8s} {'automatic':>14s} {'per shape':>14s}")
    for name in names:
        r = loop(name, args.steps)
        cells = [f"{r[k][0]:8.2f} ({r[k][1]:>2d})" for k in ("automatic", "per shape")]
        print(f"{name:12s} {r['lengths']:7d} {r['eager'][0]:8.2f} {cells[0]:>14s} {cells[1]:>14s}")


if __name__ == "__main__":
    main()
