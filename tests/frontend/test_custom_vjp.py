"""Custom torch.autograd.Functions whose backward is not their forward's derivative keep that backward
(frontend.custom_vjp): imported as ``@F [custom_vjp="F_vjp"]``, differentiated by calling the vjp, trained like
eager on every target, gradients equal to eager autograd in float64."""

import numpy as np
import pytest
import torch

import pullback as pb
from pullback.frontend.torch_importer import from_torch, import_torch
from pullback.integrations.torch import check_side_by_side, compile as pb_compile, train_side_by_side
from pullback.ir.expr import Call, GlobalVar
from pullback.ir.traversal import post_order

TARGETS = ["numpy", "torch", "jax"]


class _RoundSTE(torch.autograd.Function):
    """A straight-through estimator: round forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _GradReverse(torch.autograd.Function):
    """Domain-adversarial training's gradient reversal: identity forward, ``-alpha`` times the gradient back."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


class _ClippedProduct(torch.autograd.Function):
    """Two tensors in, three results out (one integer), inputs saved in ``setup_context``, a clipped backward."""

    @staticmethod
    def forward(x, y):
        p = x * y
        return p, p.argmax(-1), x + y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g_prod, g_idx, g_sum):
        x, y = ctx.saved_tensors
        return (g_prod * y).clamp(-0.1, 0.1) + g_sum, g_prod * x + g_sum


class _Quantized(torch.nn.Module):
    def __init__(self, detach_form: bool = False):
        super().__init__()
        self.lin, self.detach_form = torch.nn.Linear(3, 3), detach_form

    def forward(self, x):
        h = self.lin(x) * 3
        q = h + (torch.round(h) - h).detach() if self.detach_form else _RoundSTE.apply(h)
        return q.pow(2).mean()


class _Adversarial(torch.nn.Module):
    """Features through two gradient reversals of different strengths (two operators, two functions)."""

    def __init__(self):
        super().__init__()
        self.feat, self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

    def forward(self, x):
        h = torch.tanh(self.feat(x))
        return self.a(_GradReverse.apply(h, 0.5)).pow(2).sum() + self.b(_GradReverse.apply(h, 2.0)).sin().sum()


class _Clipped(torch.nn.Module):
    def __init__(self, use_sum: bool):
        super().__init__()
        self.lin, self.use_sum = torch.nn.Linear(3, 3), use_sum

    def forward(self, x, y):
        p, idx, s = _ClippedProduct.apply(self.lin(x), y)
        loss = (p * p).sum() + idx.sum().to(p.dtype)
        return loss + (s.cos().sum() if self.use_sum else 0.0)


def _custom_calls(fn) -> list[str]:
    return [n.op.name_hint for n in post_order(fn.body) if isinstance(n, Call) and isinstance(n.op, GlobalVar)]


def _grads_match_eager(model, inputs):
    """Gradients of every parameter and input through pullback (numpy, float64) equal eager autograd's."""
    model = model.double()
    inputs = [t.double().requires_grad_(True) if t.is_floating_point() else t for t in inputs]
    mod, params = from_torch(model, inputs)
    grad = pb.build(pb.transform.FirstOrderGradient()(mod))["main_grad"]
    value, grads = grad(*[t.detach().numpy() for t in inputs], *params.values())
    loss = model(*inputs)
    loss.backward()
    np.testing.assert_allclose(value, loss.item(), rtol=1e-12)
    wanted = [t.grad for t in inputs if t.is_floating_point()] + [p.grad for p in model.parameters()]
    assert len(grads) == len(wanted)
    for got, want in zip(grads, wanted):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)
    return mod


def test_a_straight_through_estimator_imports_with_its_backward():
    torch.manual_seed(0)
    mod = _grads_match_eager(_Quantized(), [torch.randn(4, 3)])
    assert mod["_RoundSTE"].custom_vjp == "_RoundSTE_vjp"
    assert _custom_calls(mod["main"]) == ["_RoundSTE"]
    # differentiating round() would give zeros: the user's identity backward is what flows
    again = pb.parse(pb.astext(mod))
    pb.assert_structural_equal(again, mod)
    assert again["_RoundSTE"].custom_vjp == "_RoundSTE_vjp"


@pytest.mark.parametrize("target", TARGETS)
def test_a_straight_through_estimator_trains_like_eager_and_saves_nothing_for_its_backward(target):
    """As a Function and as its detach() rewrite, both like eager; the Function's program saves nothing for it."""
    for detach_form in (False, True):
        torch.manual_seed(0)
        batches = [((torch.randn(4, 3),), None) for _ in range(3)]
        result = train_side_by_side(_Quantized(detach_form), batches, lambda loss, _: loss, target=target, verbose=False)
        check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)
    model = _Quantized()
    m = pb_compile(model, (torch.randn(4, 3),), target=target)
    x = torch.randn(4, 3)
    with torch.no_grad():  # the forward alone (@main, no differentiation)
        torch.testing.assert_close(m(x), model(x))
    m(x).backward()
    (tp,) = [t for t in m._programs.values() if t.mod is not None]  # the training program (not no_grad's)
    assert _custom_calls(tp.mod["main_fwd"]) == ["_RoundSTE"]  # the forward runs the Function's forward
    assert _custom_calls(tp.mod["main_bwd"]) == []  # the identity backward is inlined: it reads nothing saved
    fwd_residuals = tp.mod["main_fwd"].body.fields[1].fields
    rounded_input = tp.mod["main_fwd"].body.fields[0]
    assert all(r.checked_type.shape != (4, 3) or r is not rounded_input for r in fwd_residuals)
    assert len(fwd_residuals) == 2  # 2 * round(h) for the square's gradient, x^T for the weight's


def test_a_gradient_reversal_with_a_setting_per_use():
    """Each non-tensor argument value (alpha) is its own function; eager's gradients in float64."""
    torch.manual_seed(0)
    mod = _grads_match_eager(_Adversarial(), [torch.randn(5, 4)])
    assert sorted(_custom_calls(mod["main"])) == ["_GradReverse", "_GradReverse_1"]


@pytest.mark.parametrize("use_sum", [True, False], ids=["all-results", "one-result-unused"])
def test_a_function_of_two_tensors_with_three_results_and_setup_context(use_sum):
    """An unused result's cotangent is zeros (as autograd materialises it); the integer result has none."""
    torch.manual_seed(0)
    mod = _grads_match_eager(_Clipped(use_sum), [torch.randn(4, 3), torch.randn(4, 3) * 3])
    vjp = mod[mod["_ClippedProduct"].custom_vjp]
    assert len(vjp.params) == 2 + 2  # x, y, then the cotangents of the two float results


@pytest.mark.parametrize("target", TARGETS)
def test_the_clipped_product_trains_like_eager(target):
    torch.manual_seed(0)
    batches = [((torch.randn(4, 3), torch.randn(4, 3) * 3), None) for _ in range(3)]
    result = train_side_by_side(_Clipped(True), batches, lambda loss, _: loss, target=target, verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-6, verbose=False)


class _Pair(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x), 3

    @staticmethod
    def backward(ctx, g, _):
        return g


class _NoisySTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x + torch.rand_like(x))

    @staticmethod
    def backward(ctx, g):
        return g


class _Apply(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        out = self.fn.apply(x)
        return (out[0] if isinstance(out, tuple) else out).sum()


def test_a_non_tensor_result_is_a_clear_error():
    with pytest.raises(pb.PullbackError, match=r"custom Function _Pair's forward returns tuple values other than tensors"):
        from_torch(_Apply(_Pair), (torch.randn(3),))


class _Noisy(torch.nn.Module):
    """A stochastic rounding (noise drawn in the Function's forward) with a straight-through backward, twice."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        h = _NoisySTE.apply(self.lin(x) * 3)
        return (_NoisySTE.apply(h * 0.5) * h).mean()


@pytest.mark.parametrize("target", TARGETS)
def test_a_function_whose_forward_draws_trains_like_eager(target):
    """The draws of the Function's forward are random inputs of the program, drawn in eager's order (one per
    call), and passed to both the forward and the vjp: the same noise as eager, step after step."""
    torch.manual_seed(0)
    prog = import_torch(_Noisy(), (torch.randn(4, 3),))
    assert [m.kind for m in prog.masks] == ["uniform", "uniform"]
    assert _custom_calls(prog.main) == ["_NoisySTE", "_NoisySTE"]
    batches = [((torch.randn(4, 3),), None) for _ in range(3)]
    result = train_side_by_side(_Noisy(), batches, lambda loss, _: loss, target=target, verbose=False)
    check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)


class _ListSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ys):
        return torch.round(x + ys[0])

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Listed(torch.nn.Module):
    def forward(self, x):
        return _ListSTE.apply(x, [x * 2]).sum()


def test_tensors_in_a_list_argument_are_a_clear_error():
    with pytest.raises(pb.PullbackError, match=r"_ListSTE \(applied at .*\) takes tensors inside a list"):
        from_torch(_Listed(), (torch.randn(3),))


def test_a_dynamic_batch_goes_through_the_pair():
    """With ``dynamic_batch`` the Function's forward and vjp take a ``?`` batch too: one program, eager's
    gradients at every batch size."""
    torch.manual_seed(0)
    model = _Clipped(True).double()
    mod, params = from_torch(model, (torch.randn(4, 3).double(), torch.randn(4, 3).double()), dynamic_batch=True)
    assert pb.astext(mod["_ClippedProduct"]).count("Tensor[(?, 3), float64]") >= 2
    grad = pb.build(pb.transform.FirstOrderGradient()(mod))["main_grad"]
    for batch in (2, 7):
        x, y = torch.randn(batch, 3).double(), torch.randn(batch, 3).double() * 3
        value, grads = grad(x.numpy(), y.numpy(), *params.values())
        model.zero_grad()
        loss = model(x, y)
        loss.backward()
        np.testing.assert_allclose(value, loss.item(), rtol=1e-12)
        for got, p in zip(grads[2:], model.parameters()):
            np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make, shapes", [
    (_Quantized, [(4, 3)]),
    (_Adversarial, [(5, 4)]),
    (lambda: _Clipped(True), [(4, 3), (4, 3)]),
], ids=["straight-through", "gradient-reversal", "clipped-product"])
def test_torch_compile_backend_keeps_a_custom_backward(make, shapes):
    """Dynamo hands the backend a Function's forward and backward graphs; they are applied again as a Function
    and kept as the importer keeps one: gradients equal eager's."""
    import copy

    import pullback.integrations.dynamo_backend  # noqa: F401  (registers the backend)

    torch.manual_seed(0)
    model = make()
    inputs = [torch.randn(s) for s in shapes]
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="pullback")
    for m in (eager, compiled):
        m(*inputs).backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        assert p.grad.abs().sum() > 0  # differentiating round() or a reversal's forward gives other gradients
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)


class _Stacked(torch.nn.Module):
    """The same Function in two layers of one width and a third of another."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3), torch.nn.Linear(3, 5)

    def forward(self, x):
        h = _RoundSTE.apply(self.b(_RoundSTE.apply(self.a(x) * 3)))
        return _RoundSTE.apply(self.c(h) * 2).pow(2).mean()


def test_one_pair_per_shape():
    """Calls at the same shapes share one @F / @F_vjp pair (exported once); another shape gets its own."""
    torch.manual_seed(0)
    mod = _grads_match_eager(_Stacked(), [torch.randn(4, 3)])
    assert sorted(_custom_calls(mod["main"])) == ["_RoundSTE", "_RoundSTE", "_RoundSTE_1"]
    assert sorted(name for name in mod if name != "main") == [
        "_RoundSTE", "_RoundSTE_1", "_RoundSTE_1_vjp", "_RoundSTE_vjp"]


class _Checkpointed(torch.autograd.Function):
    """Hand-written checkpointing of a layer (Reformer's reversible layers, old ``CheckpointFunction``s): the
    forward runs under no_grad, the backward recomputes it with autograd and writes the layer's ``.grad``."""

    @staticmethod
    def forward(ctx, x, layer):
        ctx.save_for_backward(x)
        ctx.layer = layer
        with torch.no_grad():
            return layer(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            torch.autograd.backward(ctx.layer(x), g)
        return x.grad, None


class _WithCheckpoint(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.inner, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.relu(_Checkpointed.apply(self.a(x), self.inner))).square().mean()


def test_a_backward_running_autograd_itself_is_refused_by_name():
    """Such a backward cannot be a program of its own (torch.export's error named a lifted fake tensor): the
    message names the Function and the route that trains it."""
    with pytest.raises(pb.PullbackError, match=r"backward of custom Function _Checkpointed \(applied at .*\) calls "
                                               r"torch.autograd.backward.*torch.compile\(model, backend=\"pullback\"\)"):
        from_torch(_WithCheckpoint(), (torch.randn(3, 4),))


def test_a_backward_running_autograd_itself_trains_like_eager_through_torch_compile():
    import copy

    import pullback.integrations.dynamo_backend  # noqa: F401  (registers the backend)

    torch.manual_seed(0)
    model = _WithCheckpoint().double()
    eager = copy.deepcopy(model)
    x = torch.randn(3, 4, dtype=torch.float64)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="pullback")
        for m in (eager, compiled):
            m(x).backward()
    finally:
        torch._dynamo.reset()
    for (k, p), q in zip(eager.named_parameters(), model.parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0, k  # the inner layer's written by the backward
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-14, msg=lambda m, k=k: f"{k}: {m}")
