"""``torch.cond`` imports as pullback's ``If``: only the taken branch runs, its gradient flows through it, and a
model branching with it trains like eager on every target and through both compile routes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pullback as pb  # noqa: E402
from pullback.frontend import import_torch, main_inputs  # noqa: E402
from pullback.integrations.torch import train_side_by_side  # noqa: E402


class Gated(nn.Module):
    """Branches on the sign of a hidden sum: two outputs per branch, a parameter read inside one of them, and a
    ``torch.cond`` nested in the other."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        h = self.a(x)

        def positive(t):
            return t.relu() * self.scale, t.sum(0)

        def negative(t):
            inner = torch.cond(t.mean() > -0.5, lambda u: u.tanh(), lambda u: u.sigmoid(), (t,))
            return inner, t.square().sum(0)

        y, s = torch.cond(h.sum() > 0, positive, negative, (h,))
        return self.b(y).square().mean() + s.sum()


def _inputs(kind: str, dtype=torch.float64):
    """An input whose hidden sum takes the branch ``kind`` (found by search, the model seeded)."""
    torch.manual_seed(0)
    model = Gated().to(dtype)
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(3, 4, generator=g, dtype=dtype)
        h = model.a(x)
        taken = "positive" if h.sum() > 0 else "inner-tanh" if h.mean() > -0.5 else "inner-sigmoid"
        if taken == kind:
            return model, x
    raise AssertionError(kind)


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("kind", ["positive", "inner-tanh", "inner-sigmoid"])
def test_cond_imports_as_if_with_eagers_value_and_gradients(kind, target):
    pytest.importorskip(target)
    model, x = _inputs(kind)
    prog = import_torch(model, (x,))
    assert any(isinstance(n, pb.If) for n in pb.ir.traversal.post_order(prog.mod["main"].body))
    mod = pb.transform.FirstOrderGradient(wrt=prog.trainable)(prog.mod)
    out, grads = pb.build(mod, target=target)["main_grad"](*main_inputs(prog, [x]))
    want = model(x)
    want.backward()
    np.testing.assert_allclose(np.asarray(out), want.item(), rtol=1e-12)
    by_name = dict(model.named_parameters())
    for name, g in zip(prog.trainable, grads):
        key = prog.state_names[name][0]
        np.testing.assert_allclose(np.asarray(g), by_name[key].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("route", ["export", "dynamo"])
def test_a_model_branching_with_cond_trains_like_eager(route):
    """Steps taking every branch: the losses and final weights equal eager's (float64)."""
    model, _ = _inputs("positive")
    batches = [((_inputs(kind)[1],), None) for kind in ("positive", "inner-tanh", "inner-sigmoid", "positive")]
    torch._dynamo.reset()
    out = train_side_by_side(model, batches, lambda loss, _: loss, route=route, verbose=False)
    torch._dynamo.reset()
    np.testing.assert_allclose(out["pullback"], out["eager"], rtol=1e-12)
    assert out["max_weight_diff"] <= 1e-13
