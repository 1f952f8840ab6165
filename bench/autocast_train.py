"""Mixed-precision training: eager vs pullback, both inside ``torch.autocast("cpu", dtype=torch.bfloat16)``.

The workloads of ``bench/torch_train.py`` (TransformerEncoderLayer, BertLayer, the BN-CNN, ResNet-18, the tiny
GPT-2), a step being forward (inside the autocast region) + backward + SGD update. One process per workload;
eager's steps and pullback's (``compile``, torch target, ``--policy``) alternate one by one, so the ratio ``x
eager`` is robust to the machine's speed drifting. Columns: eager's float32 step (no autocast: what autocast buys
eager on this CPU), eager's and pullback's autocast steps (medians), their ratio, pullback's first step (export
inside the region, AD, clean-up, partition, build, the step), the bytes each saves for the backward (parameters
and inputs included, as ``torch_train.py`` counts them), and the two losses of the first step.

glibc's malloc is tuned as in ``torch_train.py`` (``runtime.tuning.keep_freed_memory``: freed memory kept for the
next step instead of page-faulted afresh) unless ``--no-tune-malloc``.

Usage: ``python bench/autocast_train.py [--only cnn,resnet] [--reps 20] [--threads 2] [--no-tune-malloc] [--json F]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_train import WORKLOAD_NAMES, child_row, saved_mb, set_threads  # noqa: E402


def run(workload: str, reps: int, warmup: int, threads: int, policy: str, tune_malloc: bool = True) -> dict:
    import torch

    from pullback.integrations.torch import compile as pb_compile
    from pullback.testing.torch_models import make_workload

    set_threads(threads)
    if tune_malloc:  # as torch_train.py: eager and pullback alternate in one process, both get it
        from pullback.runtime.tuning import keep_freed_memory

        keep_freed_memory()
    wl = make_workload(workload)
    model, inputs = wl.model, wl.example_inputs
    eager = copy.deepcopy(model)

    def region():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    def stepper(m, autocast: bool = True):
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=True)
            with region() if autocast else torch.autocast("cpu", enabled=False):
                loss = m(*inputs)
            loss.backward()
            opt.step()
            return loss

        return step

    plain = stepper(copy.deepcopy(model), autocast=False)
    eager_step = stepper(eager)
    t0 = time.perf_counter()
    with region():
        compiled = pb_compile(model, inputs, policy=policy)
    ours = stepper(compiled)
    losses = (float(eager_step()), float(ours()))
    first = time.perf_counter() - t0
    for _ in range(warmup):
        plain(), eager_step(), ours()
    times: dict = {"float32": [], "eager": [], "pullback": []}
    for _ in range(reps):
        for key, step in (("float32", plain), ("eager", eager_step), ("pullback", ours)):
            t = time.perf_counter()
            step()
            times[key].append(time.perf_counter() - t)
    row = {k + "_ms": statistics.median(v) * 1e3 for k, v in times.items()}
    row["x_eager"] = row["pullback_ms"] / row["eager_ms"]
    row["first_s"] = first
    row["losses"] = losses
    with region():
        row["eager_saved_mb"], row["pullback_saved_mb"] = saved_mb(eager, compiled, model, inputs, activations=False)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(WORKLOAD_NAMES))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policy", default="save_all")
    ap.add_argument("--no-tune-malloc", action="store_true",
                    help="leave glibc's malloc as it is (default: runtime.tuning.keep_freed_memory, as torch_train.py)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("ROW " + json.dumps(run(args.child, args.reps, args.warmup, args.threads, args.policy,
                                      not args.no_tune_malloc)), flush=True)
        return
    rows = {}
    print(f"autocast(bfloat16) training, {args.threads} threads, {args.reps} alternating steps, policy {args.policy}, "
          f"malloc tuned: {not args.no_tune_malloc}")
    print(f"{'workload':12s} {'f32 eager':>10s} {'eager':>8s} {'pullback':>9s} {'x eager':>8s} {'first s':>8s} "
          f"{'saved MB eager/pb':>18s}  losses (eager, pullback)")
    for w in args.only.split(","):
        cmd = [sys.executable, __file__, "--child", w, "--reps", str(args.reps), "--warmup", str(args.warmup),
               "--threads", str(args.threads), "--policy", args.policy] + (["--no-tune-malloc"] if args.no_tune_malloc else [])
        r, why = child_row(cmd)
        if r is None:
            print(f"{w:12s} failed: {why}")
            continue
        rows[w] = r
        print(f"{w:12s} {r['float32_ms']:10.1f} {r['eager_ms']:8.1f} {r['pullback_ms']:9.1f} {r['x_eager']:8.2f} "
              f"{r['first_s']:8.2f} {r['eager_saved_mb']:8.1f} / {r['pullback_saved_mb']:6.1f}  "
              f"({r['losses'][0]:.6g}, {r['losses'][1]:.6g})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
