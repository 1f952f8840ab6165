"""Train an MLP with torch.optim.SGD through pullback, side by side with eager PyTorch.

Run: ``python examples/train_mlp.py`` (50 steps). Per-step losses agree within
1e-4 relative and the final weights within 1e-4 (float32), dropout included:
both sides draw the same masks from the same seeds.
"""

from __future__ import annotations

import sys


def main(steps: int = 50, batch: int = 32, width: int = 64, verbose: bool = True) -> dict:
    import torch
    import torch.nn.functional as F

    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.GELU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 4),
    )
    w_true = torch.randn(16, 4)
    batches = []
    for _ in range(steps):
        x = torch.randn(batch, 16)
        batches.append(((x,), (x @ w_true).argmax(dim=1)))
    return check_side_by_side(train_side_by_side(model, batches, F.cross_entropy, lr=0.1, verbose=verbose), verbose=verbose)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
