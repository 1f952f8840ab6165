"""Semantics a user's training depends on: padding_idx, tied weights, dropout masks drawn as eager, buffers
mutated in forward, train()/eval(), detach. Through the importer and through ``integrations.torch.compile``."""

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
from pullback.integrations.torch import draw_masks  # noqa: E402


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=0)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids, y):
        return F.cross_entropy(self.out(torch.tanh(self.emb(ids))).reshape(-1, 10), y.reshape(-1))


def _tied():
    torch.manual_seed(0)
    ids = torch.tensor([[0, 3, 4], [5, 0, 0]])
    return TiedLM(), (ids, torch.tensor([[1, 2, 3], [4, 5, 6]]))


def test_tied_weights_are_one_parameter_listing_every_key():
    model, inputs = _tied()
    prog = import_torch(model, inputs)
    assert prog.trainable == ["emb_weight"]
    assert prog.state_names["emb_weight"] == ("emb.weight", "out.weight")
    assert len(prog.main.params) == 3


def test_padding_row_gets_no_gradient_and_tied_gradients_sum():
    model, inputs = _tied()
    model = model.double()
    prog = import_torch(model, inputs)
    gmod = pb.transform.FirstOrderGradient(wrt=prog.trainable)(prog.mod)
    loss, (g,) = pb.build(gmod)["main_grad"](*main_inputs(prog, inputs))
    ref = model(*inputs)
    ref.backward()
    np.testing.assert_allclose(loss, ref.item(), rtol=1e-12)
    np.testing.assert_allclose(g, model.emb.weight.grad.numpy(), rtol=1e-10, atol=1e-12)
    # the padding row: only the output layer's use reaches it (PyTorch's rule), the lookups do not
    eager_lookup_only = torch.autograd.grad(F.embedding(inputs[0], model.emb.weight, padding_idx=0).sum(), model.emb.weight)[0]
    assert not eager_lookup_only[0].any()


def test_hand_training_recipe_on_a_tied_model():
    """docs/torch.md's recipe: parameters by state_names, updated in place; the tied tensor is updated once."""
    model, inputs = _tied()
    prog = import_torch(model, inputs)
    gmod = pb.transform.standard_cleanup()(pb.transform.FirstOrderGradient(wrt=prog.trainable)(prog.mod))
    step = pb.build(gmod)["main_grad"]
    state = model.state_dict(keep_vars=True)
    before = model(*inputs).item()
    with torch.no_grad():
        for _ in range(10):
            values = [state[prog.state_names[n][0]].numpy() for n in prog.trainable]
            _, grads = step(*[x.numpy() for x in inputs], *values)
            for n, g in zip(prog.trainable, grads):
                state[prog.state_names[n][0]] -= 0.5 * torch.from_numpy(np.asarray(g))
    assert model.out.weight is model.emb.weight and model(*inputs).item() < before


def test_compile_trains_a_tied_model_like_eager(target):
    model, inputs = _tied()
    eager = copy.deepcopy(model)
    cm = pb_compile(model, inputs, target=target)
    for m in (eager, cm):
        opt = torch.optim.SGD(m.parameters(), lr=0.3)
        for _ in range(3):
            loss = m(*inputs)
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch.testing.assert_close(model.emb.weight, eager.emb.weight)
    assert model.out.weight is model.emb.weight


class PermutedDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x.transpose(0, 1), 0.5, self.training) * 2 + F.dropout2d(x[None], 0.3, self.training)[0].sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dropout_masks_drawn_exactly_as_eager_also_for_permuted_inputs(dtype):
    """Every element equals eager's. In float32 the two sides add dropout2d's 60 terms in other orders, so the
    scalar sum broadcast to every element may differ in its last bits (with unseeded inputs this test failed one run
    in eight at 1e-6): then every element differs by that one amount, which a wrong mask element would not do."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4, dtype=dtype)
    prog = import_torch(PermutedDropout(), (x,))
    assert [m.kind for m in prog.masks] == ["bernoulli", "bernoulli"] and prog.masks[0].stride is not None
    torch.manual_seed(3)
    masks = [m.numpy() for m in draw_masks(prog)]
    out = pb.build(prog.mod)["main"](*main_inputs(prog, [x], masks))
    torch.manual_seed(3)
    want = PermutedDropout()(x).numpy()
    if dtype == torch.float64:
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
        return
    diff = out.astype("float64") - want
    eps = float(np.finfo(np.float32).eps)
    assert np.ptp(diff) <= 4 * eps * np.abs(want).max(), diff  # one shift for all: the masks are eager's
    assert abs(diff.mean()) <= x.numel() * eps * float(x.abs().sum()) / 0.7  # the sum's float32 rounding


class RandomInForward(nn.Module):
    def forward(self, x):
        return x * torch.rand(x.shape) + torch.randn_like(x) + torch.randperm(x.shape[1]).float()


def test_random_draws_in_forward_become_inputs_drawn_in_order():
    x = torch.randn(2, 4)
    prog = import_torch(RandomInForward(), (x,))
    assert [m.kind for m in prog.masks] == ["uniform", "normal", "randperm"]
    torch.manual_seed(11)
    out = pb.build(prog.mod)["main"](*main_inputs(prog, [x], [m.numpy() for m in draw_masks(prog)]))
    torch.manual_seed(11)
    np.testing.assert_allclose(out, RandomInForward()(x).numpy(), rtol=1e-6)


def _draws_like_eager(cls, x, target, seed: int, **tol):
    """``cls()`` compiled and eager, each run after ``torch.manual_seed(seed)``: equal results and input gradients."""
    x = x.clone().requires_grad_(True)
    cm = pb_compile(cls(), (x,), target=target)
    torch.manual_seed(seed)
    out = cm(x)
    out.sum().backward()
    torch.manual_seed(seed)
    x2 = x.detach().clone().requires_grad_(True)
    ref = cls()(x2)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(x.grad, x2.grad, **tol)


def test_random_draws_through_compile_match_eager(target):
    _draws_like_eager(RandomInForward, torch.randn(2, 4), target, 11)


class SampledKeys(nn.Module):
    """Informer's ProbSparse attention samples key indices with ``torch.randint`` (both overloads); and
    ``randint_like`` of a float tensor."""

    def forward(self, x):
        idx = torch.randint(0, x.shape[1], (x.shape[1], 3)) + torch.randint(1, (x.shape[1], 3))
        return x[:, idx].square().sum(-1) + torch.randint_like(x, 2, 5) * x


def test_randint_draws_match_eager(target):
    x = torch.randn(2, 4)
    prog = import_torch(SampledKeys(), (x,))
    assert [(m.kind, m.params) for m in prog.masks] == [("randint", (0.0, 4.0)), ("randint", (0.0, 1.0)),
                                                         ("randint", (2.0, 5.0))]
    _draws_like_eager(SampledKeys, x, target, 5)


class BernoulliOfTensor(nn.Module):
    """``torch.bernoulli`` of computed probabilities, also of a transposed view, and ``Bernoulli(probs).sample()``."""

    def forward(self, x):
        p = torch.sigmoid(x)
        return x * torch.bernoulli(p) + 2 * torch.bernoulli(p.t()).t() + torch.distributions.Bernoulli(probs=p).sample()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bernoulli_of_tensor_probabilities_draws_as_eager(target, dtype):
    """Eager draws uniforms of the probabilities' dtype, in row-major order also for a transposed view
    (PyTorch's decomposition draws float32 ones: in float64 every mask differed)."""
    _draws_like_eager(BernoulliOfTensor, torch.randn(3, 5, dtype=dtype), target, 7)


class Reparameterized(nn.Module):
    """Samples by reparameterization: ``Normal.rsample`` (``normal_functional``) and ``torch.normal`` with tensor
    and float arguments, the draws scaled by learned parameters; and noise of two numbers and a size."""

    def __init__(self):
        super().__init__()
        self.mu, self.log_scale = nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x):
        mu, scale = self.mu(x), F.softplus(self.log_scale(x)) + 0.1
        d = torch.distributions.Normal(mu, scale, validate_args=False)
        z = d.rsample()
        w = torch.normal(mu, scale) + torch.normal(mu, 2.0) + torch.normal(0.5, scale)
        noise = torch.normal(0.1, 0.3, size=(x.shape[0], 2), dtype=x.dtype)
        return (d.log_prob(z) * w).sum() + (z + noise).pow(2).mean()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reparameterized_samples_through_compile_match_eager(target, dtype):
    torch.manual_seed(0)
    model = Reparameterized().to(dtype)
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3, dtype=dtype)
    cm = pb_compile(model, (x,), target=target)
    torch.manual_seed(5)
    out = cm(x)
    out.backward()
    torch.manual_seed(5)
    ref = eager(x)
    ref.backward()
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else {}
    torch.testing.assert_close(out, ref, **tol)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **tol)


class GammaFamily(nn.Module):
    """Likelihoods whose log-probabilities and entropies use lgamma and digamma: a Beta (a VAE's pixel
    likelihood), a Gamma, a Poisson and a Dirichlet, their parameters predicted from the input."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 6)

    def forward(self, x, y):
        a, b, rate = F.softplus(self.head(x)).add(0.5).split(2, dim=1)
        D = torch.distributions
        return (D.Beta(a, b, validate_args=False).log_prob(y).sum()
                + D.Gamma(a, rate, validate_args=False).log_prob(y + 1).sum()
                + D.Poisson(rate, validate_args=False).log_prob(torch.round(y * 4)).sum()
                + D.Dirichlet(torch.cat([a, b], 1), validate_args=False).entropy().sum())


def _likelihood_matches_eager(model, inputs, target, grad_rtol=1e-10, grad_atol=1e-12):
    """One compiled forward and backward of ``model`` (float64) against eager: the loss and every gradient."""
    eager = copy.deepcopy(model)
    out = pb_compile(model, inputs, target=target)(*inputs)
    out.backward()
    ref = eager(*inputs)
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=grad_rtol, atol=grad_atol)


def test_gamma_family_likelihoods_through_compile_match_eager(target):
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.rand(4, 2, dtype=torch.float64) * 0.9 + 0.05
    # eager's Dirichlet entropy gradient uses torch's trigamma, 4e-10 relative off in float64 (pullback's is
    # within a few ulp: tests/ops/test_elemwise.py::test_log_gamma_family_is_accurate_on_every_target)
    _likelihood_matches_eager(GammaFamily().double(), (x, y), target, grad_rtol=2e-9, grad_atol=1e-13)


class NormalFamily(nn.Module):
    """Quantiles and tails of the normal distribution and a von Mises normalizer: ``Normal.icdf`` (erfinv), a
    probit likelihood by ``special.log_ndtr`` and ``ndtri``, ``log(2 pi I0(k))`` through ``i0e``, and ``i1``."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 4)

    def forward(self, x, p):
        mu, s, z, k = self.head(x).split(1, dim=1)
        D = torch.distributions
        icdf = D.Normal(mu, F.softplus(s) + 0.1, validate_args=False).icdf(p).sum()
        probit = (torch.special.log_ndtr(z * 3 - 5) + torch.special.ndtri(p * 0.5 + 0.25)).sum()
        kappa = F.softplus(k)
        von_mises = (torch.log(2 * torch.pi * torch.special.i0e(kappa)) + kappa).sum() + torch.special.i1(k).sum()
        return icdf + probit + von_mises


def test_normal_quantiles_probit_and_bessel_through_compile_match_eager(target):
    torch.manual_seed(1)
    x, p = torch.randn(5, 3, dtype=torch.float64), torch.rand(5, 1, dtype=torch.float64) * 0.9 + 0.05
    _likelihood_matches_eager(NormalFamily().double(), (x, p), target)


class Counter(nn.Module):
    """A buffer mutated in forward (a step counter and a running mean of the inputs)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        self.steps += 1
        self.ema.mul_(0.9).add_(0.1 * x.mean(0))
        return self.lin(x - self.ema).sum()


def test_buffers_mutated_in_forward_are_written_back(target):
    torch.manual_seed(0)
    model, x = Counter(), torch.randn(4, 3)
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (x,), target=target)
    for _ in range(3):
        torch.testing.assert_close(cm(x), eager(x))
    assert int(model.steps) == 3
    torch.testing.assert_close(model.ema, eager.ema)


class UsesThenUpdates(nn.Module):
    """The gradient of ``w`` is the buffer's value before the in-place update (eager saves ``b`` and raises)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))
        self.register_buffer("b", torch.randn(3))

    def forward(self, x):
        y = (self.w * self.b).sum() + x.sum()
        self.b.add_(1.0)
        return y


def test_a_residual_sharing_a_written_back_buffer_keeps_its_value(target):
    torch.manual_seed(0)
    model = UsesThenUpdates()
    before = model.b.clone()
    cm = pb_compile(model, (torch.randn(3),), target=target)
    (tp,) = cm._programs.values()
    assert tp.mod["main_bwd"].params[0].name_hint == "b"  # the buffer itself is the residual
    cm(torch.randn(3)).backward()
    torch.testing.assert_close(model.w.grad, before)
    torch.testing.assert_close(model.b, before + 1)


def test_train_and_eval_modes_are_respected(target):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 2))
    x = torch.randn(8, 4)
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (x,), target=target)
    torch.manual_seed(1)
    a = cm(x)
    torch.manual_seed(1)
    torch.testing.assert_close(a, eager(x))
    cm.eval()
    eager.eval()
    torch.testing.assert_close(cm(x), eager(x))  # running statistics, no dropout
    torch.testing.assert_close(model[1].running_mean, eager[1].running_mean)


class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return (x * self.w.detach() * self.w).sum()


def test_detach_blocks_the_gradient():
    torch.manual_seed(0)
    model, x = Detached(), torch.randn(3)
    prog = import_torch(model, (x,))
    gmod = pb.transform.FirstOrderGradient(wrt=prog.trainable)(prog.mod)
    _, (g,) = pb.build(gmod)["main_grad"](*main_inputs(prog, [x]))
    model(x).backward()
    np.testing.assert_allclose(g, model.w.grad.numpy(), rtol=1e-6)


class DetachedAndTracked(nn.Module):
    """Returns a hidden activation both detached and tracked (a target network's copy beside the online one)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return h.detach(), h


def test_an_output_returned_detached_and_tracked_keeps_its_gradient(target):
    """The program's two outputs are one tensor; marking the detached one non-differentiable cut the tracked one's
    gradient too (it came back with requires_grad False)."""
    torch.manual_seed(0)
    model, x = DetachedAndTracked(), torch.randn(3, 4)
    eager = copy.deepcopy(model)
    detached, h = pb_compile(model, (x,), target=target)(x)
    assert not detached.requires_grad and h.requires_grad
    (h * detached).sum().backward()
    d, e = eager(x)
    (e * d).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)

def test_a_replaced_parameter_is_the_one_trained(target):
    """Parameters and buffers are read from the module at each call: a Parameter object assigned after
    compiling is used and gets the gradient; with one of another shape the module is exported again, so one that
    breaks the module fails as in eager, with torch's reason in a pullback error
    (``test_torch_training.test_a_layer_replaced_by_one_of_another_shape_exports_again``: one that fits trains)."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)), torch.randn(4, 3)
    cm = pb_compile(model, (x,), target=target)
    new = nn.Parameter(torch.randn(2, 3))
    model[0].weight = new
    cm(x).sum().backward()
    eager = copy.deepcopy(model)
    eager.zero_grad()
    eager(x).sum().backward()
    torch.testing.assert_close(new.grad, eager[0].weight.grad)
    model[0].weight = nn.Parameter(torch.randn(3, 3))
    with pytest.raises(RuntimeError, match="size"):
        model(x)
    with pytest.raises(pb.PullbackError, match="torch.export failed.*Size"):
        cm(x)


def test_a_layer_replaced_by_one_of_the_same_shapes_is_the_one_trained(target):
    """The parameters are read from the submodules that hold them now: a layer swapped for a new one of the same
    shapes, after calls that read the old layer's (and cached where its weights live), has its own weights used
    and trained."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)), torch.randn(4, 3)
    cm = pb_compile(model, (x,), target=target)
    cm(x).sum().backward()
    model[0] = fresh = nn.Linear(3, 2)
    eager = copy.deepcopy(model)
    out = cm(x)
    out.sum().backward()
    want = eager(x)
    want.sum().backward()
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(fresh.weight.grad, eager[0].weight.grad)
    torch.testing.assert_close(model[1].running_mean, eager[1].running_mean)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq_divides_each_rows_gradient_by_its_count(mode):
    """``nn.EmbeddingBag(scale_grad_by_freq=True)``: the values as without it, each row's gradient divided by how
    often its index occurs. The reference is ``F.embedding(scale_grad_by_freq=True)`` reduced per bag: eager's CPU
    ``embedding_bag`` backward in torch 2.13 divides some rows by another index's count (pytorch/pytorch#190063,
    fixed after 2.13; CUDA and ``F.embedding`` were right), which pullback does not copy."""
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(6, 3, mode=mode, scale_grad_by_freq=True).double()
    idx, offsets = torch.tensor([3, 1, 3, 3, 1, 5]), torch.tensor([0, 2, 4])
    prog = import_torch(bag, (idx, offsets))
    gmod = pb.transform.FirstOrderGradient(wrt=prog.trainable)(prog.mod)
    value, (g,) = pb.build(gmod)["main_grad"](*main_inputs(prog, (idx, offsets)))
    rows = F.embedding(idx, bag.weight, scale_grad_by_freq=True)
    ref = torch.stack([getattr(rows[a:b], mode)(0) for a, b in ((0, 2), (2, 4), (4, 6))])
    ref.sum().backward()
    np.testing.assert_allclose(value, bag(idx, offsets).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(value, ref.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(g, bag.weight.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert np.abs(g[3]).sum() > 0 and np.abs(g[5]).sum() > 0


class PartlyUsed(nn.Module):
    """Parameters that never reach the loss (``unused``), only through an index (``picker``: argmax) or only
    under no_grad (``frozen``): eager leaves their ``.grad`` None, so AdamW gives them no weight decay."""

    def __init__(self):
        super().__init__()
        self.lin, self.unused = nn.Linear(4, 2), nn.Parameter(torch.ones(3))
        self.picker, self.frozen = nn.Parameter(torch.randn(4)), nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            h = self.frozen(x)
        return (self.lin(x + h).pow(2).sum() + x[:, self.picker.argmax()].sum()) / 10


def test_parameters_without_a_path_to_the_loss_get_no_gradient_like_eager(target):
    torch.manual_seed(0)
    model, x = PartlyUsed(), torch.randn(5, 4)
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (x,), target=target)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1, weight_decay=0.5) for m in (eager, model)]
    for _ in range(3):
        for m, opt in zip((eager, cm), opts):
            opt.zero_grad()
            m(x).backward()
            opt.step()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        torch.testing.assert_close(q, p, msg=name)
    assert model.unused.grad is None and model.picker.grad is None and model.frozen.weight.grad is None


class ThroughZeroGradients(nn.Module):
    """Parameters that reach the loss only through operators whose gradient is zero (``round``, ``sign``,
    ``floor``, a tensor zeroed or filled in place): eager gives them a zero gradient, not None, so AdamW decays them
    and moves their moments. One read only through a comparison or a fresh ``zeros_like`` gets None; so does an
    output computed from a comparison alone (no requires_grad)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.rounded, self.signed, self.floored, self.compared = (nn.Parameter(torch.randn(4)) for _ in range(4))
        self.zeroed, self.filled, self.templated = (nn.Parameter(torch.randn(4)) for _ in range(3))

    def forward(self, x):
        q = torch.round(x * self.rounded) + torch.sign(x * self.signed) + torch.floor(x * self.floored)
        zeroed, filled = x * self.zeroed, x * self.filled
        zeroed.zero_()
        filled.fill_(0.5)
        q = q + zeroed + filled + torch.zeros_like(x * self.templated)
        mask = (self.compared > 0).to(x.dtype)
        return self.lin(x + q).pow(2).sum() / 10 + (x * mask).sum(), mask


@pytest.mark.parametrize("route", ["compile", "dynamo"])
def test_parameters_reaching_the_loss_through_zero_gradients_get_zeros_like_eager(target, route):
    import torch._dynamo

    torch.manual_seed(0)
    model, x = ThroughZeroGradients(), torch.randn(5, 4)
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (x,), target=target) if route == "compile" else torch.compile(model, backend="pullback")
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1, weight_decay=0.5) for m in (eager, model)]
    for _ in range(3):
        for m, opt in zip((eager, cm), opts):
            opt.zero_grad()
            loss, mask = m(x)
            assert loss.requires_grad and not mask.requires_grad
            loss.backward()
            opt.step()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        torch.testing.assert_close(q, p, msg=name)
    for p in (model.rounded, model.signed, model.floored, model.zeroed, model.filled):
        assert p.grad is not None and not p.grad.any()
    assert model.compared.grad is None and model.templated.grad is None
    torch._dynamo.reset()


class SamplersInForward(nn.Module):
    """Tensor's in-place samplers on fresh tensors (how ``F.gumbel_softmax`` draws its noise), one on a transposed
    ``empty_like`` (filled in that layout, as eager fills it)."""

    def forward(self, x):
        noise = (torch.empty_like(x).uniform_(-2.0, 3.0) + torch.empty_like(x).cauchy_(0.5, 2.0)
                 + torch.empty_like(x).geometric_(0.3) + torch.empty_like(x).log_normal_(0.5, 0.25)
                 + torch.empty_like(x.T).exponential_(2.0).T)
        return x * noise


def test_samplers_become_random_inputs_drawn_as_eager_draws_them(target):
    x = torch.randn(3, 4, dtype=torch.float64)
    prog = import_torch(SamplersInForward(), (x,))
    assert [m.kind for m in prog.masks] == ["uniform", "cauchy", "geometric", "log_normal", "exponential"]
    assert prog.masks[0].params == (-2.0, 3.0) and prog.masks[4].stride is not None
    _draws_like_eager(SamplersInForward, x, target, 7, rtol=0, atol=0)


class GumbelCodebook(nn.Module):
    """A discrete bottleneck: straight-through Gumbel-softmax over a codebook (dVAE / VQ-style), and a
    contrastive NT-Xent term whose self-similarities are masked by ``fill_diagonal_``."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(6, 8)
        self.codebook = nn.Linear(8, 5, bias=False)

    def forward(self, x):
        z = F.gumbel_softmax(self.enc(x), tau=0.7, hard=True)
        rec = F.mse_loss(self.codebook(z), x[:, :5])
        h = F.normalize(self.enc(x), dim=1)
        sim = (h @ h.T / 0.5).fill_diagonal_(-1e9)
        labels = torch.arange(x.shape[0]).roll(x.shape[0] // 2)
        return rec + F.cross_entropy(sim, labels)


def test_gumbel_softmax_and_fill_diagonal_train_like_eager(target):
    torch.manual_seed(0)
    model = GumbelCodebook().double()
    eager = copy.deepcopy(model)
    x = torch.randn(6, 6, dtype=torch.float64)
    cm = pb_compile(model, (x,), target=target)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    for step in range(3):
        for m, opt in zip((cm, eager), opts):
            torch.manual_seed(100 + step)  # the same Gumbel noise for both
            opt.zero_grad()
            loss = m(x)
            loss.backward()
            opt.step()
            if m is cm:
                got = loss.detach()
        torch.testing.assert_close(got, loss.detach(), rtol=1e-12, atol=1e-12)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)


class UnusedDropout(nn.Module):
    """A dropout whose result nothing uses (as in a classifier that ignores one of its encoder's outputs, Hugging
    Face's CANINE and LiLT): eager still draws its mask, so the draws after it depend on it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        F.dropout(h * 2, 0.5, self.training)  # drawn, never used
        return F.dropout(h, 0.5, self.training).square().sum()


def test_a_dropout_whose_result_is_unused_still_draws_its_mask(target):
    x = torch.randn(3, 4)
    prog = import_torch(UnusedDropout(), (x,))
    assert [m.kind for m in prog.masks] == ["bernoulli", "bernoulli"]
    torch.manual_seed(0)
    model = UnusedDropout()
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (x,), target=target)
    for seed in (3, 4):
        torch.manual_seed(seed)
        out = cm(x)
        out.backward()
        torch.manual_seed(seed)
        ref = eager(x)
        ref.backward()
        torch.testing.assert_close(out, ref)
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad)


class TimeMajorProjection(nn.Module):
    """FSMT's decoder works time-major and ends with ``output_projection(x.transpose(0, 1))``: eager's ``linear``
    returns a contiguous (B, T, V) tensor, which its loss reshapes with ``.view``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 10, bias=False)

    def forward(self, x):
        return self.lin(x.transpose(0, 1))


class ViewedLoss(TimeMajorProjection):
    def forward(self, x):
        logits = super().forward(x)
        torch._dynamo.graph_break()
        return logits.view(-1, 10).logsumexp(-1).mean()


def test_outputs_have_eagers_layout(target):
    """A GEMM of a transposed input may run as a view in the input's axis order; the outputs eager returns
    contiguous come back contiguous (``.view`` after the call raised), with grad and without."""
    torch.manual_seed(0)
    model, x = TimeMajorProjection(), torch.randn(4, 3, 8)
    compiled = pb_compile(copy.deepcopy(model), (x,), target=target)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            out = compiled(x)
        assert out.is_contiguous()
        torch.testing.assert_close(out.view(-1, 10), model(x).view(-1, 10))


def test_outputs_have_eagers_layout_through_torch_compile():
    """Dynamo traces the code after a graph break with the graph's outputs laid out as its fake values are."""
    from pullback.integrations.dynamo_backend import pullback_backend

    torch.manual_seed(0)
    model, x = ViewedLoss().double(), torch.randn(4, 3, 8, dtype=torch.float64)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    try:
        loss = torch.compile(model, backend=pullback_backend)(x)
        loss.backward()
    finally:
        torch._dynamo.reset()
    want = eager(x)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad, rtol=1e-12, atol=1e-14)


class PlainTensorAttribute(nn.Module):
    """A plain tensor attribute (not a buffer) read in ``forward``, beside a tensor made in ``forward``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = torch.ones(3)

    def forward(self, x):
        return self.lin(x) * self.scale + torch.tensor([1.0, 2.0, 3.0])


def test_a_plain_tensor_attribute_written_or_rebound_is_read_again():
    """torch.export bakes it into the program as a constant: written in place or rebound, the module is exported
    again (it was silently kept), with a warning that it should be a buffer once that happens often; a tensor made
    in ``forward`` is no such attribute."""
    torch.manual_seed(0)
    model, x = PlainTensorAttribute(), torch.randn(2, 3)
    compiled = pb_compile(model, (x,))
    for _ in range(3):
        torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled._imports) == 1
    model.scale.mul_(2.0)
    torch.testing.assert_close(compiled(x), model(x))
    model.scale = torch.tensor([0.0, 1.0, 10.0])
    torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled._imports) == 1
    model.scale.add_(1.0)
    with pytest.warns(UserWarning, match=r"tensor attribute it reads \('scale'\).*register_buffer"):
        out = compiled(x)
    torch.testing.assert_close(out, model(x))


class Ratio(nn.Module):
    def forward(self, x, y):
        return x / y


def test_the_gradients_of_a_division_are_eagers_bit_for_bit():
    """``x / y``'s gradients by PyTorch's formulas (``g / y`` and ``-g * ((x / y) / y)``): in float32 the same bits
    as eager's (the divisor's gradient was ``-(g / y) * (x / y)``, one rounding off on a third of the elements)."""
    torch.manual_seed(0)
    x, y, g = torch.randn(1000), torch.rand(1000) + 0.1, torch.randn(1000)
    want = torch.autograd.grad(Ratio()(x.requires_grad_(), y.requires_grad_()), (x, y), g)
    xs, ys = x.detach().requires_grad_(), y.detach().requires_grad_()
    got = torch.autograd.grad(pb_compile(Ratio(), (xs, ys), target="torch")(xs, ys), (xs, ys), g)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


class WithConstant(nn.Module):
    """A loss beside a tensor built from constants alone and one computed under no_grad."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():
            scale = y.abs().max()
        return y.sum(), torch.arange(x.shape[0], dtype=x.dtype) * 2.0, scale


def test_only_outputs_computed_from_what_requires_grad_require_grad():
    """As in eager, an output computed from constants (or under no_grad) does not require grad: ``.numpy()`` on it
    works and a later step that reads it does not reach this step's backward."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    model = WithConstant()
    want = [o.requires_grad for o in model(x)]
    got = pb_compile(model, (x,))(x)
    assert [o.requires_grad for o in got] == want == [True, False, False]
    np.testing.assert_array_equal(got[1].numpy(), [0.0, 2.0, 4.0])
    got[0].backward()
    assert model.lin.weight.grad is not None


class LazyCache(nn.Module):
    """timm's ConViT: a buffer rebuilt from constants at the first call (``self.rel_indices = ...``), read after."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("rel", torch.zeros(1, 1), persistent=False)

    def forward(self, x):
        n = x.shape[0]
        if self.rel.shape[1] != n:
            self.rel = torch.arange(n, dtype=x.dtype).view(1, n) * 2.0
        return (self.lin(x) * self.rel.t()).sum()


def test_a_buffer_rebuilt_from_constants_in_forward_trains_through_torch_compile():
    """Dynamo returns the rebuilt buffer from the graph: it came back requiring grad, and the next step's backward
    reached this step's freed one ("Trying to backward through the graph a second time")."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LazyCache()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="pullback")
    x = torch.randn(3, 4)
    for _ in range(3):
        got, want = compiled(x), eager(x)
        got.backward()
        want.backward()
        assert not model.rel.requires_grad
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad)
    torch._dynamo.reset()


def _same_loss_and_gradients(eager, model, le, lp, rtol: float) -> None:
    """Backward through both losses; the losses and every parameter's gradient equal (none missing)."""
    le.backward()
    lp.backward()
    assert torch.allclose(lp, le, rtol=1e-12, atol=0)
    for (name, pe), pp in zip(eager.named_parameters(), model.parameters()):
        assert pp.grad is not None, name
        assert torch.allclose(pp.grad, pe.grad, rtol=rtol, atol=1e-12), name


class _ClampsInForward(nn.Module):
    """A weight clipped in place in the forward, outside autograd (Gemma3n's AltUp coefficients in training), then
    read: eager trains it with the gradient of that read."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.coefs = nn.Linear(4, 6, bias=False)
        self.out = nn.Linear(6, 1)

    def forward(self, x):
        if self.how == "data":
            self.coefs.weight.data.clamp_(-0.2, 0.2)
        elif self.how == "no_grad":
            with torch.no_grad():
                self.coefs.weight.clamp_(-0.2, 0.2)
        else:  # a read of its own after the block, detached by the user: no gradient through that read
            with torch.no_grad():
                self.coefs.weight.clamp_(-0.2, 0.2)
            x = x + F.linear(x, self.coefs.weight.detach()).sum(-1, keepdim=True)
        return torch.tanh(self.out(self.coefs(x))).pow(2).sum()


@pytest.mark.parametrize("how, route", [("no_grad", "compile"), ("no_grad", "dynamo"), ("data", "dynamo"),
                                        ("detached", "compile")])
def test_a_weight_written_in_place_outside_autograd_keeps_its_gradient(how, route):
    """A parameter written in place in the forward without autograd (``p.data.clamp_``, or in place under
    ``torch.no_grad()``) and read after: its gradient is the read's, as in eager (it got none at all: the
    functionalised program read a value computed from detached data); three SGD steps give eager's losses,
    gradients and weights in float64."""
    torch.manual_seed(0)
    model = _ClampsInForward(how).double().train()
    with torch.no_grad():
        model.coefs.weight[0, 0] = -0.0  # written back as it is: a negative zero stays one
    eager = copy.deepcopy(model)
    x = torch.randn(5, 4, dtype=torch.float64)
    compiled = pb_compile(model, (x,), target="torch") if route == "compile" else torch.compile(model, backend="pullback")
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, model)]
    for step in range(3):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        le, lp = eager(x), compiled(x)
        if step == 0:
            assert torch.equal(model.coefs.weight, eager.coefs.weight) and torch.signbit(model.coefs.weight[0, 0])
        _same_loss_and_gradients(eager, model, le, lp, rtol=1e-10)
        for opt in opts:
            opt.step()
    for pe, pp in zip(eager.parameters(), model.parameters()):
        assert torch.allclose(pp, pe, rtol=1e-10, atol=1e-12)


class _WritesItsInput(nn.Module):
    """A graph break hands ``h`` (computed with gradients) to a second Dynamo graph that writes it in place, with
    autograd or under ``torch.no_grad()``."""

    def __init__(self, no_grad: bool):
        super().__init__()
        self.no_grad = no_grad
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x):
        h = self.a(x) + 0.5
        torch._dynamo.graph_break()
        if self.no_grad:
            with torch.no_grad():
                h.mul_(2)
        else:
            h.mul_(2)
        return (h + self.b(x)).pow(2).sum()


@pytest.mark.parametrize("no_grad", [True, False])
def test_an_input_written_in_place_keeps_the_gradient_eager_gives_it(no_grad):
    """Written under ``torch.no_grad()``, the later reads of ``h`` take its new value and pass their gradient to
    ``h`` unscaled (``a`` got no gradient before); written with autograd, through the write (times 2). Both as
    eager, in float64."""
    torch.manual_seed(0)
    model = _WritesItsInput(no_grad).double()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 4, dtype=torch.float64)
    _same_loss_and_gradients(eager, model, eager(x), torch.compile(model, backend="pullback")(x), rtol=1e-12)


def test_one_tensor_given_for_two_inputs_still_makes_a_program_of_two(target):
    """``model(ids, ids)`` as the example: torch.export traces the two inputs as one; the program must still read
    each input where it is later given distinct tensors (a language model compiled on ``labels=ids``)."""
    torch.manual_seed(0)
    model = TiedLM()
    eager = copy.deepcopy(model)
    ids = torch.tensor([[1, 3, 4], [5, 2, 7]])
    compiled = pb_compile(model, (ids, ids), target=target)
    labels = torch.tensor([[2, 2, 3], [4, 9, 6]])
    got, want = compiled(ids, labels), eager(ids, labels)
    got.backward()
    want.backward()
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    np.testing.assert_allclose(model.emb.weight.grad.numpy(), eager.emb.weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    prog = import_torch(eager, (ids, ids))
    loss = pb.build(prog.mod)["main"](*main_inputs(prog, [ids.numpy(), labels.numpy()]))
    assert float(np.asarray(loss)) == pytest.approx(want.item(), rel=1e-6)


class CachingForward(nn.Module):
    """Keeps the last hidden activation (a tensor attribute) and counts its calls (a number) in forward."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)
        self.cache, self.calls = None, 0

    def forward(self, x):
        h = self.a(x)
        previous = torch.zeros_like(h) if self.cache is None else self.cache
        self.cache = h.detach()
        self.calls += 1
        return self.b(h + 0.5 * previous).square().mean()


def test_attributes_forward_assigns_are_named_by_a_warning_and_torch_compile_replays_them():
    """The exported program keeps no side effect: compile warns, naming each attribute and its line (before, the
    cache silently stayed None and every step computed as the first); torch.compile(backend="pullback") replays
    them, training like eager."""
    torch.manual_seed(0)
    model, x = CachingForward(), torch.randn(3, 4)
    with pytest.warns(UserWarning, match=r"forward assigns module attributes \(CachingForward.cache at "
                                         r".*test_semantics.py:\d+; CachingForward.calls at .*torch.compile"):
        pb_compile(model, (x,))
    assert model.cache is None and model.calls == 0  # as the user left them
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="pullback")
    for m in (eager, compiled):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            loss = m(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
    torch._dynamo.reset()
    assert model.calls == eager.calls == 3
    torch.testing.assert_close(model.cache, eager.cache)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_a_sparse_embedding_is_named_by_a_warning_and_trains_with_sgd_like_eager(target):
    """``nn.Embedding(sparse=True)``: pullback's gradient of its weight is dense; a warning says so (SparseAdam
    would refuse it with no word of why it is dense), and SGD updates as with eager's sparse gradient."""
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(20, 8, sparse=True, padding_idx=0), nn.Linear(8, 3)

        def forward(self, ids, y):
            return F.cross_entropy(self.head(self.embed(ids).mean(1)), y)

    torch.manual_seed(0)
    model = Bag()
    eager = copy.deepcopy(model)
    ids, y = torch.randint(0, 20, (4, 5)), torch.randint(0, 3, (4,))
    with pytest.warns(UserWarning, match=r"sparse=True gets a dense weight gradient.*SparseAdam refuses it.*sparse=False"):
        compiled = pb_compile(model, (ids, y), target=target)
        compiled(ids, y)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, model)]
    for _ in range(3):
        for m, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            m(ids, y).backward()
            opt.step()
    assert eager.embed.weight.grad.is_sparse
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q)
