"""Training in bfloat16: a bfloat16 model, and a float32 model inside ``torch.autocast(dtype=torch.bfloat16)``.

bfloat16 rounds after 8 significant bits, so two correct implementations differ in the last bit wherever they round
at other places (eager's fused kernels round once where pullback's graph may round twice, and the other way
round). The measure is then the one for any low precision: each implementation's gradients against the float64
ones of the same model, pullback's error no larger than eager's (within a factor for noise); and equal bits where
both round at the same places (a small model's forward).
"""

from __future__ import annotations

import copy
import functools
import math
import statistics

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pullback.integrations.dynamo_backend import pullback_backend  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402

BF16 = torch.bfloat16


def _autocast():
    return torch.autocast("cpu", dtype=BF16)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))


def _errors(model, eager, reference) -> tuple:
    """Median relative errors of pullback's and eager's gradients against float64's, over the parameters."""
    ours, theirs = [], []
    for p, q, r in zip(model.parameters(), eager.parameters(), reference.parameters()):
        if r.grad is None or float(r.grad.norm()) < 1e-6:
            continue  # a gradient that is zero in exact arithmetic (an attention key's bias): rounding noise only
        norm = float(r.grad.norm())
        ours.append(float((p.grad.double() - r.grad).norm()) / norm)
        theirs.append(float((q.grad.double() - r.grad).norm()) / norm)
    return statistics.median(ours), statistics.median(theirs)


def _trains_like_eager(model, inputs: tuple, wide: tuple, target: str) -> None:
    """One backward of the scalar ``model(*inputs)`` through pullback, eager and float64 (``wide``: the inputs for
    the float64 copy): on the torch target the loss and every gradient are eager's bits; on every target the
    gradients are as close to float64's as eager's."""
    eager, reference = copy.deepcopy(model), copy.deepcopy(model).double()
    loss, want = pb_compile(model, inputs, target=target)(*inputs), eager(*inputs)
    loss.backward()
    want.backward()
    reference(*wide).backward()
    if target == "torch":
        assert torch.equal(loss, want)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters()))
    ours, theirs = _errors(model, eager, reference)
    assert ours <= 1.5 * theirs + 1e-3, (ours, theirs)


def test_a_bfloat16_model_trains_like_eager(target):
    """Parameters and inputs in bfloat16: the forward equals eager's bit for bit on numpy and torch, the parameters'
    gradients are bfloat16, as eager's, and as close to float64's as eager's."""
    torch.manual_seed(0)
    model, x = _mlp().to(BF16), torch.randn(8, 16, dtype=BF16)
    eager, reference = copy.deepcopy(model), copy.deepcopy(model).double()
    out = pb_compile(model, (x,), target=target)(x)
    want = eager(x)
    assert out.dtype == BF16
    if target != "jax":  # XLA fuses the elementwise operators and rounds once for several
        assert torch.equal(out, want)
    out.float().square().mean().backward()
    want.float().square().mean().backward()
    reference(x.double()).square().mean().backward()
    assert all(p.grad.dtype == BF16 for p in model.parameters())
    ours, theirs = _errors(model, eager, reference)
    assert ours <= 1.5 * theirs + 1e-3, (ours, theirs)


class _Gates(torch.nn.Module):
    """tanh, sigmoid and softplus of one linear's output (an LSTM's gates, GPT-2's tanh GELU, Mamba's step size)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        h = self.lin(x)
        return (torch.tanh(h) * torch.sigmoid(h) + torch.nn.functional.softplus(h, 2.0, 1.0)).float().square().mean()


def test_tanh_sigmoid_and_softplus_gradients_in_bfloat16_are_eagers_bits(target):
    """In bfloat16 the gradients of tanh, sigmoid and softplus are one kernel each, computed in float32 and rounded
    once, as ATen's tanh_backward, sigmoid_backward and softplus_backward: the bias's gradient (the rows' sum of
    those gradients) is eager's bit for bit on the numpy and torch targets (the products and differences took two
    to five roundings: 7.6e-6 off), and so is the weight's on the torch target, whose bfloat16 GEMM is eager's. The
    numpy target's weight gradient is a float32 GEMM of NumPy's BLAS rounded once, whose sums run in another order
    than eager's: within one bfloat16 rounding of eager's (one of 4096 elements differed, by 2.4e-7, with NumPy 2.4.6's
    OpenBLAS). XLA fuses them its way."""
    torch.manual_seed(0)
    model, x = _Gates().to(BF16), torch.randn(256, 64, dtype=BF16)
    eager = copy.deepcopy(model)
    pb_compile(model, (x,), target=target)(x).backward()
    eager(x).backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        if target == "jax":
            torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=1e-4)
        elif target == "numpy" and name == "lin.weight":
            ulp = torch.finfo(BF16).eps * q.grad.float().abs().clamp_min(torch.finfo(BF16).tiny)
            assert bool(((p.grad.float() - q.grad.float()).abs() <= ulp).all()), name
        else:
            assert torch.equal(p.grad, q.grad), name


class _ByNumbers(torch.nn.Module):
    """Python numbers bfloat16 cannot hold: an attention scale 1/sqrt(80), GPT-2's tanh GELU written out (0.044715,
    sqrt(2/pi)), erf (its gradient's 2/sqrt(pi)), a rank-0 float32 buffer, and a label-smoothed cross entropy."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(80, 80)

    def forward(self, x, labels):
        h = self.lin(x)
        a = torch.softmax(h @ h.T / math.sqrt(80), -1) @ h
        g = 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * torch.pow(a, 3.0))))
        return torch.nn.functional.cross_entropy(torch.erf(g) * self.temperature, labels, label_smoothing=0.1)


def test_bfloat16_times_a_python_number_is_eagers_bits(target):
    """ATen multiplies or divides a bfloat16 tensor by a number (a Python one, or a rank-0 float32 tensor) in
    float32 and rounds once; the importer does the same (``multiply_scalar``, ``divide_scalar``). On the torch target
    the loss and the parameters' gradients are eager's bit for bit (the number rounded to bfloat16 first put GPT-2's
    GELU and this loss a few bits off); NumPy's and XLA's exp and erf round their own way, so there the gradients
    are as close to float64's as eager's."""
    torch.manual_seed(0)
    model = _ByNumbers().to(BF16)
    model.register_buffer("temperature", torch.tensor(1.37))  # float32, after the cast to bfloat16
    x, labels = torch.randn(64, 80, dtype=BF16), torch.randint(0, 80, (64,))
    _trains_like_eager(model, (x, labels), (x.double(), labels), target)


class _Lookups(torch.nn.Module):
    """An embedding, a gather of rows (``h[:, sel]``) and ``index_put_(accumulate=True)``, each index repeated many
    times: eager's backwards add their rows one by one, rounding to bfloat16 after each addition."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(40, 16)
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, ids, sel, rows):
        h = self.lin(self.emb(ids))[:, sel]
        pooled = torch.zeros(8, 16, dtype=h.dtype).index_put_((rows,), h.reshape(-1, 16), accumulate=True)
        return (pooled * pooled).mean()


def test_lookups_in_bfloat16_add_their_gradients_as_eager_does(target):
    """On torch the embedding's, the gather's and the scatter's gradients are eager's bits (its index_put rounds each
    addition; summing in float32 and rounding once, as ATen's index_add does, gave many of the embedding's
    gradient entries another last bit); elsewhere as close to float64's as eager's."""
    torch.manual_seed(0)
    model = _Lookups().to(BF16)
    ids, sel = torch.randint(0, 40, (4, 64)), torch.randint(0, 64, (96,))
    rows = torch.randint(0, 8, (4 * 96,))
    _trains_like_eager(model, (ids, sel, rows), (ids, sel, rows), target)


def test_float32_embedding_gradients_are_eagers_index_add():
    """In float32 eager's embedding backward sums the lookups as ATen's ``index_add`` does: the torch target runs that
    kernel (``index_put`` with ``accumulate``, the half-precision one, gave other bits and took 16x longer), adding
    into the zeros it made (``index_add_``: no copy of them first)."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 128)

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def forward(self, ids, g):
            return (self.emb(ids) * g).sum()

    ids, g = torch.randint(0, 50, (8, 128)), torch.randn(8, 128, 128)
    model = Loss()
    eager = copy.deepcopy(model)
    compiled = pb_compile(model, (ids, g), target="torch")
    eager(ids, g).backward()
    with torch.autograd.profiler.profile() as prof:
        compiled(ids, g).backward()
    names = {e.name for e in prof.function_events}
    assert "aten::index_add_" in names and "aten::index_add" not in names and not any("index_put" in n for n in names)
    assert torch.equal(model.emb.weight.grad, eager.emb.weight.grad)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    ids = torch.randint(0, 128, (2, 16))
    return LlamaForCausalLM(cfg), dict(input_ids=ids, labels=ids)


def _bn_cnn():
    class CNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
            self.c2, self.b2 = torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x, labels):
            x = torch.nn.functional.max_pool2d(torch.relu(self.b1(self.c1(x))), 2)
            logits = self.fc(torch.relu(self.b2(self.c2(x))).mean((2, 3)))
            return torch.nn.functional.cross_entropy(logits, labels)

    return CNN(), dict(x=torch.randn(4, 3, 16, 16), labels=torch.tensor([1, 2, 3, 4]))


def _loss(out):
    return out if torch.is_tensor(out) else out.loss


@pytest.mark.parametrize("route", ["compile", "torch.compile"])
@pytest.mark.parametrize("make", [_llama, _bn_cnn], ids=["llama", "bn-cnn"])
def test_autocast_training_is_as_accurate_as_eagers(make, route):
    """A float32 model trained inside ``torch.autocast(bfloat16)``, through ``compile`` and through
    ``torch.compile(backend="pullback")``: the loss as eager's to bfloat16's precision, the gradients float32 and as
    close to float64's as eager's (and not much closer: computed in bfloat16 too), batch norm's running statistics float32 and as eager's."""
    torch.manual_seed(0)
    model, batch = make()
    eager, reference = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = pb_compile(model, batch) if route == "compile" else torch.compile(model, backend="pullback")
    with _autocast():
        loss, want = _loss(compiled(**batch)), _loss(eager(**batch))
    torch.testing.assert_close(loss, want, rtol=1e-2, atol=0)
    loss.backward()
    want.backward()
    _loss(reference(**{k: v.double() if v.is_floating_point() else v for k, v in batch.items()})).backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    ours, theirs = _errors(model, eager, reference)
    assert theirs / 3 <= ours <= 1.5 * theirs + 1e-3, (ours, theirs)  # computed in bfloat16 too, not in float32
    for (name, b), c in zip(model.named_buffers(), eager.buffers()):
        assert b.dtype == c.dtype, name
        torch.testing.assert_close(b, c, rtol=1e-2, atol=1e-3)


class _Composites(torch.nn.Module):
    """The composite operators whose decompositions torch.export runs outside the autocast region
    (pytorch/pytorch#137274): einsum (of a bfloat16 and a float32 operand), tensordot, multi_dot, inner reach
    autocast's bfloat16 matmuls in eager; nll_loss and a reflect pad its float32 kernels."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.w = torch.nn.Parameter(torch.randn(8, 8) / 3)
        self.v = torch.nn.Parameter(torch.randn(8, 6) / 3)

    def forward(self, x, labels):
        h = torch.einsum("bi,ij->bj", self.proj(x), self.w)  # bfloat16 x float32: an error without the casts
        h = h.to(self.w.dtype).tanh()  # operands of one dtype (eager refuses mixed ones but for einsum's)
        h = torch.tensordot(h, self.w, dims=([1], [0])) + torch.inner(h, self.w)
        logits = torch.linalg.multi_dot([h.to(self.w.dtype), self.w, self.v])
        padded = torch.nn.functional.pad(logits.unsqueeze(0), (1, 1), mode="reflect").squeeze(0)
        return torch.nn.functional.nll_loss(padded.log_softmax(-1), labels)


@pytest.mark.parametrize("route", ["compile", "torch.compile"])
def test_composite_operators_get_autocasts_casts(target, route):
    """Under autocast the composite operators compute in eager's dtypes, both routes: the loss float32 and equal to
    eager's bit for bit on the torch target (the same ATen kernels on the same operands), the gradients as close to
    float64's as eager's and not much closer (the products computed in bfloat16, not float32). Before the casts,
    the einsum failed and nll_loss computed in bfloat16."""
    torch.manual_seed(0)
    model = _Composites()
    batch = dict(x=torch.randn(16, 8), labels=torch.randint(0, 8, (16,)))
    eager, reference = copy.deepcopy(model), copy.deepcopy(model).double()
    with _autocast():
        compiled = pb_compile(model, batch, target=target) if route == "compile" else \
            torch.compile(model, backend=functools.partial(pullback_backend, target=target))
        loss, want = compiled(**batch), eager(**batch)
    assert loss.dtype == want.dtype == torch.float32
    if target == "torch":
        assert torch.equal(loss, want)
    torch.testing.assert_close(loss, want, rtol=1e-2, atol=0)
    loss.backward()
    want.backward()
    reference(batch["x"].double(), batch["labels"]).backward()
    ours, theirs = _errors(model, eager, reference)
    assert theirs / 3 <= ours <= 1.5 * theirs + 1e-3, (ours, theirs)


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_bfloat16_attention_computes_in_float32_as_atens_kernel():
    """ATen's CPU attention computes bfloat16 attention in float32 and rounds its output once; so does pullback's,
    whose output and gradients are then as close to float64's as eager's (rounding the scores and probabilities
    put them 1.3-2x further)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32).to(BF16) for _ in range(3))
    g = torch.randn(2, 4, 64, 32, dtype=torch.float64)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    want = _Attention()(*exact)
    want.backward(g)
    compiled = pb_compile(_Attention(), (q, k, v))
    errors = {}
    for name, f in (("eager", _Attention()), ("pullback", compiled)):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = f(*xs)
        out.backward(g.to(BF16))
        assert out.dtype == BF16 and all(x.grad.dtype == BF16 for x in xs)
        errors[name] = [float((a.detach().double() - b.detach()).norm() / b.detach().norm()) for a, b in
                        [(out, want)] + [(x.grad, e.grad) for x, e in zip(xs, exact)]]
    for ours, theirs in zip(errors["pullback"], errors["eager"]):
        assert ours <= 1.05 * theirs, errors


class _Norms(torch.nn.Module):
    def forward(self, x):
        return torch.stack([torch.linalg.vector_norm(x, o, -1) for o in (2, 1, 3, 0.5)]), torch.nn.functional.normalize(x, dim=-1)


def test_bfloat16_vector_norms_are_eagers_bits(target):
    """ATen sums a bfloat16 norm's powers and takes its root in float32, rounding once (``F.normalize``, cosine
    similarity); so does the importer: on the torch target, eager's bits."""
    torch.manual_seed(0)
    x = torch.randn(32, 64, dtype=BF16) * 4
    got, want = pb_compile(_Norms(), (x,), target=target)(x), _Norms()(x)
    for a, b in zip(got, want):
        assert a.dtype == BF16
        if target == "torch":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-2, atol=0)


class _Variances(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(48, 48)

    def forward(self, x):
        h = self.lin(x)
        return (h.var(-1) + h.var(0, unbiased=False).sum() + h[:, :7].var()).float().square().sum()


def test_bfloat16_variance_gradient_is_eagers_bits(target):
    """A bfloat16 variance's gradient takes PyTorch's formula and roundings, ``(2 / (N - unbiased)) * g * (x -
    mean)``: eager's bits on the torch target (centred on each slice's first entry it was a few bits off)."""
    torch.manual_seed(0)
    model, x = _Variances().to(BF16), torch.randn(32, 48, dtype=BF16)
    _trains_like_eager(model, (x,), (x.double(),), target)


def test_bfloat16_attention_is_eagers_bits_on_torch(target):
    """Unmasked attention is one operator whose torch kernel is ATen's flash attention, eager's own: on the torch
    target output and gradients are eager's bit for bit (GQA's shared heads too: their gradients add up in float32
    inside the kernel, before one rounding); the gradients, computed in float32 from the recomputed probabilities,
    are as close to float64's as eager's on every target."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 48, 16).to(BF16), torch.randn(2, 2, 48, 16).to(BF16), torch.randn(2, 2, 48, 16).to(BF16)

    class GQA(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    g = torch.randn(2, 4, 48, 16, dtype=torch.float64)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    GQA()(*exact).backward(g)
    outs, grads, errors = {}, {}, {}
    for name, f in (("eager", GQA()), ("pullback", pb_compile(GQA(), (q, k, v), target=target))):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        outs[name] = out = f(*xs)
        out.backward(g.to(BF16))
        grads[name] = [x.grad for x in xs]
        errors[name] = [float((x.grad.double() - e.grad).norm() / e.grad.norm()) for x, e in zip(xs, exact)]
    if target == "torch":
        assert torch.equal(outs["pullback"], outs["eager"])
        assert all(torch.equal(a, b) for a, b in zip(grads["pullback"], grads["eager"]))
    for ours, theirs in zip(errors["pullback"], errors["eager"]):
        assert ours <= 1.05 * theirs, errors


class _RepeatedHeads(torch.nn.Module):
    """Grouped-query attention as Hugging Face writes it under export: keys and values projected to 2 heads,
    repeated to the queries' 4 (``repeat_kv``), and a causal mask built from constants; or, ``shared=True``, as it
    runs in eager without a mask (``enable_gqa``, ``is_causal``)."""

    def __init__(self, shared: bool = False):
        super().__init__()
        self.shared = shared
        self.q, self.kv = torch.nn.Linear(32, 64, bias=False), torch.nn.Linear(32, 64, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 16).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, 2, 16).permute(3, 0, 2, 1, 4)
        if self.shared:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = (t[:, :, None].expand(b, 2, 2, n, 16).reshape(b, 4, n, 16) for t in (k, v))
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        return (o.float() ** 2).mean()


def test_bfloat16_repeated_key_heads_under_a_constant_mask_are_shared_as_eager_does(target):
    """Repeated key/value heads under a mask computed from constants become one grouped-query attention, whose
    key/value residuals keep 2 heads, not 4: on torch the loss and every gradient are the bits of eager's
    ``enable_gqa`` kernel (the call Hugging Face makes in eager, without a mask)."""
    import pullback
    from pullback.frontend import from_torch

    torch.manual_seed(0)
    model, x = _RepeatedHeads().to(BF16), torch.randn(2, 24, 32).to(BF16)
    mod, _ = from_torch(model, (x,))
    (att,) = [n for n in pullback.ir.traversal.post_order(mod["main"].body) if pullback.ops.is_call_to(n, "nn.attention")]
    assert [a.checked_type.shape[1] for a in att.args[:3]] == [4, 2, 2]
    eager = _RepeatedHeads(shared=True).to(BF16)
    eager.load_state_dict(model.state_dict())
    reference = copy.deepcopy(eager).double()
    loss, want = pb_compile(model, (x,), target=target)(x), eager(x)
    loss.backward()
    want.backward()
    reference(x.double()).backward()
    if target == "torch":
        assert torch.equal(loss, want)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), eager.parameters()))
    ours, theirs = _errors(model, eager, reference)
    assert ours <= 1.05 * theirs, (ours, theirs)


def _padded_causal_mask(batch: int, length: int) -> torch.Tensor:
    """Hugging Face's boolean sdpa mask for a left-padded batch: causal, and the second sample's first three
    positions padding (its first three query rows keep no key: flash attention gives them 0)."""
    keep = torch.ones(batch, 1, length, length, dtype=torch.bool).tril()
    keep[1, :, :, :3] = False
    return keep


@pytest.mark.parametrize("mask", ["bool", "additive"])
def test_bfloat16_masked_attention_is_eagers_bits_on_torch(target, mask):
    """Masked attention is the same one operator, the mask its bias (a boolean mask 0 and -inf, as eager converts
    it): on the torch target ATen's flash attention and its backward get eager's operands, so output and
    gradients are eager's bits; a query row masked everywhere gives 0 and gradient 0. Elsewhere the gradients
    are as close to float64's as eager's. An additive mask of bfloat16's least value over a whole row is another
    matter: the softmax spreads the row over its keys, and so do pullback's gradients, where ATen's flash backward
    (eager's, in every dtype) gives each of its probabilities 1; there the output is eager's bits, and the gradients
    are as close to the formula's in float64 as eager's to its own float64."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 40, 16).to(BF16) for _ in range(3))
    keep = _padded_causal_mask(2, 40)
    m = keep if mask == "bool" else torch.zeros(2, 1, 40, 40).masked_fill(~keep, torch.finfo(BF16).min).to(BF16)

    class Masked(torch.nn.Module):
        def forward(self, q, k, v, m):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def formula(q, k, v, m):
        return torch.softmax(q @ k.transpose(-1, -2) / 4 + m, -1) @ v

    g = torch.randn(2, 4, 40, 16, dtype=torch.float64)
    exact = {}
    for name, f in (("eager", Masked()), ("pullback", Masked() if mask == "bool" else formula)):
        exact[name] = [t.double().requires_grad_() for t in (q, k, v)]
        f(*exact[name], m if mask == "bool" else m.double()).backward(g)
    outs, grads, errors = {}, {}, {}
    for name, f in (("eager", Masked()), ("pullback", pb_compile(Masked(), (q, k, v, m), target=target))):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        outs[name] = out = f(*xs, m)
        out.backward(g.to(BF16))
        grads[name] = [x.grad for x in xs]
        errors[name] = [float((x.grad.double() - e.grad).norm() / e.grad.norm()) for x, e in zip(xs, exact[name])]
    if mask == "bool":  # the padded sample's first query rows: no key to attend to
        assert not outs["pullback"][1, :, :3].any() and not grads["pullback"][0][1, :, :3].any()
    if target == "torch":
        assert torch.equal(outs["pullback"], outs["eager"])
        if mask == "bool":
            assert all(torch.equal(a, b) for a, b in zip(grads["pullback"], grads["eager"]))
    for ours, theirs in zip(errors["pullback"], errors["eager"]):
        assert ours <= 1.05 * theirs, errors


@pytest.mark.parametrize("route", ["compile", "dynamo"])
def test_bfloat16_attention_with_a_learnable_bias_is_as_accurate_as_eagers(target, route):
    """A bfloat16 mask that depends on a trainable parameter (T5's relative position bias plus a padding mask):
    eager runs its math kernel in float32 (its flash kernel has no mask gradient), so pullback keeps attention
    written out in float32 too, rounding once; the fused bfloat16 kernels' q and k gradients were 1.2-1.8x
    eager's error, and a T5 trained on a padded batch 2.5x. Through Dynamo the parameters are the graph's
    inputs: their ``requires_grad`` says the same."""
    torch.manual_seed(0)

    class Biased(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.randn(1, 4, 16, 16))

        def forward(self, q, k, v, mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias + mask, scale=1.0)

    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, ..., -5:] = torch.finfo(BF16).min
    g = torch.randn(2, 4, 16, 8, dtype=torch.float64)
    base = Biased()
    errors = {}
    for name in ("float64", "eager", "pullback"):
        model = copy.deepcopy(base).to(torch.float64 if name == "float64" else BF16)
        dt = next(model.parameters()).dtype
        xs = [t.to(dt).requires_grad_() for t in (q, k, v)]
        args = (*xs, mask.to(dt))
        f = model
        if name == "pullback":
            f = pb_compile(model, args, target=target) if route == "compile" else \
                torch.compile(model, backend=functools.partial(pullback_backend, target=target))
        f(*args).backward(g.to(dt))
        grads = [x.grad.double() for x in xs] + [model.bias.grad.double()]
        if name == "float64":
            exact = grads
        else:
            errors[name] = [float((a - e).norm() / e.norm()) for a, e in zip(grads, exact)]
    for ours, theirs in zip(errors["pullback"], errors["eager"]):
        assert ours <= 1.05 * theirs, errors


def test_bfloat16_llama_on_a_padded_batch_trains_like_eager(target):
    """A bfloat16 Llama on a left-padded batch: Hugging Face's sdpa attention gets a boolean mask (causal and
    padding), which reaches ATen's flash kernels as the fused attention's bias: on the torch target the loss and
    every gradient are eager's bits (before, the masked attention was written out in float32: the loss a few
    bits off), elsewhere as close to float64's as eager's."""
    from pullback.testing.torch_models import CausalLM

    torch.manual_seed(0)
    lm, _ = _llama()
    ids, mask = torch.randint(0, 128, (2, 16)), torch.ones(2, 16, dtype=torch.long)
    mask[1, :5] = 0
    _trains_like_eager(CausalLM(lm).to(BF16), (ids, ids, mask), (ids, ids, mask), target)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dropout_in_half_precision_gives_eagers_bits(target, dtype):
    """Eager's dropout multiplies by the scale rounded to the tensor's dtype (1/0.9 as bfloat16: 1.109375), forward
    and backward; computing in float32 with the exact scale and rounding once (bfloat16's opmath) was one unit in
    the last place off in about a quarter of the elements on numpy and torch."""
    torch.manual_seed(0)
    x = torch.randn(64, 64, dtype=dtype, requires_grad=True)
    g = torch.randn(64, 64, dtype=dtype)
    model = torch.nn.Dropout(0.1)
    compiled = pb_compile(model, (x,), target=target)
    grads = []
    for m in (model, compiled):
        torch.manual_seed(1)
        y = m(x)
        y.backward(g)
        grads.append((y.detach(), x.grad))
        x.grad = None
    (want, want_grad), (got, got_grad) = grads
    assert torch.equal(got, want) and torch.equal(got_grad, want_grad)
