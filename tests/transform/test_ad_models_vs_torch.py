"""FirstOrderGradient on real models against PyTorch autograd and finite differences.

The MLP, CNN and transformer-layer programs of ``pullback.testing.models`` are
written again with torch.nn.functional; losses and every parameter gradient
must agree (float64), and a finite-difference check covers each model too.
"""

import numpy as np
import pytest

import pullback as pb
from pullback.testing import check_grad
from pullback.testing.models import cnn, mlp, transformer_layer

torch = pytest.importorskip("torch")
F = torch.nn.functional


def torch_mlp(x, *ws):
    h = x
    for w in ws:
        h = torch.tanh(F.linear(h, w))
    return h.sum()


def torch_cnn(x, w1, w2, wd, bd, y):
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, padding=1)), 2, 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, w2, padding=1)), 2, 2)
    h = h.mean(dim=(2, 3))
    logits = F.linear(h, wd, bd)
    return -(F.log_softmax(logits, dim=-1) * y).sum() / x.shape[0]


def make_torch_transformer(batch, seq, d_model, heads):
    dh = d_model // heads

    def fwd(x, wq, bq, wk, bk, wv, bv, wo, bo, g1, b1n, w1, b1, w2, b2, g2, b2n):
        B, S, D = x.shape
        x2 = x.reshape(B * S, D)

        def split(h):
            return h.reshape(B, S, heads, dh).permute(0, 2, 1, 3).reshape(B * heads, S, dh)

        q, k, v = split(F.linear(x2, wq, bq)), split(F.linear(x2, wk, bk)), split(F.linear(x2, wv, bv))
        p = torch.softmax(q @ k.transpose(1, 2) / np.sqrt(dh), dim=-1)
        a = (p @ v).reshape(B, heads, S, dh).permute(0, 2, 1, 3).reshape(B * S, D)
        h1 = F.layer_norm(x2 + F.linear(a, wo, bo), (D,), g1, b1n)
        ff = F.linear(F.gelu(F.linear(h1, w1, b1)), w2, b2)
        return F.layer_norm(h1 + ff, (D,), g2, b2n).sum()

    return fwd


CASES = {
    "mlp": (lambda: mlp(batch=4, sizes=(5, 7, 3)), torch_mlp),
    "cnn": (lambda: cnn(batch=2, image=8, channels=(2, 3, 4), classes=5), torch_cnn),
    "transformer": (lambda: transformer_layer(batch=2, seq=4, d_model=8, heads=2, d_ff=16),
                    make_torch_transformer(2, 4, 8, 2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_torch_autograd(name):
    build_model, torch_fn = CASES[name]
    mod, make_inputs = build_model()
    mod64 = pb.testing.to_float64(mod)
    inputs = [a.astype("float64") for a in make_inputs(1)]
    grad_fn = pb.transform.gradient(mod64)
    loss, grads = pb.build(grad_fn)["main"](*inputs)

    tins = [torch.tensor(a, requires_grad=True) for a in inputs]
    tloss = torch_fn(*tins)
    tloss.backward()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-10, atol=1e-10)
    params = [p.name_hint for p in mod64["main"].params]
    assert len(grads) == len(params)
    for pname, g, t in zip(params, grads, tins):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=f"{name}: gradient of %{pname}")


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_finite_differences(name):
    mod, make_inputs = CASES[name][0]()
    check_grad(mod, make_inputs(2))
