"""Bilinear resizing, Mish and binary cross-entropy with logits imported as one operator each (``image.resize2d``,
``nn.mish``, ``nn.binary_cross_entropy_with_logits``: ATen's kernels on torch, where PyTorch's decompositions take
gathers, blends and scatters, or a dozen small operators), trained like eager."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pullback as pb  # noqa: E402
from pullback.frontend import import_torch, main_inputs  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402


class Decoder(nn.Module):
    """A segmentation head's tail: a convolution, Mish, a bilinear resize (by a factor or to a size, corners
    aligned or not), a skip connection resized down."""

    def __init__(self, align_corners: bool, by_size: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.align_corners, self.by_size = align_corners, by_size

    def forward(self, x):
        h = F.mish(self.conv(x))
        if self.by_size:
            up = F.interpolate(h, size=(11, 13), mode="bilinear", align_corners=self.align_corners)
        else:
            up = F.interpolate(h, scale_factor=1.5, mode="bilinear", align_corners=self.align_corners)
        skip = F.interpolate(x, size=up.shape[2:], mode="bilinear", align_corners=self.align_corners)
        logits = up.sum(1, keepdim=True) * skip
        return F.binary_cross_entropy_with_logits(logits, (skip > 0).to(x.dtype), pos_weight=torch.tensor([2.0], dtype=x.dtype))


def _ops(fn) -> set:
    return {n.op.name for n in pb.ir.traversal.post_order(fn.body) if isinstance(n, pb.Call) and hasattr(n.op, "name")}


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("by_size", [False, True])
def test_bilinear_resize_and_mish_import_as_one_operator_each(align_corners, by_size):
    torch.manual_seed(0)
    model = Decoder(align_corners, by_size).double()
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64)
    prog = import_torch(model, (x,))
    ops = _ops(prog.main)
    assert {"image.resize2d", "nn.mish", "nn.binary_cross_entropy_with_logits"} <= ops, sorted(ops)
    assert not ops & {"take", "tanh", "nn.softplus", "log1p"}, sorted(ops)
    for target in ("numpy", "jax", "torch"):
        got = pb.build(prog.mod, target=target)["main"](*main_inputs(prog, (x,)))
        np.testing.assert_allclose(np.asarray(got), model(x).item(), rtol=1e-12)


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
def test_a_decoder_with_bilinear_resizing_and_mish_trains_like_eager(target):
    torch.manual_seed(1)
    model = Decoder(False, False).double()
    eager, compiled = copy.deepcopy(model), pb_compile(model, (torch.randn(2, 3, 7, 9, dtype=torch.float64),), target=target)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for _ in range(3):
        x = torch.randn(2, 3, 7, 9, dtype=torch.float64)
        losses = []
        for f, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            loss = f(x)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        np.testing.assert_allclose(losses[1], losses[0], rtol=1e-12)
    for p, q in zip(eager.parameters(), model.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-11, atol=1e-13)



class Distilled(nn.Module):
    """Soft targets that need a gradient: a student fits a trainable teacher's probabilities, per-element weights."""

    def __init__(self):
        super().__init__()
        self.student, self.teacher = nn.Linear(5, 3), nn.Linear(5, 3)

    def forward(self, x, w):
        return F.binary_cross_entropy_with_logits(self.student(x), torch.sigmoid(self.teacher(x)), weight=w, reduction="sum")


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
def test_binary_cross_entropy_with_logits_differentiates_its_targets_like_eager(target):
    torch.manual_seed(3)
    model = Distilled().double()
    x, w = torch.randn(4, 5, dtype=torch.float64), torch.rand(4, 3, dtype=torch.float64)
    eager = copy.deepcopy(model)
    eager(x, w).backward()
    assert "nn.binary_cross_entropy_with_logits" in _ops(import_torch(model, (x, w)).main)
    compiled = pb_compile(model, (x, w), target=target)
    compiled(x, w).backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert p.grad.abs().sum() > 0, name
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-12, atol=1e-14)
