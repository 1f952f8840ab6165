"""The plan's order (``runtime.schedule.memory_order``): a topological order of the body's nodes in which each
value's last reader runs as soon as it can, so a gradient program's weight gradients run right after their
activation gradients (as PyTorch's autograd runs them) instead of after the whole chain; results unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Function, IRModule, op, var
from pullback.ir.traversal import post_order
from pullback.runtime.schedule import memory_order, operands
from pullback.transform import FirstOrderGradient, PartitionForwardBackward, standard_cleanup

LAYERS, ROWS, WIDTH = 4, 64, 32


def _mlp_grad(mode: str = "grad") -> IRModule:
    x = var("x", shape=(ROWS, WIDTH))
    ws = [var(f"w{i}", shape=(WIDTH, WIDTH)) for i in range(LAYERS)]
    h = x
    for w in ws:
        h = op.tanh(op.nn.dense(h, w))
    mod = IRModule.from_expr(Function([x, *ws], op.sum(op.multiply(h, h))))
    return standard_cleanup()(FirstOrderGradient(mode=mode)(mod))


def _residual_grad(mode: str = "grad") -> IRModule:
    """A transformer's residual MLP on (batch, rows, width) activations, biases included: each layer's output
    gradient is read last by two nodes together, its weight gradient's reshape and its bias gradient's sum."""
    x = var("x", shape=(2, ROWS, WIDTH))
    ws = [var(f"w{i}", shape=(WIDTH, WIDTH)) for i in range(LAYERS)]
    bs = [var(f"b{i}", shape=(WIDTH,)) for i in range(LAYERS)]
    h = x
    for w, b in zip(ws, bs):
        h = op.add(h, op.tanh(op.add(op.nn.dense(h, w), b)))
    mod = IRModule.from_expr(Function([x, *ws, *bs], op.sum(op.multiply(h, h))))
    return standard_cleanup()(FirstOrderGradient(mode=mode)(mod))


MODELS = {"mlp": _mlp_grad, "residual": _residual_grad}
VIEWS = ("reshape", "transpose", "squeeze", "expand_dims")


def _peak_bytes(order: list, body) -> int:
    """The most bytes of computed tensors alive at once when ``order`` runs, each freed after its last reader (a
    view's readers read its base; views and tuples hold no memory of their own)."""
    base = {}
    for n in order:
        view = isinstance(n, pb.Call) and n.op.name in VIEWS or isinstance(n, pb.TupleGetItem)
        base[n] = base[operands(n)[0]] if view else n
    last = {}
    for p, n in enumerate(order):
        for a in operands(n):
            last[base[a]] = p
    for a in (body.fields if isinstance(body, pb.Tuple) else (body,)):
        for b in (a.fields if isinstance(a, pb.Tuple) else (a,)):
            last[base[b]] = len(order)
    live, peak = {}, 0
    for p, n in enumerate(order):
        t = n.checked_type
        if base[n] is n and isinstance(n, pb.Call) and isinstance(t, pb.TensorType):
            live[n] = int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
        peak = max(peak, sum(live.values()))
        for a in [k for k in live if last.get(k, p) <= p]:
            live.pop(a)
    return peak


# (in the residual model's main_grad, the forward's values alive at the backward's start make the peak)
@pytest.mark.parametrize("fn, model", [("main_grad", "mlp"), ("main_bwd", "mlp"), ("main_bwd", "residual")])
def test_weight_gradients_run_as_soon_as_their_activation_gradient(fn, model):
    make = MODELS[model]
    mod = make() if fn == "main_grad" else PartitionForwardBackward("main_grad")(make("vjp"))
    body = mod[fn].body
    body.checked_type  # noqa: B018 - types cached, as a built module's are
    before = post_order(body)
    after = memory_order(before, body)
    assert sorted(map(id, after)) == sorted(map(id, before))
    seen = set()
    for n in after:  # operands first
        assert all(a in seen for a in operands(n)), n
        seen.add(n)
    # the post-order keeps every activation gradient alive until the weight gradients at the end
    assert _peak_bytes(after, body) < 0.75 * _peak_bytes(before, body)


def test_a_chain_keeps_its_order():
    x = var("x", shape=(4, 4))
    f = Function([x], op.exp(op.tanh(op.negative(x))))
    f.body.checked_type  # noqa: B018
    order = post_order(f.body)
    assert memory_order(order, f.body) is order


def test_a_larger_reader_is_not_hoisted():
    """A reader whose result outweighs the value it lets go (a broadcast) stays where the post-order puts it."""
    x, y = var("x", shape=(8,)), var("y", shape=(8,))
    e = op.exp(x)
    late = op.broadcast_to(op.sin(e), (64, 8))
    body = pb.Tuple([op.sum(op.multiply(op.tanh(y), op.cos(e))), late])
    body.checked_type  # noqa: B018
    order = post_order(body)
    new = memory_order(order, body)
    assert new.index(late) == order.index(late) or new.index(late) > new.index(body.fields[0])


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
def test_gradients_are_those_of_autograd(target):
    torch = pytest.importorskip("torch")
    pytest.importorskip(target)
    mod = _mlp_grad()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, WIDTH))
    ws = [rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH) for _ in range(LAYERS)]
    got_loss, got = pb.build(mod, target=target)["main_grad"](*(a.astype("float32") for a in (x, *ws)))
    tx, tws = torch.tensor(x, requires_grad=True), [torch.tensor(w, requires_grad=True) for w in ws]
    h = tx
    for w in tws:
        h = torch.tanh(h @ w.T)
    loss = (h * h).sum()
    loss.backward()
    np.testing.assert_allclose(float(np.asarray(got_loss)), loss.item(), rtol=1e-5)
    for g, t in zip(got, [tx, *tws]):
        np.testing.assert_allclose(np.asarray(g, dtype="float64"), t.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_the_built_backward_frees_each_activation_gradient_before_the_next_layers(target):
    """Through ``build``: each layer's activation gradient is freed (its weight gradient run) before the next
    layer's activation gradient is computed, not at the end of the backward."""
    pytest.importorskip(target)
    mod = PartitionForwardBackward("main_grad")(_mlp_grad("vjp"))
    plan = pb.build(mod, target=target)["main_bwd"].plan
    plan.ensure()
    code = [ins for ins in plan.code if ins is not None and isinstance(ins[-1], pb.Call)]
    made = [(p, ins[-3]) for p, ins in enumerate(code) if ins[-1].op.name == "tanh_grad"]
    assert len(made) == LAYERS
    for (p, slot), (q, _) in zip(made, made[1:] + [(len(code), None)]):
        freed = next(k for k in range(p, len(code)) if slot in code[k][-2])
        assert freed < q, (p, slot, freed, q)


def test_a_value_made_of_constants_alone_runs_just_before_its_reader():
    """An embedding's gradient, ``index_add(zeros, ids, g)``, is a backward's first result, so the post-order makes
    its ``zeros`` (a vocabulary's worth of memory) before the whole chain that computes ``g``, holding it to the
    end; it runs just before the ``index_add`` instead (as eager makes it in the embedding's backward, last)."""
    vocab, rows = 512, 16
    ids, x = var("ids", shape=(rows,), dtype="int64"), var("x", shape=(rows, WIDTH), dtype="float64")
    ws = [var(f"w{i}", shape=(WIDTH, WIDTH), dtype="float64") for i in range(LAYERS)]
    g = x
    for w in ws:
        g = op.tanh(op.nn.dense(g, w))
    table = op.zeros((vocab, WIDTH), "float64")
    grad = op.index_add(table, ids, g, axis=0)
    body = pb.Tuple([grad, op.sum(g)])
    body.checked_type  # noqa: B018
    before = post_order(body)
    assert before.index(table) < before.index(ws[0])  # the post-order's first computed value
    after = memory_order(before, body)
    assert sorted(map(id, after)) == sorted(map(id, before))
    assert after.index(table) == after.index(grad) - 1
    assert all(after.index(n) < after.index(table) for n in after if isinstance(n, pb.Call) and n.op.name == "nn.dense")
    f = Function([ids, x, *ws], body)
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, vocab, rows), *(rng.standard_normal(s) for s in [(rows, WIDTH)] + [(WIDTH, WIDTH)] * LAYERS)]
    for target in ("numpy", "torch"):
        pytest.importorskip(target)
        table_grad, total = pb.build(IRModule.from_expr(f), target=target)["main"](*inputs)
        want = np.zeros((vocab, WIDTH))
        h = inputs[1]
        for w in inputs[2:]:
            h = np.tanh(h @ w.T)
        np.add.at(want, inputs[0], h)
        np.testing.assert_allclose(np.asarray(table_grad), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(float(np.asarray(total)), h.sum(), rtol=1e-12)
