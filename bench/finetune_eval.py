"""Fine-tuning and evaluation through ``pullback.integrations.torch.compile`` against PyTorch eager.

Per workload of ``bench/torch_train.py`` (``pullback.testing.torch_models``), in one process, eager and the
pullback targets alternating round by round (so drifts in machine load fall on every row alike):

- ``finetune``: a training step (forward + backward + SGD) with every parameter frozen
  (``requires_grad_(False)``) but the last two (the head's weight and bias): the compiled module
  differentiates only what requires grad, as eager does;
- ``eval``: a forward under ``torch.no_grad()`` in eval mode (``@main`` alone: no residuals).

Prints the median ms per row, its ratio to eager and the medians of each round.

    PYTHONPATH=src python bench/finetune_eval.py [--only resnet,bert] [--targets torch,numpy] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "experiments"))
from common import add_common_args, median_ms, setup  # noqa: E402

WORKLOADS = ("transformer", "bert", "cnn", "resnet", "gpt2")


def steps(name: str, targets: list, small: bool) -> dict:
    """``{(mode, config): callable}`` for one workload: eager and each target, fine-tuning and evaluation."""
    import torch

    import pullback.integrations.torch as pbt
    from pullback.testing.torch_models import make_workload

    wl = make_workload(name, small)
    model, inputs = wl.model, wl.example_inputs
    params = list(model.parameters())
    for p in params[:-2]:
        p.requires_grad_(False)
    opt = torch.optim.SGD(params[-2:], lr=1e-5)
    tuned = {"eager": model}
    tuned.update((t, pbt.compile(model, inputs, target=t)) for t in targets)

    def train_step(m):
        def step():
            opt.zero_grad(set_to_none=True)
            m(*inputs).backward()
            opt.step()
        return step

    def eval_step(m):
        def step():
            with torch.no_grad():
                m(*inputs)
        return step

    out = {("finetune", k): train_step(m) for k, m in tuned.items()}
    model.eval()
    out.update((("eval", k), eval_step(m)) for k, m in tuned.items())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--targets", default="torch,numpy")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--small", action="store_true", help="test-suite sizes")
    add_common_args(ap)
    args = ap.parse_args()
    setup(args)
    targets = [t for t in args.targets.split(",") if t]
    print(f"{'workload':<12s} {'mode':<9s} {'config':<8s} {'ms':>8s} {'x eager':>8s}  rounds")
    for name in args.only.split(","):
        fns = steps(name, targets, args.small)
        for f in fns.values():  # compile every program (the eval ones on their first call) and warm up
            f()
        rounds: dict = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, f in fns.items():
                rounds[k].append(median_ms(f, args.reps))
        for mode in ("finetune", "eval"):
            eager = statistics.median(rounds[(mode, "eager")])
            for config in ["eager"] + targets:
                ms = statistics.median(rounds[(mode, config)])
                each = " / ".join(f"{v:.2f}" for v in rounds[(mode, config)])
                print(f"{name:<12s} {mode:<9s} {config:<8s} {ms:8.2f} {ms / eager:8.2f}  {each}")


if __name__ == "__main__":
    main()
