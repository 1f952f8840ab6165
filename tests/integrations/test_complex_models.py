"""A model with Fourier transforms and complex parameters (a Fourier Neural Operator's spectral convolution) trains
through pullback like eager PyTorch: ``compile`` on every target and the ``torch.compile`` backend."""

from __future__ import annotations

import copy
import functools

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from pullback.integrations.torch import DEFAULT_TARGET  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402


class SpectralConv1d(nn.Module):
    """FNO's layer: rfft, a complex linear map on the lowest ``modes`` frequencies, irfft back."""

    def __init__(self, channels: int, modes: int):
        super().__init__()
        self.modes = modes
        self.weight = nn.Parameter(torch.randn(channels, channels, modes, dtype=torch.cfloat) / channels)

    def forward(self, x):
        spec = torch.fft.rfft(x, norm="ortho")
        low = torch.einsum("bix,iox->box", spec[..., : self.modes], self.weight)
        out = torch.zeros(x.shape[0], x.shape[1], x.shape[-1] // 2 + 1, dtype=torch.cfloat)
        out[..., : self.modes] = low
        return torch.fft.irfft(out, n=x.shape[-1], norm="ortho")


class FNO1d(nn.Module):
    def __init__(self, channels: int = 4, modes: int = 5):
        super().__init__()
        self.lift = nn.Linear(1, channels)
        self.spectral = SpectralConv1d(channels, modes)
        self.skip = nn.Conv1d(channels, channels, 1)
        self.proj = nn.Linear(channels, 1)

    def forward(self, u):  # u: (batch, points, 1)
        h = self.lift(u).transpose(1, 2)
        h = F.gelu(self.spectral(h) + self.skip(h))
        return self.proj(h.transpose(1, 2)).abs().mean() + torch.view_as_real(self.spectral.weight).square().mean()


def _train(model, step_model, x, steps: int = 5) -> list:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        loss = step_model(x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_fno_trains_like_eager_through_compile(target):
    torch.manual_seed(0)
    model, x = FNO1d(), torch.randn(3, 16, 1)
    ref = copy.deepcopy(model)
    want = _train(ref, ref, x)
    got = _train(model, pb_compile(model, (x,), target=target), x)
    assert got == pytest.approx(want, rel=1e-5)
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert model.spectral.weight.dtype == torch.cfloat


def test_fno_trains_like_eager_through_the_dynamo_backend():
    import torch._dynamo

    from pullback.integrations.dynamo_backend import pullback_backend

    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = FNO1d(), torch.randn(3, 16, 1)
    ref = copy.deepcopy(model)
    want = _train(ref, ref, x)
    backend = functools.partial(pullback_backend, target=DEFAULT_TARGET)
    got = _train(model, torch.compile(model, backend=backend, dynamic=False), x)
    assert got == pytest.approx(want, rel=1e-5)
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    torch._dynamo.reset()


def test_a_complex_result_takes_its_gradient_from_eager_code(target):
    """The compiled module returns a spectrum; the loss on it is computed eagerly (a complex cotangent comes back)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())

    class Spectrum(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = model

        def forward(self, x):
            return torch.fft.rfft(self.body(x))

    x = torch.randn(3, 8)
    ref = copy.deepcopy(Spectrum())
    (ref(x) * (1 - 2j)).abs().sum().backward()
    cm = pb_compile(Spectrum(), (x,), target=target)
    spec = cm(x)
    assert spec.dtype == torch.complex64
    (spec * (1 - 2j)).abs().sum().backward()
    for a, b in zip(model.parameters(), ref.body.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_fno_gradient_program_survives_cleanup_fusion_and_the_text_format():
    """FirstOrderGradient -> standard_cleanup -> FuseOps -> print -> parse: the same values on every target."""
    import numpy as np

    import pullback as pb
    from pullback.frontend import from_torch

    torch.manual_seed(0)
    x = torch.randn(3, 16, 1)
    mod, params = from_torch(FNO1d(), (x,))
    grad = pb.transform.FirstOrderGradient()(mod)
    fused = pb.transform.FuseOps()(pb.transform.standard_cleanup()(grad))
    back = pb.parse(pb.astext(fused))
    assert pb.structural_equal(back, fused)
    args = [x.numpy()] + [np.asarray(v) for v in params.values()]
    want_value, want_grads = pb.build(grad)["main_grad"](*args)
    for target in ("numpy", "torch", "jax"):
        pytest.importorskip(target)
        got = args if target != "torch" else [torch.from_numpy(a) for a in args]
        value, grads = pb.build(back, target=target)["main_grad"](*got)
        np.testing.assert_allclose(np.asarray(value), want_value, rtol=1e-6)
        for g, w in zip(grads, want_grads):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6)
