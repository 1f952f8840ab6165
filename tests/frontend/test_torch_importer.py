"""from_torch: import + forward equality and gradient equality against PyTorch for every covered model."""

from __future__ import annotations

import copy
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pullback  # noqa: E402
from pullback import transform  # noqa: E402
from pullback.frontend import UnsupportedOperatorError, from_torch, import_torch, main_inputs  # noqa: E402


class FunctionalMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(8, 5) * 0.3), nn.Parameter(torch.randn(8) * 0.1)
        self.w2 = nn.Parameter(torch.randn(3, 8) * 0.3)

    def forward(self, x):
        h = F.gelu(F.linear(x, self.w1, self.b1))
        h = F.dropout(torch.tanh(h) + F.relu(h), 0.2, self.training)
        return F.linear(h, self.w2).sigmoid()


class EmbeddingLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.out = nn.Linear(6, 11)

    def forward(self, idx, target):
        return F.cross_entropy(self.out(self.emb(idx)).reshape(-1, 11), target.reshape(-1))


def _mlp():
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.Tanh(),
                         nn.Dropout(0.25), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 3)), (torch.randn(4, 5),)


def _cnn():
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 4, 3, padding=1, groups=2), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 2)), (torch.randn(2, 3, 12, 12),)


def _tel(norm_first):
    return (nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True, norm_first=norm_first,
                                       activation="gelu" if norm_first else "relu"), (torch.randn(2, 5, 8),))


def _emb():
    return EmbeddingLoss(), (torch.randint(0, 11, (3, 4)), torch.randint(0, 11, (3, 4)))


MODELS = {
    "mlp": _mlp,
    "functional_mlp": lambda: (FunctionalMLP(), (torch.randn(4, 5),)),
    "cnn": _cnn,
    "transformer_post_norm": lambda: _tel(False),
    "transformer_pre_norm": lambda: _tel(True),
    "embedding_cross_entropy": _emb,
}


def make(name, dtype=torch.float32):
    torch.manual_seed(0)
    model, args = MODELS[name]()
    model = model.to(dtype)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    return model, args


def run_main(prog, args, masks=()):
    return pullback.build(prog.mod)["main"](*main_inputs(prog, args, list(masks)))


def first(out, prog):
    return out if prog.single_output else out[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_eval_matches_torch(name):
    model, args = make(name)
    model.eval()
    prog = import_torch(model, args)
    assert not prog.masks  # dropout vanishes in eval mode
    ref = model(*args).detach().numpy()
    np.testing.assert_allclose(first(run_main(prog, args), prog), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mlp", "functional_mlp", "transformer_post_norm", "transformer_pre_norm"])
def test_train_mode_dropout_masks_are_parameters(name):
    """Masks filled with keep = 1 - rate make training-mode dropout the identity: the eval output."""
    model, args = make(name)
    model.train()
    prog = import_torch(model, args)
    assert prog.masks and [m.name for m in prog.masks] == [f"dropout_mask_{i}" for i in range(len(prog.masks))]
    assert [p.name_hint for p in prog.main.params[-len(prog.masks):]] == [m.name for m in prog.masks]
    masks = [np.full(m.shape, 1.0 - m.rate, m.dtype) for m in prog.masks]
    ref = model.eval()(*args).detach().numpy()
    np.testing.assert_allclose(first(run_main(prog, args, masks), prog), ref, rtol=1e-5, atol=1e-5)


def test_dropout_matches_torch_exactly_with_the_same_masks():
    model, args = make("mlp")
    model.train()
    prog = import_torch(model, args)
    torch.manual_seed(7)
    ref = model(*args).detach().numpy()
    torch.manual_seed(7)  # PyTorch's CPU dropout draws empty_like(x).bernoulli_(1 - p)
    masks = [torch.empty(m.shape).bernoulli_(1 - m.rate).numpy() for m in prog.masks]
    np.testing.assert_allclose(run_main(prog, args, masks), ref, rtol=1e-6, atol=1e-6)


def test_batch_norm_training_returns_running_stats():
    model, args = make("cnn")
    model.train()
    prog = import_torch(model, args)
    assert prog.mutations == [("buffer", "1.running_mean"), ("buffer", "1.running_var"), ("buffer", "1.num_batches_tracked")]
    ref_model = copy.deepcopy(model)
    ref = ref_model(*args).detach().numpy()
    out = run_main(prog, args)
    np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[1], ref_model[1].running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[2], ref_model[1].running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert out[3] == 1 and out[3].dtype == np.int64


def test_names_follow_state_dict_and_constants():
    model, args = make("cnn")
    model.eval()
    mod, params = from_torch(model, args)
    prog = import_torch(model, args)
    assert list(params) == ["v0_weight", "v0_bias", "v1_weight", "v1_bias", "v4_weight", "v4_bias", "v8_weight", "v8_bias",
                            "v1_running_mean", "v1_running_var", "v1_num_batches_tracked"]
    assert prog.state_names["v1_running_mean"] == ("1.running_mean",) and prog.state_key("v1_running_mean") == "1.running_mean"
    assert [p.name_hint for p in mod["main"].params] == ["input"] + list(params)
    np.testing.assert_array_equal(params["v0_weight"], model[0].weight.detach().numpy())
    cmod, cparams = from_torch(model, args, params_as="constants")
    assert cparams == {} and len(cmod["main"].params) == 1
    out = pullback.build(cmod)["main"](args[0].numpy())
    np.testing.assert_allclose(out, model(*args).detach().numpy(), rtol=1e-5, atol=1e-5)
    text = pullback.astext(mod)
    assert pullback.structural_equal(pullback.parse(text), mod)


def test_bad_params_as():
    model, args = make("mlp")
    with pytest.raises(pullback.PullbackError, match="params_as"):
        from_torch(model, args, params_as="weights")


class Unsupported(nn.Module):
    def forward(self, x):
        a = torch.special.airy_ai(x)
        b = torch.special.bessel_j0(
            x)[:, 0]
        c = torch.special.airy_ai(x + 1)
        return a + b[:, None] + c


def test_unsupported_ops_listed_once_with_count_and_whole_source_lines():
    with pytest.raises(UnsupportedOperatorError) as info:
        from_torch(Unsupported(), (torch.randn(3, 4),))
    err = info.value
    assert isinstance(err, pullback.PullbackError)
    assert len(err.diagnostics) == 2  # one per missing operator, nothing blamed on the lines that use their results
    airy, bessel = err.diagnostics
    assert airy.startswith("aten.special_airy_ai.default (2 uses)") and bessel.startswith("aten.special_bessel_j0.default (1 use)")
    assert all("test_torch_importer.py:" in d for d in err.diagnostics)
    assert "a = torch.special.airy_ai(x)" in airy and "c = torch.special.airy_ai(x + 1)" in airy
    assert "b = torch.special.bessel_j0( x)[:, 0]" in bessel  # the whole statement, not cut mid-call
    assert "2 operators (3 nodes) not supported" in str(err)


def _grads_torch(model, args, ct, wrt_inputs):
    inputs = [a.clone().requires_grad_(True) if i in wrt_inputs else a for i, a in enumerate(args)]
    out = model(*inputs)
    (out * torch.as_tensor(ct)).sum().backward()
    return ([inputs[i].grad.numpy() for i in wrt_inputs] + [p.grad.numpy() for p in model.parameters()])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-4), (torch.float64, 1e-9)])
@pytest.mark.parametrize("name", list(MODELS))
def test_gradients_match_torch_autograd(name, dtype, tol):
    model, args = make(name, dtype)
    model.train(name == "cnn")  # batch norm in training mode; dropout models in eval (same masks: see below)
    prog = import_torch(model, args)
    wrt_inputs = [i for i, a in enumerate(args) if a.is_floating_point()]
    wrt = [prog.inputs[i] for i in wrt_inputs] + prog.trainable
    mod = transform.FirstOrderGradient(mode="vjp", wrt=wrt)(prog.mod)
    out = run_main(prog, args)
    o = first(out, prog)
    rng = np.random.default_rng(1)
    ct0 = rng.standard_normal(np.shape(o)).astype(o.dtype)
    ct = ct0 if prog.single_output else (ct0,) + tuple(np.zeros_like(v) for v in out[1:])
    _, grads = pullback.build(mod)["main_grad"](*main_inputs(prog, args), ct)
    ref = _grads_torch(model, args, ct0, wrt_inputs)
    assert len(grads) == len(ref)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol)


def test_gradients_with_dropout_masks_match_torch():
    model, args = make("mlp", torch.float64)
    model.train()
    prog = import_torch(model, args)
    torch.manual_seed(3)
    masks = [torch.empty(m.shape, dtype=torch.float64).bernoulli_(1 - m.rate).numpy() for m in prog.masks]
    mod = transform.FirstOrderGradient(mode="vjp", wrt=[prog.inputs[0]] + prog.trainable)(prog.mod)
    ct = np.random.default_rng(0).standard_normal((4, 3))
    _, grads = pullback.build(mod)["main_grad"](*main_inputs(prog, args, masks), ct)
    torch.manual_seed(3)
    ref = _grads_torch(model, args, ct, [0])
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, rtol=1e-9, atol=1e-9)


def test_import_pullback_does_not_import_torch():
    code = "import sys, pullback, pullback.frontend, pullback.integrations.torch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("shape,kw", [((2, 3, 8, 8), dict(kernel_size=2)),
                                      ((1, 2, 7, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
                                      ((2, 7, 8), dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1)))])
def test_max_pool2d_backward_adds_at_the_given_indices(shape, kw):
    """aten.max_pool2d_with_indices_backward imports as nn.max_pool2d_with_indices_grad of its own indices."""

    class PoolBackward(torch.nn.Module):
        def forward(self, g, x, idx):
            k = kw["kernel_size"]
            return torch.ops.aten.max_pool2d_with_indices_backward(g, x, k, kw.get("stride", k), kw.get("padding", 0),
                                                                    kw.get("dilation", 1), kw.get("ceil_mode", False), idx)

    x = torch.randn(shape)
    y, idx = torch.nn.functional.max_pool2d(x, return_indices=True, **kw)
    g = torch.randn(y.shape)
    prog = import_torch(PoolBackward(), (g, x, idx))
    from pullback.ir.expr import Call
    from pullback.ir.traversal import post_order

    ops = {getattr(n.op, "name", None) for n in post_order(prog.mod["main"].body) if isinstance(n, Call)}
    assert "nn.max_pool2d_with_indices_grad" in ops and "nn.max_pool2d_grad" not in ops
    np.testing.assert_allclose(first(run_main(prog, (g, x, idx)), prog), PoolBackward()(g, x, idx).numpy(), rtol=1e-6, atol=1e-6)


class _IndexPut(torch.nn.Module):
    def __init__(self, accumulate):
        super().__init__()
        self.accumulate = accumulate

    def forward(self, x, mask, values):
        return torch.ops.aten.index_put(x, [mask], values, self.accumulate)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("mask_shape,values_shape", [
    ((4,), (2,)),  # broadcast over each selected row (x[mask] has shape (3, 3, 2))
    ((4,), (3, 2)),
    ((4,), (1, 3, 2)),
    ((4,), (3, 3, 2)),  # one row of values per selected entry
    ((4,), (3, 1, 2)),  # ... broadcast inside the row
    ((4, 3), (1,)),
    ((4, 3), (3, 2)),  # a mask over two dims: one row of values per selected entry
    ((4,), (1, 1, 1)),
])
def test_index_put_with_a_bool_mask_broadcasts_values_like_torch(mask_shape, values_shape, accumulate):
    """``x[mask] = values``: values broadcast to ``x[mask]``'s shape (OpInfo index_put sample 1 gave wrong values)."""
    from pullback.frontend.torch_importer import export, import_exported

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 2, generator=g)
    mask = torch.zeros(mask_shape, dtype=torch.bool).flatten()
    mask[[0, 2, 3]] = True
    mask = mask.reshape(mask_shape)
    values = torch.randn(values_shape, generator=g)
    want = torch.ops.aten.index_put(x, [mask], values, accumulate)
    prog = import_exported(export(_IndexPut(accumulate), (x, mask, values)))
    got = pullback.build(prog.mod)["main"](x.numpy(), mask.numpy(), values.numpy())
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


class _Gather(torch.nn.Module):
    def forward(self, x, index):
        return torch.gather(x, 0, index)


@pytest.mark.parametrize("index_shape", [(2, 0), (0,), (0, 3, 1)])
def test_gather_takes_an_empty_index_of_any_rank_like_torch(index_shape):
    """PyTorch gathers an empty index of another rank (an empty result, no gradient to ``x``); OpInfo's sample."""
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    index = torch.empty(index_shape, dtype=torch.long)
    want = torch.gather(x, 0, index)
    want.sum().backward()
    prog = import_torch(_Gather(), (x.detach(), index))
    mod = transform.FirstOrderGradient(wrt=[prog.inputs[0]])(prog.mod)
    got, (dx,) = pullback.build(mod)["main_grad"](x.detach().numpy(), index.numpy())
    assert got.shape == tuple(want.shape) and got.dtype == np.float64
    np.testing.assert_array_equal(dx, x.grad.numpy())


def test_mutated_buffers_pass_no_gradient_back():
    """BatchNorm's running statistics are state writes (eager updates them under no_grad): the gradient of
    the imported program (mode="grad": the sum of all outputs, running statistics included) is the loss's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Tanh()).double().train()
    x = torch.randn(4, 2, 5, 5, dtype=torch.float64)
    prog = import_torch(copy.deepcopy(model), (x,))
    assert len(prog.mutations) == 3  # running mean, running var, batch count
    mod = transform.FirstOrderGradient(wrt=prog.inputs + prog.trainable)(prog.mod)
    inputs = main_inputs(prog, (x,))
    _, grads = pullback.build(mod)["main_grad"](*inputs)
    xt = x.clone().requires_grad_(True)
    model(xt).sum().backward()
    want = [xt.grad] + [p.grad for p in model.parameters()]
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("conv", [dict(kernel_size=3, padding=1), dict(kernel_size=(3, 5), padding=(1, 4), dilation=(1, 2)),
                                  dict(kernel_size=3, padding=1, stride=2)])
def test_one_tap_convolution_imports_as_a_dense_layer(conv):
    """A convolution of a 1x1 map to a 1x1 map meets one tap: it imports as nn.dense on that tap, with
    torch's values and gradients (input, weight: zero outside the tap, bias) in float64."""
    torch.manual_seed(0)
    model = nn.Conv2d(6, 5, **conv).double()
    x = torch.randn(3, 6, 1, 1, dtype=torch.float64, requires_grad=True)
    prog = import_torch(model, (x.detach(),))
    names = {n.op.name for n in pullback.ir.post_order(prog.main.body) if isinstance(n, pullback.ir.Call)}
    assert "nn.dense" in names and "nn.conv2d" not in names
    mod = transform.FirstOrderGradient(wrt=prog.inputs + prog.trainable)(prog.mod)
    for target in ("numpy", "torch"):
        out, grads = pullback.build(mod, target=target)["main_grad"](*main_inputs(prog, (x.detach(),)))
        y = model(x)
        np.testing.assert_allclose(np.asarray(out), y.detach().numpy(), rtol=1e-12, atol=1e-12)
        want = torch.autograd.grad(y.sum(), [x, model.weight, model.bias])
        assert len(grads) == 3
        for g, w in zip(grads, want):
            np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-12, atol=1e-12)


class NegativeIndexing(nn.Module):
    """Falcon's multi-query split (``qkv[..., [-2], :]``) and a list index counting from both ends."""

    def forward(self, x):
        return x[..., [-2], :] * 2.0 + x[:, [0, -1, -3]].sum(1, keepdim=True)[:, :, :1]


def test_negative_advanced_indices_count_from_the_end_like_torch():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    prog = import_torch(NegativeIndexing(), (x.detach(),))
    mod = transform.FirstOrderGradient(wrt=prog.inputs)(prog.mod)
    y = NegativeIndexing()(x)
    (want,) = torch.autograd.grad(y.sum(), [x])
    for target in ("numpy", "torch"):
        out, (dx,) = pullback.build(mod, target=target)["main_grad"](x.detach().numpy())
        np.testing.assert_allclose(np.asarray(out), y.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(dx), want.numpy(), rtol=1e-12, atol=1e-12)


def test_an_index_out_of_range_is_an_error_not_a_clipped_read():
    class Select(nn.Module):
        def forward(self, x, i):
            return torch.index_select(x, 0, i) + x[i]

    x, i = torch.randn(4, 3), torch.tensor([0, 3])
    prog = import_torch(Select(), (x, i))
    run = pullback.build(prog.mod)["main"]
    np.testing.assert_allclose(run(x.numpy(), i.numpy()), Select()(x, i).numpy(), rtol=1e-6)
    with pytest.raises(pullback.ExecutionError, match="index 4 out of range"):
        run(x.numpy(), np.array([0, 4]))


def test_in_place_dropout_trains_like_eager():
    """``nn.Dropout(inplace=True)`` exports as ``empty_permuted`` + ``bernoulli.p`` (MobileViT's head): the mask is
    a random input drawn as eager draws it, so training matches eager step for step."""
    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.SiLU(), nn.Dropout(0.3, inplace=True), nn.Linear(6, 2)).train()
    batches = [((torch.randn(5, 4),), torch.randn(5, 2)) for _ in range(3)]
    result = train_side_by_side(model, batches, F.mse_loss, target="numpy", verbose=False)
    assert len(set(result["eager"])) == 3  # the masks differ per step: every loss is a new number
    check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)


class Norms(nn.Module):
    def __init__(self, ord, dim, keepdim):
        super().__init__()
        self.ord, self.dim, self.keepdim = ord, dim, keepdim

    def forward(self, x):
        return torch.linalg.vector_norm(x, ord=self.ord, dim=self.dim, keepdim=self.keepdim)


@pytest.mark.parametrize("ord,dim,keepdim", [(2, None, False), (2, (1, 2), True), (1, -1, False), (float("inf"), 1, False),
                                             (float("-inf"), -1, True), (3, 0, False), (0.5, -1, False), (0, -1, False)])
def test_vector_norm_values_and_gradients_match_torch(ord, dim, keepdim):
    """``linalg_vector_norm`` (not core: F.normalize, Swin v2, ConvNeXt v2): values and float64 gradients, an
    all-zero row included (its gradient 0, not NaN)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    if ord != 0.5:  # x ** (p - 1) at 0 is inf for p < 1: torch's gradient is NaN there too
        x[1, 2] = 0.0
    x.requires_grad_(True)
    m = Norms(ord, dim, keepdim)
    prog = import_torch(m, (x.detach(),))
    mod = transform.FirstOrderGradient(wrt=prog.inputs)(prog.mod)
    y = m(x)
    # ord 0 counts nonzeros: torch's backward raises, pullback's gradient is 0
    want = torch.zeros_like(x) if ord == 0 else torch.autograd.grad(y.sum(), [x])[0]
    out, (dx,) = pullback.build(mod)["main_grad"](x.detach().numpy())
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, want.numpy(), rtol=1e-10, atol=1e-12)


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


def _with_zeros(shape, seed):
    torch.manual_seed(seed)
    x = torch.randn(*shape, dtype=torch.float64)
    x[0, 1] = 0.0
    x[-1, ::2] = -0.0  # two zeros in a row (cumprod's gradient is zero before the second), negative zeros
    return x


@pytest.mark.parametrize("name,fn", [
    ("cumprod", lambda x, y: torch.cumprod(x, 1) + torch.cumprod(y, 0)),
    ("vander", lambda x, y: torch.linalg.vander(x[0], N=4)),
    ("hypot", lambda x, y: torch.hypot(x, y)),
    ("copysign", lambda x, y: torch.copysign(x, y) + torch.copysign(y, -1.5)),
    ("signbit", lambda x, y: x * torch.signbit(y)),
    ("dist", lambda x, y: torch.dist(x, y) + torch.dist(x, y, 1) + torch.dist(x, y[0], float("inf"))),
    ("searchsorted", lambda x, y: x * torch.searchsorted(y.sort(1).values, x) + x * torch.bucketize(x, y[0].sort().values, right=True)),
    ("cholesky_inverse", lambda x, y: torch.cholesky_inverse(torch.linalg.cholesky(x @ x.T + 4 * torch.eye(4, dtype=x.dtype)))
     + torch.cholesky_inverse(torch.linalg.cholesky(y @ y.T + torch.eye(4, dtype=x.dtype), upper=True), upper=True)),
    ("tril_indices", lambda x, y: (x @ y)[tuple(torch.tril_indices(4, 4))] + x[tuple(torch.triu_indices(3, 4, 1))].sum()
     + (x[:3] * y[:3])[tuple(torch.tril_indices(3, 4, -1))].sum()),
])
def test_converters_from_the_operator_sweep_match_torch(name, fn):
    """Operators models call that the importer did not convert (found by importing ~130 torch functions):
    values and float64 gradients against autograd, with zeros and negative zeros in the inputs."""
    x, y = _with_zeros((4, 4), 0), _with_zeros((4, 4), 1)
    prog = import_torch(Fn(fn), (x, y))
    xs, ys = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    want = fn(xs, ys)
    ct = torch.randn_like(want)
    gx, gy = torch.autograd.grad(want, [xs, ys], ct, allow_unused=True)
    mod = transform.FirstOrderGradient(wrt=prog.inputs, mode="vjp")(prog.mod)
    out, grads = pullback.build(mod)["main_grad"](x.numpy(), y.numpy(), ct.numpy())
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    for got, w in zip(grads, (gx, gy)):
        np.testing.assert_allclose(got, np.zeros_like(got) if w is None else w.numpy(), rtol=1e-10, atol=1e-12)


def test_median_and_kthvalue_match_torch():
    """Values, indices and float64 gradients (to the selected entry; inputs without ties, where eager's choice
    among equal entries is its own)."""

    def fn(x, y):
        return (torch.median(x, 1).values + torch.median(y, 0, keepdim=True).values.T + torch.median(x)
                + torch.kthvalue(y, 3, 1).values + torch.kthvalue(x, 1, 0, keepdim=True).indices.T)

    torch.manual_seed(2)
    x, y = torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
    prog = import_torch(Fn(fn), (x, y))
    xs, ys = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
    want = fn(xs, ys)
    ct = torch.randn_like(want)
    gx, gy = torch.autograd.grad(want, [xs, ys], ct)
    mod = transform.FirstOrderGradient(wrt=prog.inputs, mode="vjp")(prog.mod)
    out, (dx, dy) = pullback.build(mod)["main_grad"](x.numpy(), y.numpy(), ct.numpy())
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, gx.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dy, gy.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bins,lo,hi", [(4, 0, 3), (7, 0, 0), (5, -1.0, 0.5)])
def test_histc_counts_like_torch(bins, lo, hi):
    """Mixture-of-experts routing counts tokens per expert with histc."""

    class Hist(nn.Module):
        def forward(self, x):
            return torch.histc(x, bins=bins, min=lo, max=hi)

    torch.manual_seed(0)
    for x in (torch.randn(6, 5), torch.randint(0, 4, (9,)).float(), torch.full((3,), 2.0)):
        prog = import_torch(Hist(), (x,))
        np.testing.assert_array_equal(run_main(prog, (x,)), Hist()(x).numpy())


class NoGradBlock(nn.Module):
    """A ``with torch.no_grad():`` block: its parameters get no gradient, the rest trains through its result."""

    def __init__(self):
        super().__init__()
        self.frozen, self.head = nn.Linear(6, 6), nn.Linear(6, 1)

    def forward(self, x):
        with torch.no_grad():
            h = torch.tanh(self.frozen(x))
        with torch.enable_grad():
            y = self.head(h * x)
        return y.pow(2).mean()


def test_no_grad_blocks_pass_no_gradient_like_eager():
    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    model = NoGradBlock().double()
    prog = import_torch(model, (x.detach(),))
    mod = transform.FirstOrderGradient(wrt=prog.inputs + prog.trainable)(prog.mod)
    _, grads = pullback.build(mod)["main_grad"](*main_inputs(prog, (x.detach(),)))
    model(x).backward()
    want = [x.grad] + [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    assert model.frozen.weight.grad is None
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-12)
    batches = [((torch.randn(4, 6),), None) for _ in range(3)]
    result = train_side_by_side(NoGradBlock(), batches, lambda loss, _: loss, target="torch", verbose=False)
    check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)


class Reassigned(nn.Module):
    """Switch Transformers' router re-assigns a layer in ``forward`` (``self.classifier =
    self.classifier.to(dtype)``, its own dtype: the same layer); a view of a parameter made under no_grad."""

    def __init__(self):
        super().__init__()
        self.inp, self.classifier, self.viewed = nn.Linear(6, 6), nn.Linear(6, 4), nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        self.classifier = self.classifier.to(x.dtype)
        with torch.no_grad():
            v = self.viewed.t()
        h = self.inp(x)
        return (self.classifier(h) * (h @ v)).pow(2).mean()


@pytest.mark.parametrize("route", ["export", "dynamo"])
def test_a_layer_reassigned_in_forward_trains_like_eager(route):
    """Through torch.export, ``Module.to`` converting nothing returns the module (``_apply`` failed to swap the
    traced parameters); through Dynamo, the no_grad block it becomes returns the parameter itself, which keeps its
    gradient (it was detached: the router trained with no gradient, silently). The view made under no_grad
    passes none, as in eager."""
    import copy

    from pullback.integrations.dynamo_backend import pullback_backend
    from pullback.integrations.torch import compile as pb_compile

    torch.manual_seed(0)
    model = Reassigned().double()
    eager = copy.deepcopy(model)
    x = torch.randn(5, 6, dtype=torch.float64)
    eager(x).backward()
    torch._dynamo.reset()
    try:
        compiled = pb_compile(model, (x,)) if route == "export" else torch.compile(model, backend=pullback_backend)
        compiled(x).backward()
    finally:
        torch._dynamo.reset()
    assert eager.viewed.grad is None and model.viewed.grad is None
    for (k, p), q in zip(eager.named_parameters(), model.parameters()):
        if k != "viewed":
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-12, atol=1e-14, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("rnn", [lambda: nn.LSTM(4, 6, num_layers=2, bidirectional=True, batch_first=True, dropout=0.3),
                                 lambda: nn.GRU(4, 5, num_layers=3, dropout=0.4),
                                 lambda: nn.RNN(4, 5, num_layers=2, nonlinearity="relu", dropout=0.5)])
def test_stacked_rnn_dropout_between_layers_trains_like_eager(rnn):
    """PyTorch's RNN decomposition in torch 2.13 drops the dropout between layers; the importer applies it where
    eager does, with eager's masks."""
    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = rnn()
            self.head = nn.LazyLinear(1)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.head(y).pow(2).mean()

    torch.manual_seed(0)
    model, x = Seq(), torch.randn(3, 5, 4)
    model(x)  # materialise the lazy head
    prog = import_torch(model.train(), (x,))
    layers = model.rnn.num_layers
    assert [m.rate for m in prog.masks] == [model.rnn.dropout] * (layers - 1)
    result = train_side_by_side(model, [((x,), None)] * 3, lambda loss, _: loss, target="torch", verbose=False)
    check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(4, 5), (5,)])
def test_multilabel_margin_loss_stops_at_the_first_minus_one_like_torch(reduction, shape):
    """PyTorch's own decomposition sums the entries after a -1 too (read as class 0); the importer keeps the op."""

    class Loss(nn.Module):
        def forward(self, y, t):
            return F.multilabel_margin_loss(y, t, reduction=reduction)

    torch.manual_seed(0)
    y = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[0, 3, -1, 0, 0], [1, -1, 0, 0, 0], [4, 2, 1, -1, 0], [0, 1, 2, 3, 4]])[: shape[0] if len(shape) == 2 else 1]
    t = t.reshape(shape)
    prog = import_torch(Loss(), (y.detach(), t))
    mod = transform.FirstOrderGradient(wrt=[prog.inputs[0]])(prog.mod)
    out, (dy,) = pullback.build(mod)["main_grad"](y.detach().numpy(), t.numpy())
    want = Loss()(y, t)
    (g,) = torch.autograd.grad(want.sum(), [y])
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dy, g.numpy(), rtol=1e-12, atol=1e-12)


def test_safe_softmax_gradient_is_zero_on_fully_masked_rows_like_torch():
    """PyTorch's decomposition of _safe_softmax multiplies a NaN softmax by 0 in the backward."""

    class Safe(nn.Module):
        def forward(self, x):
            return torch.ops.aten._safe_softmax.default(x, -1)

    x = torch.randn(3, 4, dtype=torch.float64)
    x[1] = -float("inf")
    x[2, :2] = -float("inf")
    x.requires_grad_(True)
    ct = torch.randn(3, 4, dtype=torch.float64)
    prog = import_torch(Safe(), (x.detach(),))
    mod = transform.FirstOrderGradient(wrt=prog.inputs, mode="vjp")(prog.mod)
    out, (dx,) = pullback.build(mod)["main_grad"](x.detach().numpy(), ct.numpy())
    y = Safe()(x)
    (want,) = torch.autograd.grad(y, [x], ct)
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("value", [2.5, "tensor"])
def test_index_fill_counts_a_repeated_index_once_like_torch(value):
    class Fill(nn.Module):
        def forward(self, x, v):
            return x.index_fill(-1, torch.tensor([0, 2, 2, 4]), v if value == "tensor" else value)

    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    v = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    ct = torch.randn(3, 5, dtype=torch.float64)
    prog = import_torch(Fill(), (x.detach(), v.detach()))
    mod = transform.FirstOrderGradient(wrt=prog.inputs, mode="vjp")(prog.mod)
    out, grads = pullback.build(mod)["main_grad"](x.detach().numpy(), v.detach().numpy(), ct)
    y = Fill()(x, v)
    want = torch.autograd.grad(y, [x, v], ct, allow_unused=True)
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-12)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, np.zeros(()) if w is None else w.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_attention_rows_masked_everywhere_give_zero_and_no_nan_gradient(kind):
    """A query row that may attend nowhere (a boolean mask of False, or an additive mask of -inf) gives 0 and a
    zero gradient, as PyTorch's safe softmax does (the additive case used to give NaN gradients)."""
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    if kind == "bool":
        mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
        mask[..., 1, :] = False
    else:
        mask = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
        mask[..., 1, :] = -float("inf")

    class Attend(nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q * 2, q, mask).pow(2).sum()

    prog = import_torch(Attend(), (q.detach(),))
    mod = transform.FirstOrderGradient(wrt=prog.inputs)(prog.mod)
    out, (dq,) = pullback.build(mod)["main_grad"](q.detach().numpy())
    y = Attend()(q)
    (want,) = torch.autograd.grad(y, [q])
    np.testing.assert_allclose(out, y.item(), rtol=1e-12)
    np.testing.assert_allclose(dq, want.numpy(), rtol=1e-10, atol=1e-12)


class _ConstantMask(nn.Module):
    """sdpa under a mask computed from constants (``kind``): the causal triangle as Hugging Face builds it under
    export (boolean, additive -inf, additive dtype minimum; broadcast over the batch), a shifted one, or a causal
    triangle over more keys than queries (a cache's: bottom-right aligned, not ``is_causal``'s), or one keeping every
    key (boolean, or additive zeros: Hugging Face's bidirectional mask without padding, ViT's)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, q, k):
        b, n, s = q.shape[0], q.shape[2], k.shape[2]
        i, j = torch.arange(n)[:, None], torch.arange(s)[None, :]
        keep = {"shifted": j <= i + 1, "cached": j <= i + (s - n), "all": j >= 0, "zeros": j >= 0}.get(self.kind, j <= i)
        mask = {"bool": keep.expand(b, 1, n, s), "all": keep.expand(b, 1, n, s),
                "min": torch.zeros(n, s, dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)}.get(
            self.kind, torch.where(keep, 0.0, float("-inf")).to(q.dtype))
        return F.scaled_dot_product_attention(q, k, k * 2, attn_mask=mask).pow(2).sum()


@pytest.mark.parametrize("kind, causal, biased", [("bool", True, False), ("inf", True, False), ("min", True, False),
                                                  ("shifted", False, True), ("cached", False, True), ("all", False, False),
                                                  ("zeros", False, False)])
def test_a_constant_causal_mask_is_attention_with_is_causal(kind, causal, biased):
    """A mask from constants that keeps exactly ``is_causal``'s lower triangle: ``nn.attention(is_causal=True)``
    without a bias, as eager is called where torch.export materialises the mask (flash attention then skips the
    blocks above the diagonal); one that keeps every key: no bias at all; any other mask stays the bias. Values and
    float64 gradients are eager's."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 7 if kind == "cached" else 5, 4, dtype=torch.float64, requires_grad=True)
    prog = import_torch(_ConstantMask(kind), (q.detach(), k.detach()))
    (att,) = [n for n in pullback.ir.traversal.post_order(prog.mod["main"].body)
              if isinstance(n, pullback.Call) and getattr(n.op, "name", "") == "nn.attention"]
    assert att.attrs.is_causal == causal and len(att.args) == 3 + biased
    mod = transform.FirstOrderGradient(wrt=prog.inputs)(prog.mod)
    out, grads = pullback.build(mod)["main_grad"](q.detach().numpy(), k.detach().numpy())
    y = _ConstantMask(kind)(q, k)
    want = torch.autograd.grad(y, [q, k])
    np.testing.assert_allclose(out, y.item(), rtol=1e-12)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-10, atol=1e-12)


class _PaddedCausal(nn.Module):
    """sdpa under the causal triangle and a padding mask from the input, as Hugging Face builds it under export
    (``causal & padding``, boolean or as 0 and -inf), or under a shifted triangle and the padding."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def forward(self, q, pad):
        n = q.shape[2]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        keep = (j <= i + (self.kind == "shifted")) & pad.bool()[:, None, None, :]
        mask = keep if self.kind == "bool" else torch.where(keep, 0.0, float("-inf")).to(q.dtype)
        return F.scaled_dot_product_attention(q, q * 2, q.flip(-1), attn_mask=mask).pow(2).sum()


@pytest.mark.parametrize("kind, causal", [("bool", True), ("inf", True), ("shifted", False)])
def test_the_causal_triangle_and_a_padding_mask_is_causal_attention_under_the_padding(kind, causal):
    """``causal & padding``: attention with ``is_causal`` under the padding mask alone (ATen's flash kernel then
    skips the blocks above the diagonal; its output, log-sum-exp and gradients are the same bits). Left padding
    leaves a query row no key: it gives 0, as eager's does. Values and float64 gradients are eager's."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 6, 4, dtype=torch.float64, requires_grad=True)
    pad = torch.ones(2, 6, dtype=torch.long)
    pad[1, :2] = 0
    prog = import_torch(_PaddedCausal(kind), (q.detach(), pad))
    (att,) = [n for n in pullback.ir.traversal.post_order(prog.mod["main"].body)
              if isinstance(n, pullback.Call) and getattr(n.op, "name", "") == "nn.attention"]
    assert att.attrs.is_causal == causal and len(att.args) == 4
    mod = transform.FirstOrderGradient(wrt=["q"])(prog.mod)
    out, (dq,) = pullback.build(mod)["main_grad"](q.detach().numpy(), pad.numpy())
    y = _PaddedCausal(kind)(q, pad)
    (want,) = torch.autograd.grad(y, [q])
    np.testing.assert_allclose(out, y.item(), rtol=1e-12)
    np.testing.assert_allclose(dq, want.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape1,shape2,bias", [((4, 3), (4, 5), True), ((2, 6, 3), (2, 6, 5), False), ((2, 2, 4, 3), (2, 2, 4, 5), True)])
def test_bilinear_values_and_gradients_match_torch(shape1, shape2, bias):
    """``nn.Bilinear`` (``aten._trilinear``, which PyTorch does not decompose; ``frontend.decompositions``): values
    and float64 gradients of both inputs, the weight and the bias, with one to three batch dims."""
    torch.manual_seed(0)
    m = torch.nn.Bilinear(3, 5, 2, bias=bias).double()
    x1, x2 = torch.randn(*shape1, dtype=torch.float64), torch.randn(*shape2, dtype=torch.float64)
    prog = import_torch(m, (x1, x2))
    mod = transform.FirstOrderGradient(mode="vjp", wrt=prog.inputs + prog.trainable)(prog.mod)
    y = m(x1, x2)
    ct = torch.randn_like(y)
    want = _grads_torch(m, (x1, x2), ct.numpy(), [0, 1])
    out, grads = pullback.build(mod)["main_grad"](*main_inputs(prog, (x1, x2)), ct.numpy())
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert len(grads) == len(want)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


class AdaptiveMax(torch.nn.Module):
    def __init__(self, nd, out):
        super().__init__()
        self.pool = (torch.nn.AdaptiveMaxPool1d if nd == 1 else torch.nn.AdaptiveMaxPool2d)(out, return_indices=True)

    def forward(self, x):
        values, indices = self.pool(x)
        return values * 2, indices


@pytest.mark.parametrize("nd,shape,out", [(2, (2, 3, 6, 4), (2, 2)), (2, (3, 5, 5), 1), (1, (2, 3, 8), 4), (1, (3, 6), 1),
                                          (2, (2, 3, 5, 7), (2, 3)), (2, (3, 5, 4), (3, 3)), (1, (2, 3, 7), 3)])
def test_adaptive_max_pooling_values_indices_and_gradients_match_torch(nd, shape, out):
    """Adaptive max pooling, batched or not: input sizes that are multiples of the output's (global max pooling,
    halvings) and windows ``[floor(i n / o), ceil((i + 1) n / o))`` of different sizes, overlapping (5 -> 2, 7 -> 3):
    values, indices and the float64 gradient (to each window's first maximum, ties included)."""
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64).round()  # ties: the first maximum wins, as in PyTorch
    m = AdaptiveMax(nd, out)
    prog = import_torch(m, (x,))
    mod = transform.FirstOrderGradient(mode="vjp", wrt=prog.inputs)(prog.mod)
    xg = x.clone().requires_grad_(True)
    values, indices = m(xg)
    ct = torch.randn_like(values)
    (values * ct).sum().backward()
    (got, got_idx), (dx,) = pullback.build(mod)["main_grad"](x.numpy(), (ct.numpy(), np.zeros(indices.shape, "int64")))
    np.testing.assert_array_equal(got, values.detach().numpy())
    np.testing.assert_array_equal(got_idx, indices.numpy())
    np.testing.assert_allclose(dx, xg.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_as_strided_scatter_gradients_are_the_scatters():
    """Its input gets the cotangent with the written positions zeroed, the source a gather (finite differences:
    eager's own input gradient of a direct ``as_strided_scatter`` call differs, torch 2.13)."""
    from pullback.testing.gradcheck import check_grad

    class M(nn.Module):
        def forward(self, x, v):
            return torch.as_strided_scatter(x, v * v, (2, 2), (1, 4), 1) * torch.arange(12.0, dtype=x.dtype).reshape(3, 4)

    x, v = torch.randn(3, 4, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)
    mod, _ = from_torch(M(), (x, v))
    np.testing.assert_allclose(pullback.build(mod)["main"](x.numpy(), v.numpy()), M()(x, v).numpy(), rtol=1e-12)
    check_grad(mod, [x.numpy(), v.numpy()])


def test_as_strided_scatter_through_an_overlapping_view_is_refused():
    class M(nn.Module):
        def forward(self, x):
            return torch.as_strided_scatter(x, torch.ones(2, 2), (2, 2), (1, 1))

    with pytest.raises(UnsupportedOperatorError, match="writes some elements twice"):
        from_torch(M(), (torch.randn(3, 4),))


class StridedView(nn.Module):
    """``as_strided`` of a view: eager reads the view's storage through the given strides."""

    def __init__(self, view, size, stride, offset=None):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
        self.view, self.size, self.stride, self.offset = view, size, stride, offset

    def forward(self, x):
        v = self.view(self.w * x)
        stride = self.stride(v) if callable(self.stride) else self.stride
        out = v.as_strided(self.size, stride) if self.offset is None else v.as_strided(self.size, stride, self.offset)
        return (out * torch.arange(1.0, out.numel() + 1, dtype=out.dtype).reshape(out.shape)).sum()


STRIDED_VIEWS = {
    "transposed": (lambda t: t.t(), (4, 3), lambda v: v.stride(), None),
    # Longformer's chunks: overlapping windows of a transposed view, strides taken from the view
    "windows of a transposed view": (lambda t: t.t(), (2, 3, 2), lambda v: (2 * v.stride(0), v.stride(1), v.stride(0)), None),
    "a slice, its own offset": (lambda t: t[1:], (2, 2), (4, 1), None),
    "a slice, an explicit offset": (lambda t: t[1:], (2, 3), (4, 1), 5),
    "expanded": (lambda t: t[:, :1].expand(3, 4), (3, 2), (4, 0), None),
    "contiguous": (lambda t: t, (2, 3), (1, 2), 1),
}


@pytest.mark.parametrize("name", list(STRIDED_VIEWS))
def test_as_strided_reads_a_view_through_its_own_layout(name):
    """As eager: positions count in the storage, where the view's own strides and offset put its elements (before,
    in its row-major elements: a transposed view read wrong values and gradients without an error)."""
    from pullback.integrations.torch import compile as pb_compile

    torch.manual_seed(0)
    model, x = StridedView(*STRIDED_VIEWS[name]), torch.randn(3, 4, dtype=torch.float64)
    eager = copy.deepcopy(model)
    got, want = pb_compile(model, (x,))(x), eager(x)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.w.grad, eager.w.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("view, size, stride, why", [
    (lambda t: t[:, :2], (3, 3), (4, 1), "none of the tensor's elements holds"),  # the sliced-off column
    (lambda t: t[1:], (3, 4), (4, 1), "none of the tensor's elements holds"),  # storage before the slice
])
def test_as_strided_beyond_the_views_elements_is_refused(view, size, stride, why):
    model = StridedView(view, size, stride, 0 if size == (3, 4) else None)
    with pytest.raises(UnsupportedOperatorError, match=why):
        from_torch(model, (torch.randn(3, 4, dtype=torch.float64),))


def test_as_strided_scatter_into_a_transposed_tensor_writes_eagers_positions():
    class M(nn.Module):
        def forward(self, x, v):
            return torch.as_strided_scatter(x.t(), v, (2, 2), (1, 3), 1) * torch.arange(12.0, dtype=x.dtype).reshape(4, 3)

    x, v = torch.randn(3, 4, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)
    mod, _ = from_torch(M(), (x, v))
    np.testing.assert_array_equal(pullback.build(mod)["main"](x.numpy(), v.numpy()), M()(x, v).numpy())


def test_nanmedian_of_a_row_of_nans_is_nan_and_median_takes_the_first_nan():
    class M(nn.Module):
        def forward(self, x):
            return torch.nanmedian(x, 1).values, torch.median(x, 1).indices, torch.nanmedian(x)

    x = torch.tensor([[float("nan")] * 3, [2.0, float("nan"), float("nan")], [3.0, 1.0, 2.0]])
    got = pullback.build(from_torch(M(), (x,))[0])["main"](x.numpy())
    want = M()(x)
    np.testing.assert_array_equal(got[0], want[0].numpy())  # [nan, 2, 2]
    np.testing.assert_array_equal(got[1], want[1].numpy())  # [0, 1, 1]: the first NaN, else the median
    assert float(got[2]) == float(want[2]) == 2.0


def test_rrelu_in_training_is_refused_with_the_reason_and_converts_in_evaluation():
    x = torch.randn(3, 4)
    with pytest.raises(UnsupportedOperatorError, match="random slope per negative entry"):
        import_torch(nn.RReLU().train(), (x,))
    mod, _ = from_torch(nn.RReLU(0.1, 0.3).eval(), (x,))
    np.testing.assert_allclose(pullback.build(mod)["main"](x.numpy()), F.leaky_relu(x, 0.2).numpy(), rtol=1e-6)


def test_a_loop_writing_one_time_step_at_a_time_imports_as_slice_writes():
    """``out[:, t] = v`` in a loop over time (RWKV's recurrence): each write stays a write of its slice
    (``strided_set``), not PyTorch's decomposition of ``select_scatter`` into a ``where`` over the whole tensor,
    whose work grows with the square of the sequence; values and gradients are eager's."""

    class Recurrence(nn.Module):
        def forward(self, x, decay):
            out = torch.zeros_like(x)
            state = torch.zeros_like(x[:, 0])
            for t in range(x.shape[1]):
                state = state * decay + x[:, t]
                out[:, t] = torch.tanh(state)
            return out

    x, decay = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True), torch.rand(3, dtype=torch.float64)
    prog = import_torch(Recurrence(), (x.detach(), decay))
    names = [n.op.name for n in pullback.ir.traversal.post_order(prog.mod["main"].body)
             if isinstance(n, pullback.ir.expr.Call) and hasattr(n.op, "name")]
    assert names.count("strided_set") == 6 and "where" not in names
    ct = torch.randn(2, 6, 3, dtype=torch.float64)
    mod = transform.FirstOrderGradient(wrt=prog.inputs[:1], mode="vjp")(prog.mod)
    out, (dx,) = pullback.build(mod)["main_grad"](x.detach().numpy(), decay.numpy(), ct.numpy())
    y = Recurrence()(x, decay)
    (want,) = torch.autograd.grad(y, [x], ct)
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_hardswish_and_hardsigmoid_import_whole(target):
    """MobileNetV3's and LeViT's activations stay one operator each (PyTorch's decompositions take four to seven
    comparisons, selects and products each way); values and gradients are those of torch ops in float64 (ATen's
    float64 ``hardsigmoid_backward`` multiplies by 1/6 rounded to float32), and on torch eager's own bits in
    float32."""
    from pullback.integrations.torch import compile as pb_compile

    class Block(nn.Module):
        def __init__(self, exact: bool = False):
            super().__init__()
            self.fc, self.exact = nn.Linear(8, 8), exact

        def forward(self, x):
            h = F.hardswish(self.fc(x))
            m = h.mean(-1, keepdim=True)
            return (h * (torch.clamp(m + 3, 0, 6) / 6 if self.exact else F.hardsigmoid(m))).sum()

    x = torch.randn(4, 8, dtype=torch.float64) * 3
    prog = import_torch(Block().double(), (x,))
    names = [n.op.name for n in pullback.ir.traversal.post_order(prog.mod["main"].body)
             if isinstance(n, pullback.ir.expr.Call) and hasattr(n.op, "name")]
    assert names.count("nn.hardswish") == 1 and names.count("nn.hardsigmoid") == 1
    assert not {"where", "clip", "greater_equal", "less_equal"} & set(names), names
    for dtype in (torch.float64, torch.float32):
        torch.manual_seed(0)
        eager = Block(exact=dtype == torch.float64).to(dtype)
        ours = copy.deepcopy(eager)
        ours.exact = False
        xs = x.to(dtype)
        compiled = pb_compile(ours, (xs,), target=target)
        want, got = eager(xs), compiled(xs)
        want.backward()
        got.backward()
        exact = dtype == torch.float32 and target == "torch"
        tol = dict(rtol=0, atol=0) if exact else dict(rtol=1e-12 if dtype == torch.float64 else 1e-5, atol=1e-12)
        torch.testing.assert_close(got, want, **tol)
        for a, b in zip(ours.parameters(), eager.parameters()):
            torch.testing.assert_close(a.grad, b.grad, **tol)


def test_sort_keeps_eagers_order_of_ties_on_torch():
    """``torch.sort`` is unstable unless asked: the importer leaves the ties' order to the target's sort, ATen's
    on torch, so the permutation is eager's (a mixture of experts sorts its tokens by expert id, and the rows'
    places in their groups decide a grouped GEMM's bits); ``stable=True`` stays stable."""
    from pullback.integrations.torch import compile as pb_compile

    class Sorts(nn.Module):
        def forward(self, ids):
            return torch.sort(ids).indices, torch.sort(ids, stable=True).indices

    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 4, 1024))
    prog = import_torch(Sorts(), (ids,))
    flags = [n.attrs.stable for n in pullback.ir.traversal.post_order(prog.mod["main"].body)
             if isinstance(n, pullback.ir.expr.Call) and getattr(n.op, "name", "") == "argsort"]
    assert sorted(flags) == [False, True]
    for got, want in zip(pb_compile(Sorts(), (ids,), target="torch")(ids), Sorts()(ids)):
        assert torch.equal(got, want)


def test_topk_chooses_among_ties_as_eager_on_torch():
    """``torch.topk`` over tied values (a bfloat16 router's logits) picks eager's entries on the torch target, and
    the values' gradient goes where eager's does."""
    from pullback.integrations.torch import compile as pb_compile

    class Route(nn.Module):
        def forward(self, logits):
            top = torch.topk(logits, 2, dim=-1)
            return top.indices, top.values.sum()

    logits = torch.from_numpy(np.random.default_rng(4).integers(0, 3, (64, 4)).astype("float32")).requires_grad_()
    mine, theirs = logits.detach().clone().requires_grad_(), logits.detach().clone().requires_grad_()
    (gi, gv), (wi, wv) = pb_compile(Route(), (logits,), target="torch")(mine), Route()(theirs)
    gv.backward()
    wv.backward()
    assert torch.equal(gi, wi) and torch.equal(mine.grad, theirs.grad)


class _LogSoftmaxNLL(torch.nn.Module):
    """PyTorch's MNIST example's loss: ``F.nll_loss(F.log_softmax(x))``, here with weights and an ignored class,
    over (N, C) or (N, C, H, W) scores."""

    def __init__(self, spatial: bool):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 1) if spatial else None
        self.lin = None if spatial else torch.nn.Linear(3, 4)

    def forward(self, x, y):
        z = self.conv(x) if self.conv is not None else self.lin(x)
        logp = torch.nn.functional.log_softmax(z, dim=1)
        return torch.nn.functional.nll_loss(logp, y, weight=torch.tensor([1.0, 0.5, 2.0, 1.0], dtype=z.dtype),
                                            ignore_index=2)


@pytest.mark.parametrize("spatial", [False, True], ids=["nll_loss", "nll_loss2d"])
def test_nll_loss_imports_as_one_operator_with_eagers_values_and_gradients(spatial):
    """``F.nll_loss`` is one ``nn.nll_loss`` (ATen's kernel each way on the torch target), not PyTorch's
    decomposition into a dozen gathers, wheres and sums."""
    torch.manual_seed(0)
    model = _LogSoftmaxNLL(spatial).double()
    x = torch.randn(5, 2, 3, 3, dtype=torch.float64) if spatial else torch.randn(5, 3, dtype=torch.float64)
    y = torch.randint(0, 4, (5, 3, 3) if spatial else (5,))
    mod, _ = from_torch(model, (x, y))
    names = [n.op.name for n in pullback.ir.post_order(mod["main"].body) if isinstance(n, pullback.Call)
             and isinstance(n.op, pullback.ops.OpDef)]
    assert names.count("nn.nll_loss") == 1 and "gather" not in names and "scatter_add" not in names, names
    want = model(x, y)
    want.backward()
    for target in ("numpy", "torch"):
        from pullback.integrations.torch import compile as pb_compile

        trained = copy.deepcopy(model)
        trained.zero_grad()
        got = pb_compile(trained, (x, y), target=target)(x, y)
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for p, q in zip(trained.parameters(), model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)
