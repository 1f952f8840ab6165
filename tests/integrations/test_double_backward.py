"""The compiled module differentiates once: asking for a differentiable gradient
(``create_graph=True``: double backward, gradient penalties) is one PullbackError that says
what to do instead; a plain backward after it still works."""

from __future__ import annotations

import pytest

import pullback as pb

torch = pytest.importorskip("torch")

from pullback.integrations.torch import compile as pb_compile  # noqa: E402


def _compiled(target):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    return model, pb_compile(model, (torch.ones(2, 3),), target=target)


def _grad_of_grad(compiled, x):
    (g,) = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    g.sum().backward()


def _backward_create_graph(compiled, x):
    compiled(x).sum().backward(create_graph=True)
    x.grad.sum().backward()


def _gradient_penalty(compiled, x):
    (g,) = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    (compiled(x).sum() + g.pow(2).sum()).backward()


def _hessian(compiled, x):
    torch.autograd.functional.hessian(lambda t: compiled(t).sum(), x)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph")
@pytest.mark.parametrize("how", [_grad_of_grad, _backward_create_graph, _gradient_penalty, _hessian])
def test_double_backward_is_a_pullback_error(how, target):
    model, compiled = _compiled(target)
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(pb.PullbackError) as ei:
        how(compiled, x)
    msg = str(ei.value)
    assert "not differentiable" in msg and "create_graph=True" in msg and "FirstOrderGradient" in msg
    # first-order gradients still work and match eager autograd
    model.zero_grad()
    x = torch.randn(2, 3, requires_grad=True)
    compiled(x).sum().backward()
    got = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x2 = x.detach().clone().requires_grad_(True)
    model(x2).sum().backward()
    want = [p.grad for p in model.parameters()] + [x2.grad]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
