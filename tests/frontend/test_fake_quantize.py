"""Fake quantization (quantization-aware training): ``torch.fake_quantize_per_tensor_affine`` and
``..._per_channel_affine`` give eager's values bit for bit and its straight-through gradient (``g`` inside the
range, zero where the value was clamped)."""

import numpy as np
import pytest
import torch

import pullback as pb
from pullback.frontend.torch_importer import from_torch
from pullback.integrations.torch import check_side_by_side, train_side_by_side


class _PerTensor(torch.nn.Module):
    def __init__(self, scale=0.1, zero_point=3, qmin=-20, qmax=20):
        super().__init__()
        self.lin = torch.nn.Linear(4, 6)
        self.q = (scale, zero_point, qmin, qmax)

    def quantize(self, h):
        return torch.fake_quantize_per_tensor_affine(h, *self.q)

    def forward(self, x):
        return self.quantize(self.lin(x))


class _PerChannel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 6)
        self.register_buffer("scale", torch.tensor([0.05, 0.1, 0.2, 0.07, 0.3, 0.01]))
        self.register_buffer("zero_point", torch.tensor([0, 1, -2, 3, 0, 5], dtype=torch.int32))

    def quantize(self, h):
        return torch.fake_quantize_per_channel_affine(h, self.scale, self.zero_point, 1, -8, 7)

    def forward(self, x):
        return self.quantize(self.lin(x))


@pytest.mark.parametrize("make", [_PerTensor, _PerChannel], ids=["per-tensor", "per-channel"])
def test_values_and_straight_through_gradient_equal_eager(make):
    torch.manual_seed(0)
    model = make()
    x = torch.randn(16, 4) * 3
    mod, params = from_torch(model, (x,))
    grad = pb.build(pb.transform.FirstOrderGradient(mode="vjp")(mod))["main_grad"]
    ct = torch.randn(16, 6)
    out, grads = grad(x.numpy(), *params.values(), ct.numpy())
    xr = x.clone().requires_grad_(True)
    y = model(xr)
    (y * ct).sum().backward()
    np.testing.assert_array_equal(out, y.detach().numpy())  # bit for bit
    h = model.lin(x).detach().requires_grad_(True)
    (inside,) = torch.autograd.grad(model.quantize(h).sum(), h)
    assert 0 < float(inside.mean()) < 1  # some values clamped (zero gradient there), some not
    for got, want in zip(grads, [xr.grad] + [p.grad for p in model.parameters()]):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["torch", "numpy"])
def test_quantization_aware_training_steps_like_eager(target):
    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = _PerTensor(scale=0.05, zero_point=0, qmin=-64, qmax=63)

        def forward(self, x):
            return self.net(x).pow(2).mean()

    torch.manual_seed(0)
    batches = [((torch.randn(8, 4),), None) for _ in range(3)]
    result = train_side_by_side(Loss(), batches, lambda loss, _: loss, target=target, verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-6, verbose=False)


def test_ties_round_half_to_even_as_in_eager():
    class Quantize(torch.nn.Module):
        def forward(self, x):
            return torch.fake_quantize_per_tensor_affine(x, 0.5, 1, -4, 3)

    x = torch.tensor([0.25, 0.75, -0.25, -0.75, 1.25, 2.75, 9.0, -9.0])  # x / 0.5 = +-0.5, +-1.5, 2.5, 5.5: ties
    mod, _ = from_torch(Quantize(), (x,))
    np.testing.assert_array_equal(pb.build(mod)["main"](x.numpy()), Quantize()(x).numpy())


def test_the_cachemask_operators_mask_equals_eager():
    """The mask output of ATen's ``fake_quantize_*_cachemask`` (True where the value was not clamped; NaN is
    clamped), per tensor and per channel, when a forward reads it."""

    class Masks(torch.nn.Module):
        def forward(self, x):
            per_tensor = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 3, -20, 20)[1]
            scale, zp = torch.tensor([0.05, 0.3, 0.1]), torch.tensor([0, 2, -1], dtype=torch.int32)
            per_channel = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(x, scale, zp, 1, -8, 7)[1]
            return per_tensor.float() + 2 * per_channel.float()

    x = torch.randn(5, 3) * 3
    x[0, 0] = float("nan")
    mod, params = from_torch(Masks(), (x,))
    got = pb.build(mod)["main"](x.numpy(), *params.values())
    want = Masks()(x).numpy()
    assert 0 < (want == 3).sum() < want.size  # some values inside both ranges, some clamped
    np.testing.assert_array_equal(got, want)
