"""``torch.compile(backend="pullback")`` on models that Dynamo splits into several graphs: what a graph break
leaves to the backend (an empty graph, sizes passed through, ``x.data``, guards of Dynamo's own frame) trains
like eager. Hugging Face's LayerDrop, Longformer's global attention and I-BERT's range checks are of this kind
(``scripts/hf_census.py --route dynamo``)."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from pullback import PullbackError  # noqa: E402
from pullback.integrations.dynamo_backend import pullback_backend  # noqa: E402
from pullback.integrations.torch import train_side_by_side  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class LayerDrop(nn.Module):
    """Skips each layer when a draw falls under ``p`` (a branch on a tensor's value: a graph break per layer)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
        self.p = p

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand([]) < self.p:
                continue
            x = torch.tanh(layer(x))
        return x.square().mean()


class DataRange(nn.Module):
    """Scales by the range of its activations read through ``.data`` (no gradient through the range), and asserts
    on a tensor's value (a graph break), as I-BERT's QuantAct does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        lo, hi = y.data.min(), y.data.max()
        assert hi.isnan().sum() == 0
        return (y / (hi - lo)).square().mean()


class Sizes(nn.Module):
    """Reads a size before a graph break and uses it after: once the length changes from call to call (Dynamo
    makes it symbolic), the first graph passes the size through to the code after it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        n = x.shape[1]
        h = self.lin(x.reshape(-1, 4))
        torch._dynamo.graph_break()
        return h.view(2, n, 4).square().mean()


class WriteAfter(nn.Module):
    """Writes a parameter into a graph's result after a graph break, in place (wav2vec2's SpecAugment:
    ``hidden_states[mask] = masked_spec_embed``); the result is a view (the torch target's reshape)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 12)
        self.fill = nn.Parameter(torch.randn(4))

    def forward(self, x):
        h = self.lin(x).view(-1, 3, 4)
        if h.sum() > 0:
            h = h * 2
        h[h[..., 0] > 0] = self.fill
        return h.square().mean()


class Experts(nn.Module):
    """A mixture of experts as DBRX writes it: a zero accumulator, then per expert the router picked (a loop over a
    data-dependent set: a graph break each) ``index_add_`` of that expert's tokens into it."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.router = nn.Linear(4, 3)

    def forward(self, x):
        h = x.reshape(-1, 4)
        r = torch.softmax(self.router(h), -1)
        top = r.argmax(-1)
        acc = torch.zeros_like(h)
        for e in torch.unique(top):
            idx = torch.where(top == e)[0]
            acc.index_add_(0, idx, self.experts[e](h[idx]) * r[idx, e, None])
        return acc.square().mean()


class NumpyMasks(nn.Module):
    """Zeroes rows chosen with ``np.random`` (SpecAugment's masks are drawn so)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        keep = torch.from_numpy(np.random.rand(h.shape[0]) < 0.5)
        return (h * keep[:, None]).square().mean()


def _train_side_by_side(model, batches, rtol: float = 1e-9, target: str = "torch"):
    """SGD steps of ``model`` eagerly and through the backend on ``target``, the same draws: equal losses and
    parameters after each step (float64)."""
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=functools.partial(pullback_backend, target=target))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    for step, x in enumerate(batches):
        losses = []
        for m, opt in zip((ref, compiled), opts):
            torch.manual_seed(100 + step)
            loss = m(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=rtol), f"step {step}"
        for (name, a), b in zip(ref.named_parameters(), model.parameters()):
            where = f"{name} after step {step}"
            torch.testing.assert_close(b, a, rtol=rtol, atol=rtol * 1e-2, msg=lambda m, where=where: f"{where}: {m}")


def test_layer_drop_trains_like_eager(target):
    torch.manual_seed(0)
    _train_side_by_side(LayerDrop().double(), [torch.randn(3, 4, dtype=torch.float64) for _ in range(6)], target=target)


def test_data_reads_train_like_eager(target):
    torch.manual_seed(0)
    _train_side_by_side(DataRange().double(), [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)], target=target)


def test_sizes_passed_through_a_graph_train_like_eager(target):
    torch.manual_seed(0)
    _train_side_by_side(Sizes().double(), [torch.randn(2, n, 4, dtype=torch.float64) for n in (3, 5, 5, 7, 3)], target=target)


@pytest.mark.slow
def test_longformer_trains_like_eager():
    """Longformer's global attention branches on ``.any().item()``: torch.export refuses it, Dynamo splits it into
    graphs whose sizes Dynamo guards (the backend's exports share Dynamo's ShapeEnv and leave its guards to it)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LongformerConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, attention_window=4, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0)

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = transformers.LongformerForSequenceClassification(cfg)

        def forward(self, ids):
            return self.model(input_ids=ids, labels=torch.tensor([0, 1])).loss

    batches = [torch.randint(1, 40, (2, 6)) for _ in range(2)]
    _train_side_by_side(Loss().double(), batches, rtol=1e-6)  # its masks add finfo.min: float64 rounding grows


def test_writing_into_a_result_in_place_trains_like_eager(target):
    torch.manual_seed(0)
    _train_side_by_side(WriteAfter().double(), [torch.randn(5, 4, dtype=torch.float64) for _ in range(3)], target=target)


def test_experts_accumulating_in_place_train_like_eager(target):
    """The accumulator is a constant of the first graph (zeros): each call returns a tensor of its own, or the
    writes of one step would be the next step's starting values."""
    torch.manual_seed(0)
    _train_side_by_side(Experts().double(), [torch.randn(2, 5, 4, dtype=torch.float64) for _ in range(3)],
                        target=target)


class ChunkLcm(nn.Module):
    """Reformer's chunk length: ``np.lcm`` of two config ints, which Dynamo traces into ``aten.lcm`` of 0-d int
    tensors; a gcd of integer activations beside it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lsh, self.local = 4, 6

    def forward(self, x):
        k = int(np.lcm(self.lsh, self.local))
        g = torch.gcd((x.abs() * 10).long(), torch.tensor([4, 6, 9, 12]))
        return (self.lin(x) * g / k).square().mean()


def test_np_lcm_of_config_ints_trains_like_eager(target):
    torch.manual_seed(0)
    _train_side_by_side(ChunkLcm().double(), [torch.randn(3, 4, dtype=torch.float64) for _ in range(3)], target=target)


def test_numpy_draws_train_like_eager_with_numpys_stream():
    """Dynamo draws ``np.random`` from torch's generator unless told to keep NumPy's stream; kept, the masks are
    eager's (``train_side_by_side`` seeds both generators at each step)."""
    torch.manual_seed(0)
    batches = [((torch.randn(6, 4, dtype=torch.float64),), None) for _ in range(4)]
    with torch._dynamo.config.patch(use_numpy_random_stream=True):
        res = train_side_by_side(NumpyMasks().double(), batches, lambda loss, _: loss, route="dynamo", verbose=False)
    assert res["pullback"] == pytest.approx(res["eager"], rel=1e-12)
    assert len(set(res["eager"])) == 4 and res["max_weight_diff"] < 1e-12


def test_train_side_by_side_names_its_routes():
    with pytest.raises(PullbackError, match="route must be 'export' or 'dynamo'"):
        train_side_by_side(NumpyMasks(), [((torch.randn(2, 4),), None)], lambda loss, _: loss, route="jit")


def test_a_graph_that_returns_no_tensor_runs_as_it_is():
    gm = torch.fx.symbolic_trace(lambda: ())
    assert pullback_backend(gm, []) is gm



class TensorHook(nn.Module):
    """Halves the gradient reaching a hidden activation (``Tensor.register_hook`` in forward)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.a(x)
        if h.requires_grad:
            h.register_hook(lambda g: g * 0.5)
        return self.b(torch.relu(h)).square().mean()


def test_a_gradient_hook_on_a_tensor_runs_that_graph_eagerly_with_a_warning(target):
    """Dynamo keeps the hook in the graph (the ``register_hook`` higher-order operator); torch.export dropped it and
    the gradients were twice eager's. Now the graph runs eagerly, said by a warning, and trains like eager."""
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"gradient hook on a tensor.*register_hook.*runs eagerly"):
        _train_side_by_side(TensorHook().double(), [torch.randn(3, 4, dtype=torch.float64) for _ in range(3)],
                            target=target)


class GradientPenalty(nn.Module):
    """WGAN-GP's critic loss: the critic's gradient at interpolated points, taken in forward."""

    def __init__(self):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, real):
        fake = real.flip(0)
        x = (0.3 * real + 0.7 * fake).requires_grad_(True)
        (g,) = torch.autograd.grad(self.critic(x).sum(), x, create_graph=True)
        return self.critic(fake).mean() - self.critic(real).mean() + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()


def test_a_gradient_penalty_taken_in_forward_trains_like_eager(target):
    """WGAN-GP (``torch.autograd.grad(..., create_graph=True)`` in forward): Dynamo runs the gradient eagerly
    between the graphs it hands over."""
    torch.manual_seed(0)
    _train_side_by_side(GradientPenalty().double(), [torch.randn(4, 4, dtype=torch.float64) for _ in range(3)],
                        target=target)


def test_a_gradient_penalty_traced_into_the_graph_runs_that_graph_eagerly(target):
    """With ``trace_autograd_ops`` (and, in one process, after PyTorch's ``torch.cond`` autograd had run), Dynamo
    traces ``torch.autograd.grad`` into the graph instead of breaking there; torch.export cannot trace autograd
    on its fake tensors ("Expected a real tensor"), so that graph runs eagerly, as the graph break would have."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        _train_side_by_side(GradientPenalty().double(), [torch.randn(4, 4, dtype=torch.float64) for _ in range(3)],
                            target=target)
    torch._dynamo.reset()


class DetachedLeaf(nn.Module):
    """A detached copy made a leaf of its own (``h.detach().requires_grad_()``): a graph break, the first graph
    returning ``h`` and ``h.detach()``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        h = self.a(x)
        leaf = h.detach().requires_grad_()
        return self.b(h).square().mean() + (leaf * 2).sum() * 0.1


def test_a_detached_leaf_made_in_forward_trains_like_eager(target):
    """The first graph's two outputs were one tensor, marked non-differentiable: ``a`` got no gradient."""
    torch.manual_seed(0)
    _train_side_by_side(DetachedLeaf().double(), [torch.randn(3, 4, dtype=torch.float64) for _ in range(3)],
                        target=target)


class AutocastBlock(nn.Module):
    """A bfloat16 autocast block inside forward (Dynamo keeps it as _enter_autocast/_exit_autocast calls)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x).relu()
        return self.b(h.float()).square().mean()


def test_an_autocast_block_in_forward_trains_like_eager(target):
    """The block's matmul in bfloat16, as eager computes it (torch.export once failed on its casts' dtypes): eager's
    bits on numpy and torch; XLA fuses the block's elementwise operators and rounds once for several (within
    bfloat16's rounding)."""
    torch.manual_seed(0)
    model = AutocastBlock()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=functools.partial(pullback_backend, target=target))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for _ in range(3):
        x = torch.randn(4, 8)
        losses = []
        for m, opt in zip((eager, compiled), opts):
            loss = m(x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        tol = dict(rtol=2e-2, atol=1e-3) if target == "jax" else dict(rtol=0, atol=0)
        torch.testing.assert_close(losses[1], losses[0], **tol)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p, q, **tol)


def test_torch_compiles_options_choose_the_target_and_its_modes_are_accepted(monkeypatch):
    """``torch.compile(model, backend="pullback", options={"target": ..., "policy": ...})`` as for Inductor's
    options; ``mode=`` (Inductor's tuning) changes nothing; an unknown option or mode is refused by name."""
    import pullback.integrations.dynamo_backend as db

    made = []
    real = db.TrainingProgram
    monkeypatch.setattr(db, "TrainingProgram", lambda prog, wrt, target, policy: made.append((target, policy))
                        or real(prog, wrt, target, policy))
    torch.manual_seed(0)
    model, x = nn.Linear(3, 1).double(), torch.randn(4, 3, dtype=torch.float64)
    for kw, want in ((dict(options={"target": "numpy", "policy": "min_cut"}), ("numpy", "min_cut")),
                     (dict(mode="max-autotune"), (db.DEFAULT_TARGET, "save_all"))):
        torch._dynamo.reset()
        made.clear()
        loss = torch.compile(model, backend="pullback", **kw)(x).square().sum()
        loss.backward()
        assert made == [want], kw
        torch.testing.assert_close(loss, model(x).square().sum())
    for kw, message in ((dict(options={"targte": "numpy"}), "unknown option 'targte'"),
                        (dict(options={"target": "tpu"}), "target must be one of"),
                        (dict(mode="fastest"), "mode must be one of")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(model, backend="pullback", **kw)(x)
