"""Train a small CNN (conv + batch norm + pooling) with torch.optim.SGD through pullback,
side by side with eager PyTorch.

Run: ``python examples/train_cnn.py`` (50 steps). Per-step losses agree within
1e-4 relative and the final weights (running statistics included) within 1e-4.
"""

from __future__ import annotations

import sys


def main(steps: int = 50, batch: int = 16, size: int = 12, verbose: bool = True) -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(8, 3),
    )
    batches = []
    for _ in range(steps):
        x = torch.randn(batch, 3, size, size)
        batches.append(((x,), (x.mean(dim=(1, 2, 3)) * 10).long().clamp(-1, 1) + 1))
    return check_side_by_side(train_side_by_side(model, batches, F.cross_entropy, lr=0.05, verbose=verbose), verbose=verbose)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
