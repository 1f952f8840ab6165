"""Training PyTorch models through pullback: compile(), the torch.compile backend, the examples."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pullback as pb  # noqa: E402
from pullback import PullbackError  # noqa: E402
from pullback import runtime  # noqa: E402
from pullback.integrations.torch import DEFAULT_TARGET  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name,kw", [("train_mlp", dict(batch=8, width=16)), ("train_cnn", dict(batch=4, size=8))])
def test_examples_match_eager_pytorch(name, kw):
    result = load_example(name).main(steps=10, verbose=False, **kw)  # asserts 1e-4 inside
    assert len(result["pullback"]) == 10
    np.testing.assert_allclose(result["pullback"], result["eager"], rtol=1e-4)
    assert result["max_weight_diff"] <= 1e-4


def test_compiled_module_shares_parameters_and_gradients(target):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    x = torch.randn(3, 4, requires_grad=True)
    cm = pb_compile(model, (x,), target=target)
    assert list(cm.parameters()) == list(model.parameters())
    out = cm(x)
    out.square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    model(x).square().sum().backward()
    for a, b in zip(got, [p.grad for p in model.parameters()] + [x.grad]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_programs_are_specialised_on_which_inputs_require_grad(target):
    """An input that does not require grad (an image batch) gets no gradient computed; the same module
    called with one that does compiles a second program that returns it (AOTAutograd's specialisation)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    x = torch.randn(2, 3, 6, 6)
    cm = pb_compile(model, (x,), target=target)
    cm(x).sum().backward()
    (plain,) = cm._programs.values()
    assert plain.wrt_index == [1, 2, 3, 4]  # the four parameters, not the image
    assert len(plain.mod["main_bwd"].body.fields) == 4
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    xg = x.clone().requires_grad_(True)
    cm(xg).sum().backward()
    assert len(cm._programs) == 2 and xg.grad is not None
    x2 = x.clone().requires_grad_(True)
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x2).sum().backward()
    torch.testing.assert_close(xg.grad, x2.grad, rtol=1e-5, atol=1e-6)
    for a, b, c in zip(want, ref, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-6)


def _bn_net():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def test_frozen_parameters_get_no_gradient_computed(target):
    """Parameters with ``requires_grad`` off (a frozen backbone) are left out of the backward, as eager leaves
    them: no gradient, no update, the others trained like eager; unfreezing them compiles a program that
    differentiates them again (programs are specialised on it, as on the inputs' ``requires_grad``)."""
    torch.manual_seed(0)
    model = _bn_net()
    for p in model[0].parameters():
        p.requires_grad_(False)
    eager = copy.deepcopy(model)
    x, y = torch.randn(4, 3, 6, 6), torch.tensor([0, 1, 2, 1])
    cm = pb_compile(model, (x,), target=target)
    (tp,) = cm._programs.values()
    assert len(tp.mod["main_bwd"].body.fields) == 4  # batch norm's and the linear layer's weights and biases
    opts = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1) for m in (eager, model)]
    for _ in range(3):
        for m, opt in ((eager, opts[0]), (cm, opts[1])):
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        assert (a.grad is None) == (b.grad is None) == name.startswith("0."), name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for p in model[0].parameters():
        p.requires_grad_(True)
    F.cross_entropy(cm(x), y).backward()
    assert len(cm._programs) == 2 and all(p.grad is not None for p in model[0].parameters())


@pytest.mark.parametrize("train", [True, False])
def test_no_grad_calls_run_the_forward_alone(target, train):
    """Under ``torch.no_grad()`` (evaluation) and where nothing requires grad, the call runs ``@main`` alone:
    no differentiation, no residuals, no autograd graph; results and batch norm's running statistics (updated in
    train mode, as eager updates them under no_grad) equal eager's."""
    torch.manual_seed(0)
    model = _bn_net().train(train)
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3, 6, 6)
    cm = pb_compile(model, (x,), target=target)
    with torch.no_grad():
        got, want = cm(x), eager(x)
    assert got.grad_fn is None and not got.requires_grad
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    no_grad = [tp for key, tp in cm._programs.items() if key[-1] is False]
    assert len(no_grad) == 1 and no_grad[0].mod is None and no_grad[0].bridge is None  # nothing differentiated
    for a, b in zip(eager.buffers(), model.buffers()):
        torch.testing.assert_close(a, b)
    for p in model.parameters():  # grad mode on, but nothing to differentiate: the forward alone too
        p.requires_grad_(False)
    got = cm(x)
    assert got.grad_fn is None and not got.requires_grad
    torch.testing.assert_close(got, eager(x).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_layer_trains_with_momentum_sgd(norm_first):
    # (not Adam here: the key bias has a mathematically zero gradient, whose float noise Adam scales to full steps)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first)
    ref = copy.deepcopy(layer)
    x, t = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    cm = pb_compile(layer, (x,), policy="min_cut")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref, cm)]
    for _ in range(3):
        losses = []
        for m, opt in zip((ref, cm), opts):
            loss = (m(x) - t).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for a, b in zip(ref.parameters(), layer.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_backward_reads_the_normalisation_statistics_the_forward_computed(target):
    """Layer and batch norms (training) import as ``nn.native_*_norm``: the forward keeps the statistics (as
    eager's autograd saves them) and the backward's gradients read them, none computing them again; the step
    trains like eager."""
    from pullback.ir.traversal import post_order

    def ops(fn):
        return [n.op.name for n in post_order(fn.body) if hasattr(n, "op") and hasattr(n.op, "name")]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LayerNorm(64),
                          nn.Linear(64, 3))
    eager = copy.deepcopy(model)
    x, y = torch.randn(4, 3, 6, 6), torch.tensor([0, 1, 2, 1])
    cm = pb_compile(model, (x,), target=target)
    (tp,) = cm._programs.values()
    fwd, bwd = ops(tp.mod["main_fwd"]), ops(tp.mod["main_bwd"])
    assert fwd.count("nn.native_batch_norm") == fwd.count("nn.native_layer_norm") == 1
    assert bwd.count("nn.native_batch_norm_grad") == bwd.count("nn.native_layer_norm_grad") == 1
    assert not {"nn.batch_norm", "nn.layer_norm", "nn.batch_norm_grad", "nn.layer_norm_grad", "mean", "variance",
                "rsqrt"} & set(fwd + bwd)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for _ in range(3):
        for m, opt in ((eager, opts[0]), (cm, opts[1])):
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
    for (name, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_embedding_cross_entropy_trains_with_adam(target):
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(10, 6), nn.Linear(6, 10)

        def forward(self, idx, tgt):
            return F.cross_entropy(self.out(torch.relu(self.emb(idx))).reshape(-1, 10), tgt.reshape(-1))

    torch.manual_seed(0)
    model = LM()
    ref = copy.deepcopy(model)
    idx, tgt = torch.randint(0, 10, (3, 4)), torch.randint(0, 10, (3, 4))
    cm = pb_compile(model, (idx, tgt), target=target)
    for m in (ref, cm):
        opt = torch.optim.Adam(m.parameters(), lr=0.05)
        for _ in range(3):
            loss = m(idx, tgt)
            opt.zero_grad()
            loss.backward()
            opt.step()
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_eval_mode_recompiles_without_dropout(target):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    cm = pb_compile(model, (x,), target=target)
    cm.eval()
    torch.testing.assert_close(cm(x), model(x))
    assert len(cm._programs) == 2


def test_default_target_is_the_fastest_installed(monkeypatch):
    import importlib.util

    import pullback.integrations.torch as pbt

    assert pbt.default_target() == pbt.DEFAULT_TARGET == "torch"  # the torch extra is installed here
    (tp,) = pb_compile(nn.Linear(2, 1), (torch.ones(1, 2),))._programs.values()
    assert tp.target == "torch"
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "array_api_compat" else find_spec(name, *a))
    assert pbt.default_target() == "numpy"


def test_jax_target():
    if "jax" not in runtime.TARGETS:
        pytest.skip("the jax target is not registered in this build")
    pytest.importorskip("jax")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    x = torch.randn(3, 4)
    cm = pb_compile(model, (x,), target="jax")
    cm(x).sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for a, b in zip(got, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_dynamo_backend_trains_like_eager(target):
    import functools

    import torch._dynamo

    from pullback.integrations.dynamo_backend import pullback_backend

    if "pullback" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(name="pullback")(pullback_backend)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 2))
    ref = copy.deepcopy(model)
    backend = "pullback" if target == DEFAULT_TARGET else functools.partial(pullback_backend, target=target)
    cm = torch.compile(model, backend=backend, dynamic=False)
    x, y = torch.randn(4, 2, 4, 4), torch.tensor([0, 1, 1, 0])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    for _ in range(3):
        losses = []
        for m, opt in zip((ref, cm), opts):
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for a, b in zip(ref.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


def test_no_copies_between_torch_and_the_target(target):
    """Tensors reach the target as their own memory: a residual that is a view of a parameter (the second
    layer's transposed weight) shares the parameter's memory on torch and numpy (jax's residuals are XLA's
    results, its inputs DLPack views: tests/runtime/test_jax_target.py); on the torch target the residuals
    are the forward's tensors, under ``saved_tensors_hooks`` saved with ``save_for_backward`` (the hooks see
    each); the inputs,
    kept for a differentiable backward, are not saved through autograd (an input written in place after the call
    must not stop a first-order backward that never reads it)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    x = torch.randn(3, 4)
    cm = pb_compile(model, (x,), target=target)
    (tp,) = cm._programs.values()
    types = [p.checked_type.shape for p in tp.mod["main_bwd"].params[:-1]]
    k = types.index((6, 2))  # the second layer's weight, transposed
    weight = model[2].weight
    _, residuals = tp.bridge.forward([x, *[dict(model.named_parameters())[key] for key in tp.state_keys]])
    if target == "torch":
        assert residuals[k].data_ptr() == weight.data_ptr()
    elif target == "numpy":
        assert np.shares_memory(residuals[k], weight.detach().numpy())
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = cm(x)
    assert len(packed) == (len(types) if target == "torch" else 0)
    if target == "torch":
        assert packed[k].data_ptr() == weight.data_ptr()
    out.sum().backward()
    ref = copy.deepcopy(model)
    model.zero_grad()
    ref(x).sum().backward()
    cm(x).sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("target", ["torch", "numpy"])
def test_the_backward_frees_each_residual_after_its_last_reader(target):
    """As autograd frees each node's saved tensors once it ran, the backward lets go of each residual after the
    last kernel that reads it: on a deep MLP, the residuals still alive when the backward's plan has run are a few
    (kept to the end, BERT-base's residuals and its weight gradients made the backward's peak 1.6x eager's); with
    ``retain_graph=True`` all stay for a second backward, which gives the same gradients."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(16, 16), nn.Tanh())])
    x = torch.randn(8, 16)
    cm = pb_compile(model, (x,), target=target)
    (tp,) = cm._programs.values()
    state = [*model.parameters(), x]

    def alive(retain):
        """How many of the forward's own residuals are alive at each ATen call of the backward, and when its plan
        has run (its first result handed back)."""
        out = cm(x).sum()
        kept = [r for r in out.grad_fn.next_functions[0][0].residuals if not any(r is t for t in state)]
        refs = [weakref.ref(r) for r in kept]
        del kept
        counts, after = [], []

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counts.append(sum(r() is not None for r in refs))
                return func(*args, **(kwargs or {}))

        def handed_back(value, to_torch=tp.bridge.to_torch):
            after.append(sum(r() is not None for r in refs))
            return to_torch(value)

        tp.bridge.to_torch = handed_back
        model.zero_grad()
        try:
            with Count():
                out.backward(retain_graph=retain)
        finally:
            del tp.bridge.to_torch
        return len(refs), counts, after[0], [p.grad.clone() for p in model.parameters()], out

    n, counts, left, grads, _ = alive(False)
    assert n >= 10 and max(counts) == n and left <= 2, (n, counts, left)
    n, counts, left, again, out = alive(True)
    assert min(counts) == max(counts) == left == n, (n, counts, left)
    model.zero_grad()
    out.backward()
    for a, b, c in zip(grads, again, [p.grad for p in model.parameters()]):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_zero_cotangents_of_written_back_buffers_are_made_once(target):
    """BatchNorm's running statistics and batch count come back from the forward only to be written back:
    their cotangents are zeros the backward never propagates, made once per shape (not every step); the
    steps still match eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 2))
    ref = copy.deepcopy(model)
    x = torch.randn(4, 2, 4, 4)
    cm = pb_compile(model, (x,), target=target)
    (tp,) = cm._programs.values()
    assert len(tp.bridge.inert) == 3  # running_mean, running_var, num_batches_tracked
    made = []
    for m in (cm, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
            if m is cm:
                made.append({k: id(v) for k, v in tp.bridge.inert_zeros.items()})
    assert len(made[0]) == 3 and made[0] == made[1] == made[2]
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class _ReturnsBuffers(nn.Module):
    """A layer with batch norm returning, beside its output, a plain buffer and the batch norm's running mean."""

    def __init__(self):
        super().__init__()
        self.lin, self.bn = nn.Linear(3, 2), nn.BatchNorm1d(2)
        self.register_buffer("buf", torch.ones(2))

    def forward(self, x):
        return self.bn(self.lin(x)), self.buf, self.bn.running_mean


def test_returned_buffers_and_written_back_statistics_are_eagers(target):
    """The autograd node of a call has an input per tensor that requires grad (the parameters; the buffers it
    reads and writes back ride along untracked); a buffer returned as it is, and a running mean returned after
    batch norm updated it, require no grad, as in eager, and the module's buffers stay plain tensors; three
    steps leave the state eager's."""
    torch.manual_seed(0)
    model = _ReturnsBuffers()
    ref = copy.deepcopy(model)
    x = torch.randn(4, 3)
    cm = pb_compile(model, (x,), target=target)
    for m in (cm, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(3):
            out, buf, mean = m(x)
            assert not buf.requires_grad and not mean.requires_grad and out.requires_grad
            torch.testing.assert_close(mean, m.bn.running_mean if m is ref else model.bn.running_mean)
            if m is cm:
                assert len(out.grad_fn.next_functions) == len(list(model.parameters()))
            opt.zero_grad()
            out.square().mean().backward()
            opt.step()
    for name, t in model.named_buffers():
        assert not t.requires_grad and t.grad_fn is None, name
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_onednn_gemms_train_like_eager(onednn_calls):
    """Layers wide enough for the torch target's oneDNN inner product (forward and input-gradient GEMMs; the
    weight gradients stay with MKL) train like eager: losses and weights after 3 SGD steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.LayerNorm(256), nn.Linear(256, 8))
    ref = copy.deepcopy(model)
    x, y = torch.randn(16, 16, 256), torch.randn(16, 16, 8)  # 256 rows: GEMMs of 2^24 multiply-adds
    cm = pb_compile(model, (x,), target="torch")
    losses = {}
    for tag, m in (("eager", ref), ("pullback", cm)):
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        for _ in range(3):
            loss = F.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.setdefault(tag, []).append(loss.item())
    assert onednn_calls  # the wide layers' GEMMs ran on oneDNN
    np.testing.assert_allclose(losses["pullback"], losses["eager"], rtol=1e-5)
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class _KeywordNet(nn.Module):
    """A forward as Hugging Face writes them: tensors by keyword, optional ones defaulting to None, a dict out."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, mask=None, labels=None, scale=1.0, return_dict=True):
        logits = (self.lin(x) if mask is None else self.lin(x) * mask) * scale
        loss = F.cross_entropy(logits, labels)
        return {"logits": logits, "loss": loss} if return_dict else (loss, logits)


def test_keyword_inputs_train_like_eager_in_any_order_with_forwards_structure(target):
    torch.manual_seed(0)
    model = _KeywordNet().double()
    x, labels = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 2, 1, 1, 0])
    eager, compiled = copy.deepcopy(model), pb_compile(model, {"labels": labels, "x": x}, target=target)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled)]
    calls = [dict(x=x, labels=labels), dict(labels=labels, x=x), dict(x=x, labels=labels, mask=None)]
    for kw in calls:  # reordered keywords, or None for a None default: the same program
        outs = []
        for m, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            outs.append(m(**kw))
            outs[-1]["loss"].backward()
            opt.step()
        want, got = outs
        assert isinstance(got, dict) and list(got) == ["logits", "loss"]
        torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got["loss"], want["loss"], rtol=1e-12, atol=0)
    assert len(compiled._imports) == 1 and len(compiled._programs) == 1
    for p, q in zip(compiled.module.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(compiled(x, labels=labels)["loss"], eager(x, labels=labels)["loss"], rtol=1e-12, atol=0)
    assert len(compiled._imports) == 1  # x by position is x by name: the same program
    mask = torch.rand(5, 3, dtype=torch.float64)
    torch.testing.assert_close(compiled(x, mask=mask, labels=labels)["loss"], eager(x, mask=mask, labels=labels)["loss"])
    for kw in (dict(scale=2.0), dict(scale=0.5, return_dict=False)):  # settings: constants of a program each
        got, want = compiled(x=x, labels=labels, **kw), eager(x=x, labels=labels, **kw)
        assert type(got) is type(want)
        torch.testing.assert_close(got[0 if kw.get("return_dict") is False else "loss"],
                                   want[0 if kw.get("return_dict") is False else "loss"], rtol=1e-12, atol=0)
    assert len(compiled._imports) == 4


class _Conditioned(nn.Module):
    """Keyword inputs as diffusion models take them: a dict of tensors (SDXL's ``added_cond_kwargs``), a tuple of
    tensors (a rotary embedding's ``(cos, sin)``), and settings that are lists and dicts of numbers (QwenImage's
    ``img_shapes``, an empty ``cross_attention_kwargs``)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, added=None, rotary=None, shapes=(), extra=None):
        cos, sin = rotary
        y = self.lin(x) * cos + added["text"][0] * sin + added["time"]
        return y.square().mean() * sum(a * b for a, b in shapes) + len(extra or {})


def test_tuples_lists_and_dicts_of_tensors_are_inputs_and_of_numbers_settings(target):
    torch.manual_seed(0)
    model = _Conditioned().double()
    x, t, s, c = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(4))
    kw = dict(added={"text": [t], "time": s}, rotary=(c, c.detach() + 1), shapes=[(1, 2), (3, 4)], extra={})
    eager, compiled = copy.deepcopy(model), pb_compile(model, (x,), example_kwargs=kw, target=target)
    got, want = compiled(x, **kw), eager(x, **kw)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    grads = torch.autograd.grad(got, (x, t, s, c) + tuple(model.parameters()))
    wants = torch.autograd.grad(want, (x, t, s, c) + tuple(eager.parameters()))
    for g, w in zip(grads, wants):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    compiled(x=x, rotary=kw["rotary"], added=kw["added"], shapes=[(1, 2), (3, 4)], extra={})
    assert len(compiled._imports) == 1  # the same structures and settings: the same program
    other = dict(kw, shapes=[(1, 2), (3, 5)])
    torch.testing.assert_close(compiled(x, **other), eager(x, **other), rtol=1e-12, atol=0)
    assert len(compiled._imports) == 2  # a setting of another value: a program of its own
    with pytest.raises(PullbackError, match=r"keyword input 'added\[1\]' is a float \(2.0\); pullback takes tensors"):
        compiled(x, **dict(kw, added={"text": [t], "time": 2.0}))


def test_a_hugging_face_model_called_with_its_batch_returns_its_model_output():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(config).double()
    batch = {"input_ids": torch.randint(1, 64, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long),
             "labels": torch.tensor([0, 2])}
    eager, compiled = copy.deepcopy(model), pb_compile(model, batch)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled)]
    for _ in range(2):
        outs = []
        for m, opt in zip((eager, compiled), opts):
            opt.zero_grad()
            out = m(**batch)
            out.loss.backward()
            opt.step()
            outs.append(out)
        assert type(outs[1]) is type(outs[0])
        torch.testing.assert_close(outs[1].loss, outs[0].loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(outs[1].logits, outs[0].logits, rtol=1e-10, atol=1e-12)
    for p, q in zip(compiled.module.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def _relative(got, want) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def test_a_compiled_module_under_autocast_computes_as_eager_does_there(target):
    """Called inside a ``torch.autocast`` region (bfloat16), a compiled module runs the program exported inside
    one: its linears in bfloat16 as eager's, its outputs bfloat16, its parameters' gradients float32 and as eager's
    to bfloat16's precision (eager rounds the mixed layer norm's parameter gradients to bfloat16; pullback does
    not). Outside the region, the float32 program runs, as before."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    eager = copy.deepcopy(model)
    x, y = torch.randn(4, 8), torch.tensor([0, 2, 1, 1])
    compiled = pb_compile(model, (x,), target=target)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, want = compiled(x), eager(x)
    assert logits.dtype == want.dtype == torch.bfloat16
    if target == "jax":  # XLA fuses the bfloat16 elementwise operators and rounds once
        torch.testing.assert_close(logits, want, rtol=2e-2, atol=2e-2)
    else:
        assert torch.equal(logits, want)
    torch.nn.functional.cross_entropy(logits, y).backward()
    torch.nn.functional.cross_entropy(want, y).backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert p.grad.dtype == torch.float32
        assert _relative(p.grad, q.grad) < (3e-2 if target == "jax" else 1e-2)
    for p in model.parameters():
        p.grad = None
    out = compiled(x)  # outside the region: float32, as eager
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, copy.deepcopy(model)(x), rtol=1e-5, atol=1e-6)
    assert len(compiled._programs) == 2


class MixedResults(torch.nn.Module):
    """A forward whose results mix tensors with a number, a string and None."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        y = self.lin(x)
        return {"loss": y.pow(2).mean(), "logits": y, "count": x.shape[0], "name": "mixed", "extra": None}, 2.5


def test_results_that_are_not_tensors_come_back_as_forward_returned_them(target):
    torch.manual_seed(0)
    model = MixedResults()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 3)
    got, scale = pb_compile(model, (x,), target=target)(x)
    want, want_scale = eager(x)
    assert scale == want_scale == 2.5 and type(scale) is float
    assert got.keys() == want.keys() and (got["count"], got["name"], got["extra"]) == (4, "mixed", None)
    torch.testing.assert_close(got["logits"], want["logits"])
    got["loss"].backward()
    want["loss"].backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_forward_without_a_tensor_result_is_a_clear_error():
    class Count(torch.nn.Module):
        def forward(self, x):
            return x.shape[0]

    with pytest.raises(PullbackError, match=r"forward returns no tensor \(only \[4\]\)"):
        pb_compile(Count(), (torch.ones(4, 2),))


def test_compiling_does_not_copy_the_weights():
    """The compiled module passes the live parameters to its programs: its import keeps read-only views of them
    (a copy took 0.7 s and 440 MB for BERT-base); ``from_torch`` still gives copies."""
    from pullback.frontend import import_torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    compiled = pb_compile(model, (x,))
    (tp,) = compiled._programs.values()
    views = list(tp.prog.params.values())
    weights = [p.detach().numpy() for p in model.parameters()]
    assert len(views) == len(weights) and all(np.shares_memory(v, w) and not v.flags.writeable
                                              for v, w in zip(views, weights))
    copies = list(import_torch(model, (x,)).params.values())
    assert not any(np.shares_memory(c, w) for c, w in zip(copies, weights))


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_a_module_converted_to_another_dtype_after_the_first_call_exports_again(target):
    """``model.double()`` (or ``.half()``) after compiling converts the same parameter objects in place: with
    inputs of the same dtype as before (token ids), the compiled module exports for the new dtype (it raised a
    parameter-type error), and back again."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Tanh(), nn.Linear(4, 2))
    eager = copy.deepcopy(model)
    x = torch.randint(0, 10, (5, 3))
    cm = pb_compile(model, (x,), target=target)
    for dtype in (torch.float32, torch.float64, torch.float32):
        model.to(dtype)
        eager.to(dtype)
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        out = cm(x)
        out.pow(2).sum().backward()
        eager(x).pow(2).sum().backward()
        assert out.dtype == dtype
        for a, b in zip(model.parameters(), eager.parameters()):
            assert a.grad.dtype == dtype
            torch.testing.assert_close(a.grad, b.grad)
    assert len(cm._imports) == 2


@pytest.mark.parametrize("batch_norm", [False, True])
def test_retain_graph_backwards_twice_like_eager_and_frees_the_residuals_otherwise(target, batch_norm):
    """Two losses backward through one forward (``retain_graph=True``, as in GAN training) accumulate what eager
    accumulates, on every target (batch norm: a call that writes buffers back, whose inputs are not kept); without
    it, a second backward is an error naming ``retain_graph``, and the residuals the target holds (NumPy or jax
    arrays) are freed by the first backward, as autograd frees saved tensors."""
    torch.manual_seed(0)
    layers = [nn.Linear(3, 4)] + ([nn.BatchNorm1d(4)] if batch_norm else []) + [nn.Tanh(), nn.Linear(4, 2)]
    model = nn.Sequential(*layers)
    ref = copy.deepcopy(model)
    x = torch.randn(5, 3)
    cm = pb_compile(model, (x,), target=target)
    for m in (cm, ref):
        out = m(x)
        out[:, 0].sum().backward(retain_graph=True)
        out[:, 1].pow(2).sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    out = cm(x)
    out.sum().backward()
    if target != "torch":
        assert out.grad_fn.residuals is None
    with pytest.raises((RuntimeError, PullbackError), match="second time.*retain_graph=True"):
        out.sum().backward()


def test_a_layer_replaced_by_one_of_another_shape_exports_again(target):
    """Fine-tuning swaps a classifier head after compiling: the parameters no longer have the exported shapes,
    so the module is exported again (not an error about the program's parameter types); the old head's program
    stays for the old shapes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    cm = pb_compile(model, (x,), target=target)
    cm(x).sum().backward()
    model[2] = nn.Linear(4, 7)
    model.zero_grad(set_to_none=True)
    ref = copy.deepcopy(model)
    out = cm(x)
    assert out.shape == (5, 7)
    out.pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert len(cm._imports) == 2


def test_a_deep_copy_shares_the_programs_and_trains_its_own_weights(target):
    """``copy.deepcopy`` of a compiled module (an EMA of the weights, a second model) copies the weights and shares
    the compiled programs (no second export); each trains its own parameters. ``torch.save`` of the whole
    module pickles the module and options, and the loaded one exports at its first call."""
    import io

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(5, 3)
    cm = pb_compile(model, (x,), target=target)
    twin = copy.deepcopy(cm)
    assert twin.module is not model and twin._imports == cm._imports and twin.target == target
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(2)
    twin(x).sum().backward()
    assert all(p.grad is None for p in model.parameters())
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.mul_(2)
    ref(x).sum().backward()
    for a, b in zip(twin.module.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert len(twin._imports) == 1  # no second export
    buf = io.BytesIO()
    torch.save(cm, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded._imports == {} and loaded.target == target
    torch.testing.assert_close(loaded(x), model(x))


def test_torch_func_transforms_are_refused_with_what_to_use_instead():
    model = nn.Linear(3, 2)
    cm = pb_compile(model, (torch.randn(4, 3),))
    with pytest.raises(PullbackError, match="torch.func transform.*torch.autograd.grad"):
        torch.func.vmap(cm)(torch.randn(5, 4, 3))


def test_exporting_for_many_shapes_warns_once_with_what_to_do(recwarn):
    """Without dynamic sizes (``dynamic=False``) each new input shape exports the module again (seconds each): the
    fourth shape warns, once, naming the shapes and ``dynamic_batch=True``; a module compiled with it exports once
    for every batch size, and by default (automatic dynamic sizes) the second shape's export serves every later
    batch size."""
    model = nn.Linear(3, 2)
    cm = pb_compile(model, (torch.randn(2, 3),), dynamic=False)
    for b in (3, 4, 5, 6, 7):
        cm(torch.randn(b, 3))
    (w,) = [w for w in recwarn if "exported" in str(w.message)]
    assert "4th time" in str(w.message) and "(5, 3)" in str(w.message) and "dynamic_batch=True" in str(w.message)
    assert "dynamic=False" in str(w.message)
    assert w.filename == __file__
    for options, exports in ((dict(dynamic_batch=True), 1), ({}, 2)):
        dyn = pb_compile(model, (torch.randn(2, 3),), **options)
        for b in (3, 4, 5, 6, 7):
            assert dyn(torch.randn(b, 3)).shape == (b, 2)
        assert len(dyn._imports) == exports


def test_results_may_be_written_in_place_after_the_call(target):
    """The call's results are tensors of their own (a reshape's view on the torch target included): code after
    the call may write into them in place, as after eager's, and the gradients follow the write."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 12), nn.Unflatten(1, (3, 4))).double()
    ref = copy.deepcopy(model)
    x = torch.randn(5, 4, dtype=torch.float64)
    cm = pb_compile(model, (x,), target=target)
    for m in (ref, cm):
        h = m(x)
        h[:, 0] = 0.0
        h.square().sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


class _ShiftTanh(nn.Module):
    """``tanh(x + w)``: eager's backward reads the output only, never ``x``."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, 3, dtype=torch.float64))

    def forward(self, x):
        return torch.tanh(x + self.w)


def test_an_input_written_in_place_after_the_call_trains_like_eager_when_the_backward_does_not_read_it(target):
    """The call keeps its inputs for a possible differentiable gradient (create_graph=True) without autograd's
    version check: writing into an input after the call leaves the first-order backward as eager leaves it."""
    model = _ShiftTanh()
    ref = copy.deepcopy(model)
    x0 = torch.randn(4, 3, dtype=torch.float64)
    cm = pb_compile(model, (x0,), target=target)
    for m in (ref, cm):
        x = x0.clone()
        y = m(x)
        x.mul_(2.0)
        y.square().sum().backward()
    torch.testing.assert_close(model.w.grad, ref.w.grad, rtol=1e-12, atol=1e-14)
    # a differentiable gradient does recompute from the inputs: refused with what changed, never from new values
    x = x0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(cm(x).sum(), x, create_graph=True)  # unchanged inputs: fine
    y = cm(x)
    with torch.no_grad():
        x.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"input 0 .*create_graph=True.* modified by an inplace operation"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


@pytest.mark.parametrize("batch_norm", [False, True], ids=["linear", "linear-bn"])
def test_an_input_the_backward_reads_written_in_place_after_the_call_never_gives_a_wrong_gradient(target, batch_norm):
    """Eager refuses (the linear layer saved ``x``). The numpy target's residuals are views of the caller's
    tensors: they are refused alike (a forward writing buffers back, batch norm's, gave the gradient of the new
    values); a target whose residuals are copies (jax) gives the gradient at the call's values."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), *([nn.BatchNorm1d(2)] if batch_norm else [])).double()
    x0 = torch.randn(4, 3, dtype=torch.float64)
    cm = pb_compile(model, (x0,), target=target)
    state = copy.deepcopy(model.state_dict())
    cm(x0).square().sum().backward()
    want = model[0].weight.grad.clone()
    model.load_state_dict(state)
    model.zero_grad(set_to_none=True)
    x = x0.clone()
    y = cm(x)
    x.mul_(2.0)
    try:
        y.square().sum().backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
    else:
        assert target == "jax", f"the {target} target took a gradient from values written after the call"
        torch.testing.assert_close(model[0].weight.grad, want, rtol=1e-12, atol=1e-14)
    ref = copy.deepcopy(model)
    y = ref(x)
    x.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.square().sum().backward()


def _one_step_alike(ref, compiled, opts, x, loss_of, seed=None) -> None:
    """One SGD step of ``ref`` (eager) and ``compiled`` on ``x`` (the same dropout masks with ``seed``): the same
    loss (float64)."""
    losses = []
    for m, opt in zip((ref, compiled), opts):
        if seed is not None:
            torch.manual_seed(seed)
        opt.zero_grad()
        loss = loss_of(m(x))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-12)


def test_a_submodule_switched_to_eval_mode_after_the_first_call_trains_like_eager(target):
    """Freezing batch norm mid-training (``model.bn.eval()`` while the model trains) changes what the forward
    computes: the compiled module follows (the submodules' modes are part of what it was exported for)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2)).double()
    ref = copy.deepcopy(model)
    cm = pb_compile(model, (torch.ones(5, 3, dtype=torch.float64),), target=target)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    for step in range(4):
        if step == 2:
            ref[1].eval()
            model[1].eval()
        _one_step_alike(ref, cm, opts, torch.randn(5, 3, dtype=torch.float64), lambda y: y.square().mean())
    for a, b in zip(ref.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert len(cm._imports) == 2


def test_hooks_and_layers_changed_after_the_first_call_are_followed(target):
    """A forward hook added after the first call runs (and stops running once removed, without a new export);
    a backward hook added then is refused as at the first call; a layer replaced by one of another kind runs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    cm = pb_compile(model, (x,), target=target)
    torch.testing.assert_close(cm(x), model(x))
    handle = model[1].register_forward_hook(lambda mod, args, out: out * 2.0)
    want = model(x)
    assert not torch.allclose(want, cm.module[2](torch.tanh(cm.module[0](x))))
    torch.testing.assert_close(cm(x), want)
    handle.remove()
    torch.testing.assert_close(cm(x), model(x))
    assert len(cm._imports) == 2
    handle = model[2].register_full_backward_hook(lambda mod, gin, gout: None)
    with pytest.raises(PullbackError, match="backward hooks"):
        cm(x)
    handle.remove()
    model[1] = nn.ReLU()
    with pytest.warns(UserWarning, match="changed since its last call for the 4th time"):  # the 4th structure
        torch.testing.assert_close(cm(x), model(x))
    cm(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad)


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(3, 4)
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(4, 1)

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        return self.a(h), self.b(h)


def test_parameters_that_reach_only_unused_outputs_get_no_gradient_like_eager(target):
    """A head whose output the loss does not use (a pooler) keeps ``.grad`` None, as in eager, rather than a zero
    gradient: AdamW then neither decays its weights nor moves its moments. Which outputs the loss uses may change
    from step to step."""
    torch.manual_seed(0)
    model = _TwoHeads().double()
    ref = copy.deepcopy(model)
    cm = pb_compile(model, (torch.ones(5, 3, dtype=torch.float64),), target=target)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1, weight_decay=0.5) for m in (ref, model)]
    for uses in ("a", "a", "ab", "b"):
        x = torch.randn(5, 3, dtype=torch.float64)
        for m, opt in zip((ref, cm), opts):
            opt.zero_grad(set_to_none=True)
            a, b = m(x)
            loss = (a.square().sum() if "a" in uses else 0.0) + (b.sum() if "b" in uses else 0.0)
            loss.backward()
            opt.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None), (uses, name)
            assert (p.grad is None) == (name[0] not in uses and name[0] != "t"), (uses, name)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14)


class _Tempered(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.drop = nn.Dropout(0.3)
        self.temperature = 1.0

    def forward(self, x):
        return torch.softmax(self.drop(self.lin(x)) / self.temperature, dim=-1)


def test_module_attributes_changed_after_the_first_call_are_followed(target, recwarn):
    """A dropout rate or a temperature kept as a module attribute is a constant of the exported program: when the
    training loop changes it, the module is exported for the new value (as eager reads it); the fourth structure
    warns, naming what changed."""
    torch.manual_seed(0)
    model = _Tempered().double()
    ref = copy.deepcopy(model)
    cm = pb_compile(model, (torch.ones(5, 3, dtype=torch.float64),), target=target)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    for step, (p, temperature) in enumerate([(0.3, 1.0), (0.1, 1.0), (0.1, 2.5), (0.0, 2.5), (0.3, 1.0)]):
        for m in (ref, model):
            m.drop.p, m.temperature = p, temperature
        _one_step_alike(ref, cm, opts, torch.randn(5, 3, dtype=torch.float64), lambda y: y[:, 0].square().sum(), seed=step)
    assert len(cm._imports) == 4  # the last step's values were seen before: no export
    (w,) = [w for w in recwarn if "has changed since its last call" in str(w.message)]
    assert "submodule 'drop': p changed from 0.1 to 0.0" in str(w.message) and "4th time" in str(w.message)


def test_a_deep_copy_shares_only_the_programs_of_the_structure_it_copies(target):
    """The programs of a compiled module are kept per structure (a frozen batch norm's, an unfrozen one's): a deep
    copy shares those of the structure it copies, and runs the copied module as it is."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2)).double()
    x = torch.randn(5, 3, dtype=torch.float64)
    cm = pb_compile(model, (x,), target=target)
    cm(x)
    model[1].eval()  # frozen batch norm: the second structure
    cm(x)
    assert len(cm._imports) == 2
    twin = copy.deepcopy(cm)
    ref = copy.deepcopy(model)
    torch.testing.assert_close(twin(x), ref(x))
    torch.testing.assert_close(twin.module[1].running_mean, ref[1].running_mean)
    assert len(twin._imports) == 1  # no export: the programs of the structure it copied
    model[1].train()  # changed after the last call: the copy shares nothing it could mistake
    assert copy.deepcopy(cm)._imports == {}


class _SkipAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x, skip):
        return torch.tanh(self.lin(x)) + skip


def test_a_differentiable_gradient_refuses_only_the_written_inputs_it_reads(target):
    """A gradient penalty after writing into an input the gradient program never reads (a residual ``skip``
    added at the end) gives eager's second-order gradients; writing into one it reads (``x``) is refused."""
    torch.manual_seed(0)
    model = _SkipAdd().double()
    ref = copy.deepcopy(model)
    x, skip = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    cm = pb_compile(model, (x, skip), target=target)
    for m in (ref, cm):
        s = skip.clone()
        y = m(x, s)
        s.mul_(2.0)
        gs = torch.autograd.grad(y.square().sum(), list(m.parameters()), create_graph=True)
        sum(g.square().sum() for g in gs).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-14)
    xs = x.clone()
    y = cm(xs, skip)
    xs.mul_(2.0)
    # the torch target's residuals (autograd's saved tensors) refuse first; else the inputs' versions
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y.sum(), list(model.parameters()), create_graph=True)


def _sgd_like_eager(eager, model, compiled, inputs, steps=3, **tol):
    """``steps`` SGD steps of ``eager`` and of ``model`` through ``compiled``, side by side: the same losses, and
    the same weights after."""
    opts = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5) for m in (eager, model)]
    for _ in range(steps):
        losses = []
        for m, opt in zip((eager, compiled), opts):
            loss = m(*inputs)
            opt.zero_grad()
            loss.backward()
            losses.append(loss.detach())
            opt.step()
        torch.testing.assert_close(losses[1], losses[0], **tol)
    for a, b in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(b, a, **tol)


class _Interleaved(nn.Module):
    """GPT-OSS's gated MLP (gate and up interleaved in one projection: ``gu[..., ::2]``, ``gu[..., 1::2]``) and an
    interleaved rotary embedding (GPT-J's, Cohere's: ``stack([-x2, x1], -1).flatten(-2)``)."""

    def __init__(self):
        super().__init__()
        self.gate_up, self.down = nn.Linear(8, 12), nn.Linear(6, 8)

    def forward(self, x, cos, sin):
        gu = self.gate_up(x)
        gate, up = gu[..., ::2].clamp(max=0.7), gu[..., 1::2].clamp(-0.7, 0.7)
        h = self.down((up + 1) * gate * torch.sigmoid(gate * 1.702))
        x1, x2 = h[..., ::2], h[..., 1::2]
        rotated = torch.stack([-x2, x1], dim=-1).flatten(-2)
        return (h * cos + rotated * sin).square().mean()


def test_gradients_of_even_and_odd_halves_are_interleaved_like_eager(target):
    """The backward interleaves the gradients of ``x[..., ::2]`` and ``x[..., 1::2]`` (no zeros, strided writes
    and sums): three SGD steps give eager's losses and weights."""
    torch.manual_seed(0)
    model = _Interleaved()
    eager = copy.deepcopy(model)
    x, cos, sin = torch.randn(3, 5, 8), torch.randn(5, 8), torch.randn(5, 8)
    cm = pb_compile(model, (x, cos, sin), target=target)
    _sgd_like_eager(eager, model, cm, (x, cos, sin), rtol=1e-6, atol=1e-7)
    (tp,) = cm._programs.values()
    backward = pb.astext(tp.mod["main_bwd"])
    assert backward.count("stack(") == 2 and "strided_set" not in backward


class _LearntBias(nn.Module):
    """Attention with a learnt relative position bias (T5's, Inkling's) plus a padding mask, through sdpa."""

    def __init__(self, learnt: bool = True):
        super().__init__()
        self.qkv, self.rel = nn.Linear(8, 24), nn.Parameter(torch.randn(2, 9) * 0.3)
        self.rel.requires_grad_(learnt)

    def forward(self, x, pad):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
        distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).clamp(-4, 4) + 4
        bias = self.rel[:, distance][None] + (1.0 - pad[:, None, None, :].float()) * torch.finfo(torch.float32).min
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).square().mean()


@pytest.mark.parametrize("learnt", [True, False])
def test_attention_with_a_learnt_bias_computes_its_probabilities_once_like_eager(target, learnt):
    """A mask that depends on a parameter requiring grad: the bias's gradient needs the probabilities, so the
    forward computes them once, as eager's math kernel does (not flash attention plus the same scores and
    probabilities again for the backward); a mask without a gradient stays one ``nn.attention``. Three SGD steps
    give eager's losses and weights."""
    torch.manual_seed(0)
    model = _LearntBias(learnt)
    eager = copy.deepcopy(model)
    x, pad = torch.randn(2, 6, 8), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    cm = pb_compile(model, (x, pad), target=target)
    _sgd_like_eager(eager, model, cm, (x, pad), rtol=1e-5, atol=1e-6)
    (tp,) = cm._programs.values()
    forward = pb.astext(tp.mod["main_fwd"])
    assert ("nn.attention(" in forward) != learnt and forward.count("exp(") <= 1


class _Sinks(nn.Module):
    """GPT-OSS's attention with sinks: a learnt logit per head joins each row's scores, less the row's maximum,
    before the softmax (a hand-written stable softmax)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.sinks = nn.Linear(8, 24), nn.Parameter(torch.randn(2) * 0.5)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 4).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) * 0.5
        logits = torch.cat([scores, self.sinks.reshape(1, 2, 1, 1).expand(b, 2, n, 1)], dim=-1)
        logits = logits - logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(logits, dim=-1)[..., :-1]
        return (probs @ v).square().mean()


def test_attention_with_sinks_and_a_stable_softmax_trains_like_eager(target):
    """``softmax(x - max(x))`` is the softmax of x (RecognizeOps): no gradient through the maximum, eager's losses
    and weights over three SGD steps, the sinks' included."""
    torch.manual_seed(0)
    model = _Sinks()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 5, 8)
    cm = pb_compile(model, (x,), target=target)
    _sgd_like_eager(eager, model, cm, (x,), rtol=1e-5, atol=1e-6)
    (tp,) = cm._programs.values()
    assert " max(" not in pb.astext(tp.mod["main_fwd"])
