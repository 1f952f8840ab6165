"""``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` imported as one ``nn.lstm`` / ``nn.gru`` / ``nn.rnn`` per layer and
direction (eager's kernels on torch: oneDNN's fused LSTM layer, ATen's GRU and RNN; a loop over the steps on numpy
and jax), where PyTorch's decomposition unrolls every step's cell; trained like eager on every target, with the dropout between layers, given initial
states, a varying batch, through Dynamo, and under a gradient penalty. An LSTM with projections keeps PyTorch's
decomposition."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import pullback as pb  # noqa: E402
from pullback.frontend import import_torch, main_inputs  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402

TARGETS = ("numpy", "jax", "torch")
CONFIGS = {"stacked": dict(num_layers=2), "bidirectional-batch-first": dict(num_layers=2, bidirectional=True, batch_first=True),
           "no-bias": dict(bias=False)}
CELLS = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN, "rnn-relu": functools.partial(nn.RNN, nonlinearity="relu")}


def _op(cell: str) -> str:
    return f"nn.{cell.split('-')[0]}"


def _ops(fn) -> list:
    return [n.op.name for n in pb.ir.traversal.post_order(fn.body) if isinstance(n, pb.Call) and hasattr(n.op, "name")]


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_recurrent_layer_imports_as_one_operator_per_layer_and_direction(config, cell):
    kw = CONFIGS[config]
    torch.manual_seed(0)
    model = CELLS[cell](4, 6, **kw).double()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    prog = import_torch(model, (x,))
    ops = _ops(prog.main)
    assert ops.count(_op(cell)) == kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1), ops
    assert not {"sigmoid", "tanh", "nn.dense", "nn.linear"} & set(ops), sorted(set(ops))
    y, state = model(x)
    for target in TARGETS:
        got = pb.build(prog.mod, target=target)["main"](*main_inputs(prog, (x,)))
        for a, b in zip(got, (y, *state) if cell == "lstm" else (y, state)):
            np.testing.assert_allclose(np.asarray(a), b.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=target)


class Tagger(nn.Module):
    """Embeddings, a stacked bidirectional LSTM or GRU with dropout between its layers from given initial states,
    a linear head, cross-entropy over every position."""

    def __init__(self, cell: str = "lstm", proj_size: int = 0):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        kw = dict(proj_size=proj_size) if cell == "lstm" else {}
        self.rnn = CELLS[cell](6, 8, num_layers=2, dropout=0.3, bidirectional=True, batch_first=True, **kw)
        self.head = nn.Linear(2 * (proj_size or 8), 5)

    def forward(self, ids, labels, *states):
        y, _ = self.rnn(self.embed(ids), (states if len(states) > 1 else states[0]) if states else None)
        return nn.functional.cross_entropy(self.head(y).flatten(0, 1), labels.flatten())


def _batch(step: int, batch: int = 3, proj: int = 0, dtype=torch.float32, states: int = 2):
    """Token ids, labels and ``states`` initial states to learn from (an LSTM's hidden and cell states, a GRU's
    hidden state)."""
    g = torch.Generator().manual_seed(step)
    ids, labels = torch.randint(0, 11, (batch, 7), generator=g), torch.randint(0, 5, (batch, 7), generator=g)
    sizes = (proj or 8, 8)[:states]
    return (ids, labels) + tuple(torch.randn(4, batch, n, generator=g, dtype=dtype, requires_grad=True) for n in sizes)


def _train_side_by_side(model, compiled, batches, rtol: float, atol: float):
    eager = copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for step, inputs in enumerate(batches):
        losses, state_grads = [], []
        for f, opt in zip((eager, compiled), opts):
            args = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
            torch.manual_seed(step)  # the same dropout masks
            opt.zero_grad()
            loss = f(*args)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            state_grads.append([a.grad for a in args[2:]])
        np.testing.assert_allclose(losses[1], losses[0], rtol=rtol, err_msg=f"step {step}")
        for a, b in zip(*state_grads):
            torch.testing.assert_close(b, a, rtol=rtol, atol=atol)
    for (k, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def _states(cell: str) -> int:
    return 2 if cell == "lstm" else 1


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_stacked_bidirectional_rnn_with_dropout_trains_like_eager(target, dtype, cell):
    """On torch, eager's kernels both ways (float32 LSTM: oneDNN's layer); elsewhere the loops over the steps."""
    torch.manual_seed(0)
    dt, n = getattr(torch, dtype), _states(cell)
    model = Tagger(cell).to(dt).train()
    compiled = pb_compile(model, _batch(0, dtype=dt, states=n), target=target)
    prog = import_torch(model, _batch(0, dtype=dt, states=n))
    assert _ops(prog.main).count(_op(cell)) == 4 and [m.rate for m in prog.masks] == [0.3]
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == "float32" else dict(rtol=1e-11, atol=1e-13)
    _train_side_by_side(model, compiled, [_batch(s, dtype=dt, states=n) for s in range(3)], **tol)


@pytest.mark.parametrize("cell", list(CELLS))
def test_a_recurrent_model_trains_like_eager_over_batches_of_every_size(cell):
    torch.manual_seed(1)
    model = Tagger(cell).double().eval()  # (no dropout: eval mode; zero initial states)
    compiled = pb_compile(model, _batch(0, 3, states=0), target="torch", dynamic_batch=True)
    _train_side_by_side(model, compiled, [_batch(s, b, states=0) for s, b in enumerate((3, 5, 2))],
                        rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("cell", list(CELLS))
def test_a_recurrent_model_trains_like_eager_through_dynamo(cell):
    from pullback.integrations.dynamo_backend import pullback_backend

    torch.manual_seed(2)
    model = Tagger(cell).double().train()
    torch._dynamo.reset()
    try:  # (Dynamo captures RNN modules only with allow_rnn; else it runs them eagerly between its graphs)
        with torch._dynamo.config.patch(allow_rnn=True):
            compiled = torch.compile(model, backend=pullback_backend)
            _train_side_by_side(model, compiled, [_batch(s, dtype=torch.float64, states=_states(cell)) for s in range(2)],
                                rtol=1e-11, atol=1e-13)
    finally:
        torch._dynamo.reset()


def test_an_lstm_with_projections_keeps_the_unrolled_cells_and_trains_like_eager():
    torch.manual_seed(3)
    model = Tagger("lstm", proj_size=3).double().train()
    prog = import_torch(model, _batch(0, proj=3, dtype=torch.float64))
    assert "nn.lstm" not in _ops(prog.main)
    compiled = pb_compile(model, _batch(0, proj=3, dtype=torch.float64), target="torch")
    _train_side_by_side(model, compiled, [_batch(s, proj=3, dtype=torch.float64) for s in range(2)],
                        rtol=1e-11, atol=1e-13)


class Critic(nn.Module):
    """A sequence critic: a bidirectional LSTM or GRU and a linear score per sequence."""

    def __init__(self, cell: str = "lstm"):
        super().__init__()
        self.rnn, self.score = CELLS[cell](3, 4, bidirectional=True), nn.Linear(8, 1)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.score(y.mean(0)).sum()


@pytest.mark.parametrize("cell", list(CELLS))
@pytest.mark.parametrize("target", TARGETS)
def test_a_gradient_penalty_through_a_recurrent_layer_trains_like_eager(target, cell):
    """Second derivatives: ``nn.lstm_grad`` / ``nn.gru_grad`` are differentiated through their step-by-step
    expansions (WGAN-GP's penalty on a recurrent critic), against eager's double backward in float64."""
    torch.manual_seed(4)
    model = Critic(cell).double()
    eager = copy.deepcopy(model)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    compiled = pb_compile(model, (x,), target=target)
    for f in (eager, compiled):
        xr = x.clone().requires_grad_()
        score = f(xr)
        (g,) = torch.autograd.grad(score, xr, create_graph=True)
        (score + (g.flatten(1).norm(dim=1) - 1).pow(2).mean()).backward()
    for (k, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("target", TARGETS)
def test_gradients_accumulated_over_two_backwards_stay_apart(target):
    """An LSTM's two biases get one gradient value: the integration hands each parameter a tensor of its own
    (sharing memory, the second accumulation would add into both)."""
    torch.manual_seed(5)
    model = Tagger().double().eval()
    eager, compiled = copy.deepcopy(model), pb_compile(model, _batch(0, states=0), target=target)
    for f in (eager, compiled):
        for step in range(2):  # no zero_grad: the second backward adds into the first's gradients
            f(*_batch(step, states=0)).backward()
    for (k, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-11, atol=1e-13, msg=lambda m, k=k: f"{k}: {m}")
