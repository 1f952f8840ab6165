"""``torch.ao.quantization.prepare_qat``'s default observers: ``FusedMovingAvgObsFakeQuantize`` (ATen's
``fused_moving_avg_obs_fake_quant``: running min/max, scale and zero point chosen in C++, fake quantization).
The running statistics, scales and zero points equal eager's bit for bit, the first batch resizes a per-channel
observer's empty buffers as eager does, and ``disable_observer`` / ``disable_fake_quant`` (flags in buffers) act
on the compiled module as on eager's."""

import copy
import warnings

import numpy as np
import pytest
import torch

import pullback.integrations.torch as pbt

tq = pytest.importorskip("torch.ao.quantization")

# (running min, running max): ranges straddling 0, one-sided, empty (0, 0), never observed (+inf, -inf), subnormal
# (a scale whose float32 reciprocal overflows becomes 0.1), huge, and a zero point ending on .5 before rounding
RANGES = [(-1.0, 1.0), (-0.3, 2.7), (0.5, 3.0), (-4.0, -0.25), (0.0, 0.0), (np.inf, -np.inf), (1e-40, 2e-40),
          (-1e-38, 1e-38), (-3e38, 3e38), (-1.0, 1.55), (-0.5, 0.0), (-2.5, 0.01), (-1e-3, 1e-3),
          (0.0, 1e-5), (-3e-3, 0.0), (-1.0, 127.0 / 128)]


class _Observers(torch.nn.Module):
    """One fused observer per range, the observer off (the running values are the ranges), fake quantization on."""

    def __init__(self, per_channel: bool, qmin: int, qmax: int, symmetric: bool):
        super().__init__()
        lo, hi = (torch.tensor([r[i] for r in RANGES], dtype=torch.float32) for i in (0, 1))
        n = 1 if per_channel else len(RANGES)
        self.register_buffer("lo", lo if per_channel else lo.reshape(n, 1)[:, 0].clone())
        self.register_buffer("hi", hi if per_channel else hi.reshape(n, 1)[:, 0].clone())
        for i in range(n):  # per tensor: scalar running values, one observer each
            self.register_buffer(f"lo{i}", lo.clone() if per_channel else lo[i].clone())
            self.register_buffer(f"hi{i}", hi.clone() if per_channel else hi[i].clone())
            self.register_buffer(f"scale{i}", torch.ones(len(RANGES) if per_channel else 1))
            self.register_buffer(f"zp{i}", torch.zeros(len(RANGES) if per_channel else 1, dtype=torch.int32))
        self.register_buffer("off", torch.tensor([0]))
        self.register_buffer("on", torch.tensor([1]))
        self.n, self.args = n, (0.01, qmin, qmax, 0, per_channel, symmetric)

    def forward(self, x):
        return torch.stack([torch.fused_moving_avg_obs_fake_quant(
            x, self.off, self.on, getattr(self, f"lo{i}"), getattr(self, f"hi{i}"), getattr(self, f"scale{i}"),
            getattr(self, f"zp{i}"), *self.args) for i in range(self.n)])


@pytest.mark.parametrize("per_channel,qmin,qmax,symmetric", [(True, -128, 127, True), (False, 0, 255, False),
                                                             (False, 0, 127, False), (False, -128, 127, True),
                                                             (True, 0, 15, False)])
def test_scales_zero_points_and_values_equal_eager_bit_for_bit(per_channel, qmin, qmax, symmetric):
    model = _Observers(per_channel, qmin, qmax, symmetric)
    x = torch.linspace(-5, 5, len(RANGES) * 7).reshape(len(RANGES), 7)
    eager, mine = copy.deepcopy(model), copy.deepcopy(model)
    want = eager(x)
    got = pbt.compile(mine, (x,))(x)
    assert torch.equal(got, want)
    for (k, a), b in zip(eager.state_dict().items(), mine.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), k


class _QAT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(self.quant(x))))
        return self.dequant(self.fc(x.flatten(1)))


@pytest.mark.parametrize("target", ["torch", "numpy"])
@pytest.mark.parametrize("backend", ["x86", "qnnpack", "x86-fused"])
def test_prepare_qat_trains_like_eager(target, backend):
    """Six SGD steps side by side: the observers watch, then stop (``disable_observer``), fake quantization is
    switched off and on again. Losses, gradients and weights agree; every observer buffer (per-channel ones
    resized by the first batch) equals eager's. ``-fused``: conv, batch norm and ReLU fused first
    (``fuse_modules_qat``: ``ConvBnReLU2d``, which folds the batch norm's statistics into the weight)."""
    torch.manual_seed(0)
    model = _QAT().train()
    if backend.endswith("-fused"):
        backend = backend[: -len("-fused")]
        model = tq.fuse_modules_qat(model, [["conv", "bn"]])
    model.qconfig = tq.get_default_qat_qconfig(backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = tq.prepare_qat(model)
    eager, mine = copy.deepcopy(model), copy.deepcopy(model)
    xs = [torch.randn(2, 3, 8, 8) * (1 + i) for i in range(6)]
    compiled = pbt.compile(mine, (xs[0],), target=target)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, mine)]
    switches = {3: tq.disable_observer, 4: tq.disable_fake_quant, 5: tq.enable_fake_quant}
    for i, x in enumerate(xs):
        for m in (eager, mine):
            m.apply(switches.get(i, lambda _: None))
        losses = []
        for run, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            loss = run(x).square().mean()
            loss.backward()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
        for a, b in zip(eager.parameters(), mine.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
        for opt in opts:
            opt.step()
        for (k, a), b in zip(eager.state_dict().items(), mine.state_dict().values()):
            assert a.shape == b.shape and a.dtype == b.dtype, k
            watched = k.startswith("quant.") or (i == 0 and "weight_fake_quant" in k)
            if k.endswith(("min_val", "max_val", "scale", "zero_point")) and watched:
                assert torch.equal(a, b), (i, k)  # the same tensors observed (the input, the first weights)
            else:
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    if backend == "x86":  # per-channel weight observers: empty buffers until the first batch
        assert model.conv.weight_fake_quant.activation_post_process.min_val.shape == (0,)
        assert mine.conv.weight_fake_quant.activation_post_process.min_val.shape == (8,)
