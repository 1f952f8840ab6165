"""A compiled module's gradient is differentiable (``create_graph=True``: double backward, gradient penalties,
Hessians, gradients of any order), on every target, equal to eager autograd in float64: each order is
pullback's AD of the order below (``integrations.higher_order``). A forward that overwrites buffers (batch norm
in training mode) refuses with a PullbackError that says why, and a plain backward after it still works."""

from __future__ import annotations

import copy

import pytest

import pullback as pb

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from pullback.integrations.higher_order import vjp_module  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402

F64 = torch.float64


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()


def _grad_of_grad(model, x):
    (g,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    g.pow(3).sum().backward()


def _backward_create_graph(model, x):
    model(x).sum().backward(create_graph=True)
    g = x.grad
    x.grad = None
    for p in model.parameters():
        p.grad = None
    (g * g).sum().backward()


def _gradient_penalty(model, x):
    (g,) = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    (model(x).sum() + ((g.norm(dim=1) - 1) ** 2).sum()).backward()


def _penalty_on_weight_gradients(model, x):
    params = list(model.parameters())
    gs = torch.autograd.grad(model(x).pow(2).mean(), params, create_graph=True)
    (model(x).pow(2).mean() + sum(g.pow(2).sum() for g in gs)).backward()


def _side_by_side(compiled, model, how) -> None:
    """``how`` on the compiled module and on ``model`` from the same input: the same gradients of the parameters
    and the input, None where eager leaves None (the last bias does not reach an input gradient)."""
    x0 = torch.randn(2, 3, dtype=F64)
    grads = []
    for m in (compiled, model):
        model.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        how(m, x)
        grads.append([None if t.grad is None else t.grad.clone() for t in (*model.parameters(), x)])
    got, want = grads
    assert sum(g is not None for g in want) >= 3
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
@pytest.mark.parametrize("how", [_grad_of_grad, _backward_create_graph, _gradient_penalty, _penalty_on_weight_gradients])
def test_second_order_gradients_equal_eager(how, target):
    model = _mlp()
    _side_by_side(pb_compile(model, (torch.ones(2, 3, dtype=F64),), target=target), model, how)


def test_hessian_equals_eager(target):
    model = _mlp()
    compiled = pb_compile(model, (torch.ones(2, 3, dtype=F64),), target=target)
    x = torch.randn(2, 3, dtype=F64)
    got = torch.autograd.functional.hessian(lambda t: compiled(t).sum(), x)
    want = torch.autograd.functional.hessian(lambda t: model(t).sum(), x)
    assert want.abs().max() > 1e-3
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_third_derivative_equals_eager(target):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(1, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    compiled = pb_compile(model, (torch.ones(4, 1, dtype=F64),), target=target)

    def derivatives(m):
        z = torch.linspace(-1, 1, 4, dtype=F64).reshape(4, 1).requires_grad_(True)
        out, y = [], m(z).sum()
        for k in range(3):
            (y,) = torch.autograd.grad(y, z, create_graph=k < 2)
            out.append(y.detach())
            y = y.sum()
        return out

    for a, b in zip(derivatives(compiled), derivatives(model)):
        assert b.abs().max() > 1e-3
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


class TwoBiases(nn.Module):
    """``tanh(x w^T + a + b)``: the biases ``a`` and ``b`` get one gradient value (an LSTM's two biases)."""

    def __init__(self):
        super().__init__()
        self.w, self.a, self.b = (nn.Parameter(torch.randn(*s, dtype=F64)) for s in ((4, 3), (4,), (4,)))

    def forward(self, x):
        return torch.tanh(x @ self.w.t() + self.a + self.b)


def test_two_parameters_with_one_gradient_value_get_memory_of_their_own(target):
    """The gradient program gives one array for both biases: handed to autograd as two tensors on one memory,
    the penalty's gradient added in place into the first bias's gradient reached the second's too (numpy target:
    both off by the penalty's share)."""
    torch.manual_seed(6)
    model = TwoBiases()
    _side_by_side(pb_compile(model, (torch.ones(2, 3, dtype=F64),), target=target), model, _gradient_penalty)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_attention_models_differentiate_twice(dropout):
    """A TransformerEncoderLayer (scaled_dot_product_attention; with dropout: masks drawn as eager draws them)
    under a penalty on its weight gradients. Eager's fused CPU attention has no double backward: the reference
    runs the math kernel."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(8, 2, 16, dropout=dropout, batch_first=True).double()
    x = torch.randn(2, 5, 8, dtype=F64)
    compiled = pb_compile(model, (x,))
    grads = []
    for m in (compiled, model):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with sdpa_kernel(SDPBackend.MATH):
            _penalty_on_weight_gradients(m, x)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_forward_that_writes_buffers_refuses_a_differentiable_gradient(target):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 1)).double()
    ref = copy.deepcopy(model)
    compiled = pb_compile(model, (torch.ones(4, 3, dtype=F64),), target=target)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    with pytest.raises(pb.PullbackError) as ei:
        _grad_of_grad(compiled, x)
    msg = str(ei.value)
    assert "create_graph=True" in msg and "overwrites buffers" in msg and "eval mode" in msg
    # first-order gradients still work and match eager; in eval mode (nothing written) the second order works
    for m in (model, ref):
        m.zero_grad(set_to_none=True)
        m.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, dtype=F64)
    compiled(x).sum().backward()
    ref(x).sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-14)
    model.eval(), ref.eval()
    for m in (compiled, ref):
        m.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        _grad_of_grad(m, xg)
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-14)


def test_each_order_is_built_once_and_kept():
    model = _mlp()
    compiled = pb_compile(model, (torch.ones(2, 3, dtype=F64),))
    for _ in range(3):
        x = torch.randn(2, 3, dtype=F64, requires_grad=True)
        _grad_of_grad(compiled, x)
    (first,) = [tp._differentiable for tp in compiled._programs.values() if tp._differentiable is not None]
    assert list(first._vjps) == [(0,)]  # the gradient w.r.t. x alone (what autograd.grad asks for), each time
    (second,) = first._vjps.values()
    assert len(second._vjps) == 1 and second._bridge is not None


def test_autograd_grad_of_the_input_alone_computes_the_inputs_gradient_alone(target):
    model = _mlp()
    compiled = pb_compile(model, (torch.ones(2, 3, dtype=F64),), target=target)
    x = torch.randn(2, 3, dtype=F64, requires_grad=True)
    (got,) = torch.autograd.grad(compiled(x).pow(2).sum(), x, create_graph=True)
    (want,) = torch.autograd.grad(model(x).pow(2).sum(), x, create_graph=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    (tp,) = [tp for tp in compiled._programs.values() if tp._differentiable is not None]
    assert list(tp.differentiable()._vjps) == [(0,)]  # no program for the parameters' gradients was made
    assert all(p.grad is None for p in model.parameters())
    # asking for one weight builds that position's program; the engine runs no other edge
    w = model[0].weight
    (gw,) = torch.autograd.grad(compiled(x).pow(2).sum(), w, create_graph=True)
    torch.testing.assert_close(gw, torch.autograd.grad(model(x).pow(2).sum(), w, create_graph=True)[0], rtol=1e-12, atol=1e-14)
    assert sorted(tp.differentiable()._vjps) == [(0,), (1,)]


def test_an_input_written_in_place_after_a_differentiable_gradient_that_does_not_read_it(target):
    """The input's gradient of a linear model does not read the input: eager lets the input change before the
    penalty's backward, and so does pullback (it keeps only what each gradient program reads)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1)).double()
    compiled = pb_compile(model, (torch.ones(2, 3, dtype=F64),), target=target)
    x0 = torch.randn(2, 3, dtype=F64)
    grads = []
    for m in (compiled, model):
        model.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True) * 1.0
        (g,) = torch.autograd.grad(m(x).sum(), x, create_graph=True)
        x.mul_(2)
        (g ** 2).sum().backward()
        grads.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
    got, want = grads
    assert sum(g is not None for g in want) == 2
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_a_wgan_gp_critic_step_equals_eager(target):
    """A convolutional critic with ReLU6, LeakyReLU and a global average pool under WGAN-GP's penalty on its input
    gradient (autograd.grad w.r.t. the interpolated input alone), the parameters' gradients side by side."""
    torch.manual_seed(0)
    model, (x,) = SECOND_ORDER_MODELS["relu6_leaky"]()
    model = model.double()
    real, fake = x.double(), torch.randn(2, 2, 6, 6, dtype=F64)
    compiled = pb_compile(model, (real,), target=target)
    grads = []
    for m in (compiled, model):
        model.zero_grad(set_to_none=True)
        alpha = torch.full((2, 1, 1, 1), 0.3, dtype=F64)
        xi = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        (g,) = torch.autograd.grad(m(xi).sum(), xi, create_graph=True)
        loss = m(fake).mean() - m(real).mean() + 10 * ((g.flatten(1).norm(dim=1) - 1) ** 2).mean()
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert sum(bool(b.abs().max() > 0) for b in grads[1]) >= 5  # all but the last bias, which the loss cancels
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def test_vjp_module_takes_flat_cotangents_and_returns_the_gradients():
    x, y = pb.var("x", shape=(2,)), pb.var("y", shape=(2,))
    mod = pb.IRModule.from_expr(pb.Function([x, y], pb.Tuple([pb.op.tanh(x), pb.op.multiply(x, y)])))
    g = vjp_module(mod, [0])
    main = g["main"]
    assert [p.name_hint for p in main.params] == ["x", "y", "ct0", "ct1"]
    import numpy as np

    xs, ys, c0, c1 = (np.array(v, "float32") for v in ([0.5, -1.0], [2.0, 3.0], [1.0, 1.0], [1.0, 2.0]))
    (dx,) = pb.build(g)["main"](xs, ys, c0, c1)
    np.testing.assert_allclose(dx, c0 * (1 - np.tanh(xs) ** 2) + c1 * ys, rtol=1e-6)


def test_through_torch_compile_backend():
    import pullback.integrations.dynamo_backend  # noqa: F401  (registers the backend)

    torch._dynamo.reset()
    model = _mlp()
    _side_by_side(torch.compile(model, backend="pullback"), model, _gradient_penalty)
    torch._dynamo.reset()


def _bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=16, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg), [torch.randint(0, 30, (2, 6))]


SECOND_ORDER_MODELS = {
    "cnn": lambda: (nn.Sequential(nn.Conv2d(2, 4, 3), nn.GroupNorm(2, 4), nn.SiLU(), nn.MaxPool2d(2), nn.Flatten(),
                                  nn.Linear(16, 2)), [torch.randn(2, 2, 6, 6)]),
    "upsampling": lambda: (nn.Sequential(nn.ConvTranspose2d(2, 3, 2, stride=2), nn.Upsample(scale_factor=2, mode="bilinear"),
                                         nn.ELU(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(48, 2)), [torch.randn(2, 2, 2, 2)]),
    "gru": lambda: (nn.GRU(3, 4, batch_first=True), [torch.randn(2, 5, 3)]),
    # clip's and leaky_relu's gradients (a select against zero, leaky_relu_grad), a global average pool's (a view)
    "relu6_leaky": lambda: (nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU6(), nn.Conv2d(4, 4, 3, padding=1),
                                          nn.LeakyReLU(0.2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)),
                            [5 * torch.randn(2, 2, 6, 6)]),
    "bert": _bert,  # embeddings, GELU, layer norm, dropout in training, the pooler's tanh
}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER_MODELS))
def test_models_under_a_penalty_on_their_weight_gradients(name):
    torch.manual_seed(0)
    model, inputs = SECOND_ORDER_MODELS[name]()
    model = model.double().train(name == "bert")
    inputs = [x.double() if x.is_floating_point() else x for x in inputs]
    compiled = pb_compile(model, tuple(inputs))
    params = list(model.parameters())
    grads = []
    for m in (compiled, model):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with sdpa_kernel(SDPBackend.MATH):  # eager's fused attention has no double backward
            out = m(*inputs)
            loss = (out if torch.is_tensor(out) else out[0]).pow(2).mean()
            gs = torch.autograd.grad(loss, params, create_graph=True)
            (loss + sum(g.pow(2).sum() for g in gs)).backward()
        grads.append([p.grad.clone() for p in params])
    scale = max(float(g.abs().max()) for g in grads[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13 * scale)
