"""What the PyTorch importer and the training integration do not take: one PullbackError each,
naming the value and saying what is supported (never an AttributeError or a torch traceback)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import pullback as pb

torch = pytest.importorskip("torch")

from pullback.frontend import from_torch, import_torch, main_inputs  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("shift", torch.zeros(2))

    def forward(self, x, k):
        return torch.tanh(self.lin(x)) * k + self.shift


X = torch.ones(2, 3)
K = torch.tensor(2.0)

# (id, second example input, words the message must contain)
BAD_INPUTS = [
    ("int", 3, ["input 1", "an int (3)", "tensors only", "torch.tensor"]),
    ("float", 2.5, ["input 1", "a float (2.5)", "tensors only"]),
    ("bool", True, ["input 1", "a bool", "tensors only"]),
    ("none", None, ["input 1", "NoneType", "tensors only"]),
    ("string", "two", ["input 1", "a str", "tensors only"]),
    ("list", [2.0], ["input 1", "a list", "tensors only"]),
    ("tuple", (K, K), ["input 1", "a tuple", "tensors only"]),
    ("numpy", np.float32(2.0), ["input 1", "float32", "tensors only"]),
    ("meta", torch.tensor(2.0, device="meta"), ["input 1", "device meta", "CPU tensors with data"]),
    ("float8", torch.tensor(2.0).to(torch.float8_e4m3fn), ["input 1", "float8_e4m3fn", "supported: float16", "complex64"]),
]


@pytest.mark.parametrize("k,words", [pytest.param(k, w, id=i) for i, k, w in BAD_INPUTS])
def test_importer_rejects_what_it_cannot_take(k, words):
    with pytest.raises(pb.PullbackError) as ei:
        from_torch(Scale(), (X, k))
    msg = str(ei.value)
    assert msg.startswith("from_torch: ") and all(w in msg for w in words), msg


# compile takes a tuple or list of tensors as its tensors, and one of numbers as a setting (a program each value)
COMPILE_BAD_INPUTS = [(i, k, w) for i, k, w in BAD_INPUTS if i not in ("list", "tuple")]


@pytest.mark.parametrize("k,words", [pytest.param(k, w, id=i) for i, k, w in COMPILE_BAD_INPUTS])
def test_compile_rejects_what_it_cannot_take(k, words):
    with pytest.raises(pb.PullbackError) as ei:
        pb_compile(Scale(), (X, k))
    assert all(w in str(ei.value) for w in words), str(ei.value)


@pytest.mark.parametrize("k,words", [pytest.param(k, w, id=i) for i, k, w in COMPILE_BAD_INPUTS])
def test_compiled_module_called_with_what_it_cannot_take(k, words):
    compiled = pb_compile(Scale(), (X, K))
    with pytest.raises(pb.PullbackError) as ei:
        compiled(X, k)
    msg = str(ei.value)
    assert msg.startswith("pullback.integrations.torch: ") and all(w in msg for w in words), msg


@pytest.mark.parametrize("what", ["parameter", "buffer"])
def test_meta_module_state(what):
    m = Scale()
    if what == "parameter":
        m.lin = m.lin.to("meta")
        name = "lin.weight"
    else:
        m.shift = torch.zeros(2, device="meta")
        name = "shift"
    with pytest.raises(pb.PullbackError) as ei:
        from_torch(m, (X, K))
    msg = str(ei.value)
    assert f"{what} {name} is on device meta" in msg and "load_state_dict" in msg, msg


def test_meta_example_input_and_module():
    with pytest.raises(pb.PullbackError, match="on device meta"):
        from_torch(Scale().to("meta"), (X.to("meta"), K.to("meta")))


def test_export_failure_is_one_error_without_torch_log_lines(capfd):
    with pytest.raises(pb.PullbackError, match="torch.export failed"):
        from_torch(Scale(), (torch.ones(2, 5), K))  # 5 features into Linear(3, 2)
    assert capfd.readouterr().err == ""


def test_a_branch_on_a_tensor_value_says_how_to_make_it_static(capfd):
    class Branch(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else -x

    with pytest.raises(pb.PullbackError, match=r"branches on a tensor's value.*layerdrop=0.*torch.where.*torch.cond.*backend=\"pullback\""):
        from_torch(Branch(), (torch.ones(2, 3),))
    assert capfd.readouterr().err == ""  # torch.export's partial graph dump is not passed on


@pytest.mark.parametrize("how", ["batch_norm", "cdist"])
def test_a_size_computed_from_values_that_export_cannot_take_says_how_to_mask_instead(how, capfd):
    """Rows selected by a boolean mask have a data-dependent count; batch_norm's batch size check and cdist ask
    about it. The error names that (not a branch) and the masked form that exports."""
    class Selected(torch.nn.Module):
        def forward(self, x, mask):
            rows = x[mask]
            if how == "batch_norm":
                return torch.nn.functional.batch_norm(rows, None, None, training=True).sum()
            return torch.cdist(rows, rows).sum()

    with pytest.raises(pb.PullbackError, match=r"a size computed from tensor values.*x\[mask\].*reduction='none'\) \* mask"
                                               r".*backend=\"pullback\""):
        from_torch(Selected(), (torch.randn(4, 3), torch.tensor([True, False, True, True])))
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("causal", [True, False])
def test_a_transformer_given_a_mask_without_its_causal_flag_imports_and_computes_what_eager_does(causal):
    """nn.Transformer compares a given tgt_mask with a causal one (a branch on values) only to pick an attention
    kernel: the importer uses the mask as given, a causal one or not, and the values and gradients are eager's."""
    torch.manual_seed(0)
    model = torch.nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True).double()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(3, dtype=torch.float64)
    if not causal:
        mask = torch.zeros(3, 3, dtype=torch.float64).masked_fill(torch.eye(3, dtype=torch.bool).roll(1, 0), float("-inf"))

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t = model

        def forward(self, a, b):
            return self.t(a, b, tgt_mask=mask).pow(2).sum()

    a, b = torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    m = Masked()
    prog = import_torch(m, (a, b))
    mod = pb.transform.FirstOrderGradient(mode="vjp", wrt=prog.inputs)(prog.mod)
    ag, bg = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    want = m(ag, bg)
    want.backward()
    out, (da, db) = pb.build(mod)["main_grad"](*main_inputs(prog, (a, b)), np.ones((), "float64"))
    np.testing.assert_allclose(out, want.item(), rtol=1e-12)
    np.testing.assert_allclose(da, ag.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db, bg.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_an_operator_with_value_dependent_shapes_says_what_to_use_instead():
    class CTC(torch.nn.Module):
        def forward(self, logits, targets):
            return torch.nn.functional.ctc_loss(logits.log_softmax(-1), targets, [5, 4], [2, 2])

    with pytest.raises(pb.PullbackError, match=r"shape depends on the values of its inputs.*torch.where.*_ctc_loss"):
        from_torch(CTC(), (torch.randn(5, 2, 4), torch.randint(1, 4, (2, 2))))


def test_torch_distributions_export_without_their_value_checks_and_train_like_eager(monkeypatch):
    """``Normal(mu, sigma)`` validates ``sigma > 0`` by a branch on values (``torch.distributions``' default):
    exported without it, the policy's loss and gradients are eager's; the default is restored afterwards."""
    torch.manual_seed(0)

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mu, self.log_sigma = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

        def forward(self, x, action):
            d = torch.distributions.Normal(self.mu(x), self.log_sigma(x).exp())
            return -d.log_prob(action).mean() - 0.01 * d.entropy().mean()

    model = Policy().double()
    x, action = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)  # torch's default
    compiled = pb_compile(copy.deepcopy(model), (x, action))
    assert torch.distributions.Distribution._validate_args is True
    got = compiled(x, action)
    got.backward()
    want = model(x, action)
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    for (name, p), q in zip(compiled.module.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-15, msg=name)
    with pytest.raises(ValueError, match="scale"):  # eager still validates
        torch.distributions.Normal(torch.zeros(1), -torch.ones(1))


def test_an_fft_imports_and_differentiates_like_eager():
    """FFTs were this page's example of a missing operator; they convert now (complex tensors)."""

    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs().sum()

    x = torch.randn(8, dtype=torch.float64, requires_grad=True)
    mod, _ = from_torch(Spectrum(), (x,))
    value, (dx,) = pb.build(pb.transform.FirstOrderGradient()(mod))["main_grad"](x.detach().numpy())
    Spectrum()(x).backward()
    np.testing.assert_allclose(value, Spectrum()(x).item(), rtol=1e-12)
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-10, atol=1e-12)


class _Softplus(torch.autograd.Function):
    """A Function whose backward is its forward's derivative (a memory-saving rewrite, like Bloom's GELU)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log1p(torch.exp(x))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)


class _Through(torch.nn.Module):
    """A linear layer, then the custom Function ``fn``, then a mean square loss."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.fn.apply(self.lin(x)).pow(2).mean()


def test_a_custom_autograd_function_whose_backward_is_the_derivative_imports_and_trains_like_eager():
    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    batches = [((torch.randn(4, 3),), None) for _ in range(3)]
    result = train_side_by_side(_Through(_Softplus), batches, lambda loss, _: loss, verbose=False)
    check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)


class _MaskedDropout(torch.autograd.Function):
    """A custom dropout (DeBERTa's XDropout): its forward draws a mask, its backward applies the saved mask."""

    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.3).to(x.dtype)
        ctx.save_for_backward(mask)
        return x * mask / 0.7

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask / 0.7


def test_a_custom_function_that_draws_is_checked_with_the_same_draws_and_trains_like_eager():
    """The check runs the Function's forward twice (with its backward, and differentiated by autograd): both
    runs draw the same mask, so a correct backward is not refused; the user's generator is left as it was."""
    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    model, x = _Through(_MaskedDropout), torch.randn(4, 3)
    state = torch.random.get_rng_state()
    prog = import_torch(model, (x,))
    assert [m.kind for m in prog.masks] == ["uniform"]
    assert torch.equal(torch.random.get_rng_state(), state)
    batches = [((torch.randn(4, 3),), None) for _ in range(3)]
    result = train_side_by_side(_Through(_MaskedDropout), batches, lambda loss, _: loss, verbose=False)
    check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)


class _MaskedSoftmax(torch.autograd.Function):
    """DeBERTa's XSoftmax: a softmax whose masked entries are zeroed in place; its backward is the derivative."""

    @staticmethod
    def forward(ctx, x, mask):
        out = torch.softmax(x.masked_fill(mask, -1e9), -1)
        out.masked_fill_(mask, 0.0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * (g - (g * y).sum(-1, keepdim=True)), None


class _MaskedAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return _MaskedSoftmax.apply(self.lin(x), x > 1.0).pow(2).sum()


def test_a_custom_function_that_writes_in_place_is_checked_and_trains_like_eager():
    """Autograd cannot differentiate the forward's in-place write as plain code; the check differentiates its
    functional form instead, and the Function trains like eager."""
    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    batches = [((torch.randn(4, 3) * 2,), None) for _ in range(3)]
    result = train_side_by_side(_MaskedAttention(), batches, lambda loss, _: loss, verbose=False)
    check_side_by_side(result, rtol=1e-6, atol=1e-6, verbose=False)


def test_torch_compile_backend_runs_a_custom_function_whose_backward_is_the_derivative_as_plain_code():
    """Dynamo keeps the Function's forward and backward graphs; the backend applies them again as a Function,
    which the importer runs as plain code when its backward is the derivative (a backward of its own is kept:
    tests/frontend/test_custom_vjp.py)."""
    import copy

    import pullback.integrations.dynamo_backend  # noqa: F401  (registers the backend)

    torch.manual_seed(0)
    model, x = _Through(_Softplus), torch.randn(4, 3)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="pullback")
    for m in (eager, compiled):
        m(x).backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


def test_a_converter_that_cannot_take_its_arguments_is_a_listed_problem(monkeypatch):
    """An argument form a converter does not handle (a TypeError inside it) is reported like an unsupported
    operator, with the source line, never a bare TypeError."""
    from pullback.frontend.aten_table import ATEN_TABLE

    def cannot(cx, *args, **kwargs):
        return args[0] < 0  # an Expr compared with an int

    monkeypatch.setitem(ATEN_TABLE, "aten.tanh.default", cannot)

    class Tanh(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x)

    with pytest.raises(pb.PullbackError, match=r"(?s)aten.tanh.default \(1 use\).*test_importer_errors.py:\d+.*"
                                               r"these arguments are not supported \(TypeError"):
        from_torch(Tanh(), (X,))


def test_an_operator_with_side_effects_is_named_with_its_line():
    class Printing(torch.nn.Module):
        def forward(self, a):
            torch.ops.aten._print("inverting")
            return torch.linalg.inv(a).sum()  # linalg's own error check (also an effect) is not the problem

    with pytest.raises(pb.PullbackError, match=r"side effects.*aten._print.default at .*test_importer_errors.py:\d+") as e:
        from_torch(Printing(), (torch.eye(3),))
    assert "_linalg_check_errors" not in str(e.value)


def test_a_decoder_compiles_without_its_cache_unless_asked_for_it():
    """A Hugging Face decoder returns its key/value cache (an object torch.export cannot return) unless
    ``use_cache=False``: the compiled module passes that when the call does not say, and a call asking for the
    cache is told to turn it off."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=32, n_embd=8, n_layer=1, n_head=2, n_positions=8, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    assert model.config.use_cache
    ids = torch.randint(0, 32, (2, 6))
    compiled = pb_compile(model, {"input_ids": ids, "labels": ids})
    for out in (compiled(input_ids=ids, labels=ids), compiled(labels=ids, input_ids=ids, use_cache=None),
                compiled(ids, labels=ids)):
        assert out.past_key_values is None
        torch.testing.assert_close(out.loss, model(input_ids=ids, labels=ids).loss)
    assert len(compiled._programs) == 1  # one program for the three calls (ids positional or by name)
    with pytest.raises(pb.PullbackError, match=r"key/value cache.*use_cache = False"):
        compiled(input_ids=ids, labels=ids, use_cache=True)


def test_a_head_taking_use_cache_through_kwargs_compiles_without_its_cache():
    """GraniteMoe's and Switch Transformers' heads take ``use_cache`` only through ``**kwargs`` and pass it to a
    decoder that returns its cache unless told not to: with ``use_cache`` in the model's config, the compiled
    module passes ``use_cache=False`` there too."""
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10)

        def forward(self, input_ids, labels=None, use_cache=None):
            h = self.emb(input_ids)
            cache = DynamicCache() if use_cache is None or use_cache else None
            if cache is not None:
                cache.update(h[:, None], h[:, None], 0)
            loss = torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())
            return {"loss": loss, "cache": cache}

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = transformers.GraniteMoeConfig()  # use_cache=True
            self.model = Decoder()

        def forward(self, input_ids, labels=None, **kwargs):
            return self.model(input_ids, labels=labels, **kwargs)

    torch.manual_seed(0)
    model, ids = Head(), torch.randint(0, 10, (2, 4))
    assert model.config.use_cache is True
    out = pb_compile(model, {"input_ids": ids, "labels": ids})(input_ids=ids, labels=ids)
    assert out["cache"] is None
    torch.testing.assert_close(out["loss"], model(input_ids=ids, labels=ids, use_cache=False)["loss"])


def test_a_keyword_input_that_is_not_a_tensor_is_named():
    """A list of numbers is a setting (a list of tensors would be its tensors): where the model needs a tensor, the
    export fails with eager's own error; a list mixing tensors and numbers names its leaf."""
    model = torch.nn.Linear(3, 2)
    compiled = pb_compile(model, {"input": torch.ones(1, 3)})
    with pytest.raises(pb.PullbackError, match=r"torch.export failed: TypeError: linear\(\): argument 'input'.*"
                                               r"must be Tensor, not list"):
        compiled(input=[1.0, 2.0, 3.0])
    with pytest.raises(pb.PullbackError, match=r"keyword input 'input\[1\]' is a float \(2.0\)"):
        compiled(input=[torch.ones(1, 3), 2.0])


@pytest.mark.parametrize("draw,which", [(lambda: float(np.random.rand()), "NumPy's generator"),
                                        (lambda: __import__("random").random(), "Python's random module")])
def test_a_forward_drawing_from_a_host_random_generator_is_refused_and_the_generator_left_alone(draw, which):
    """torch.export would keep the values drawn while tracing as constants (every step the same "random" mask,
    as Wav2Vec2's SpecAugment draws with np.random): an error naming the generator; its state is as before."""
    import random

    class HostRandom(torch.nn.Module):
        def forward(self, x):
            return x * draw()

    np.random.seed(3)
    random.seed(3)
    want_np, want_py = np.random.rand(), random.random()
    np.random.seed(3)
    random.seed(3)
    with pytest.raises(pb.PullbackError, match=rf"draws random numbers from {which}.*torch.rand"):
        from_torch(HostRandom(), (torch.ones(2),))
    assert (np.random.rand(), random.random()) == (want_np, want_py)


class _TwoLayers(torch.nn.Module):
    def __init__(self, hook_in_forward: bool = False):
        super().__init__()
        self.a, self.b, self.hook_in_forward = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1), hook_in_forward

    def forward(self, x):
        h = self.a(x)
        if self.hook_in_forward and h.requires_grad:
            h.register_hook(lambda g: g * 2)
        return self.b(torch.tanh(h)).pow(2).mean()


@pytest.mark.parametrize("register, where", [
    (lambda m: m.a.register_full_backward_hook(lambda mod, gi, go: (gi[0] * 3,)), "a"),
    (lambda m: m.b.register_full_backward_pre_hook(lambda mod, go: (go[0] * 7,)), "b"),
    (lambda m: m.register_full_backward_hook(lambda mod, gi, go: None), "the module itself"),
    (lambda m: torch.nn.modules.module.register_module_full_backward_hook(lambda mod, gi, go: None),
     r"every module \(torch.nn.modules.module.register_module_full_backward_hook\)"),
], ids=["full", "pre", "on-the-root", "global"])
def test_backward_hooks_are_refused_not_silently_skipped(register, where):
    """The compiled backward cannot call a module's backward hooks: they would not run (and a hook changing a
    gradient would be ignored, a wrong gradient), so the module is refused, naming where they are."""
    model = _TwoLayers()
    handle = register(model)
    try:
        with pytest.raises(pb.PullbackError, match=rf"backward hooks on {where} \(handle.remove\(\) removes one\); "
                                                   "pullback runs the backward as one compiled program"):
            from_torch(model, (torch.randn(4, 3),))
    finally:
        handle.remove()
    from_torch(model, (torch.randn(4, 3),))  # without them it imports


def test_a_tensor_hook_registered_in_forward_is_refused_with_its_line():
    with pytest.raises(pb.PullbackError, match=r"forward registers a gradient hook on a tensor \(Tensor.register_hook "
                                               r"at .*test_importer_errors.py:\d+\)"):
        from_torch(_TwoLayers(hook_in_forward=True), (torch.randn(4, 3),))


class _InputGradient(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        x = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(torch.tanh(self.lin(x)).sum(), x, create_graph=True)
        return g.square().sum()


def test_a_gradient_taken_in_forward_is_named_with_its_line_and_the_route_that_trains_it():
    """torch.export fails on it with a message about fake tensors in its constants (once misread as a `.data`
    write): the error names torch.autograd.grad, where it is called, and torch.compile."""
    with pytest.raises(pb.PullbackError, match=r"forward calls torch.autograd.grad \(at .*test_importer_errors.py:\d+\)"
                                               r".*gradient penalty.*torch.compile\(model, backend=\"pullback\"\)"):
        from_torch(_InputGradient(), (torch.randn(4, 4),))


def test_parameter_and_forward_hooks_run_as_in_eager():
    """Hooks that stay outside the compiled backward: a parameter's gradient hook (run by autograd when it
    accumulates the gradient) and forward hooks (traced with the forward)."""
    import copy

    from pullback.integrations.torch import compile as pb_compile

    torch.manual_seed(0)
    model = _TwoLayers()
    eager = copy.deepcopy(model)
    for m in (model, eager):
        m.a.weight.register_hook(lambda g: g * 5)
        m.b.register_forward_hook(lambda mod, inp, out: out * 2)
        m.a.register_forward_pre_hook(lambda mod, inp: (inp[0] + 1,))
    x = torch.randn(4, 3)
    eager(x).backward()
    pb_compile(model, (x,))(x).backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


@torch.library.custom_op("pullback_test::scaled_mm", mutates_args=())
def _scaled_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return a @ w


@_scaled_mm.register_fake
def _(a, w):
    return a.new_empty(a.shape[0], w.shape[1])


def test_a_librarys_custom_operator_is_named_with_what_to_do():
    """A ``torch.library`` custom op is opaque (its body and registered backward run in Python): the error names it,
    where it is called, and says what imports instead."""
    from pullback.frontend import UnsupportedOperatorError

    class M(torch.nn.Module):
        def forward(self, x):
            return _scaled_mm(x, torch.ones(3, 2)).sum()

    with pytest.raises(UnsupportedOperatorError, match=r"(?s)pullback_test\.scaled_mm\.default \(1 use\).*in forward"
                                                        r".*custom operator \(torch\.library\).*PyTorch operations"):
        import_torch(M(), (torch.randn(2, 3),))


class Normalized(torch.nn.Module):
    """RecurrentGemma's shape: a low-precision scalar buffer cast to the activations' dtype where it is used."""

    def __init__(self, dtype):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("normalizer", torch.tensor(32 ** 0.5).to(dtype), persistent=False)

    def forward(self, x):
        return (self.lin(x) * self.normalizer.type(x.dtype)).sum()


def test_a_buffer_of_an_unsupported_dtype_is_named_and_the_converted_module_trains_like_eager():
    torch.manual_seed(0)
    model, x = Normalized(torch.float8_e4m3fn), torch.randn(2, 4)
    with pytest.raises(pb.PullbackError, match=r"buffer normalizer has dtype torch.float8_e4m3fn.*module.float\(\)"):
        pb_compile(model, (x,))
    eager = copy.deepcopy(model)
    cm = pb_compile(model.float(), (x,))
    got, want = cm(x), eager(x)
    got.backward()
    want.backward()
    assert torch.equal(got, want)
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad, rtol=0, atol=0)


def test_a_bfloat16_buffer_trains_like_eager():
    torch.manual_seed(0)
    model, x = Normalized(torch.bfloat16), torch.randn(2, 4)
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (x,))
    got, want = cm(x), eager(x)
    got.backward()
    want.backward()
    assert torch.equal(got, want)
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad, rtol=0, atol=0)


def test_a_write_through_data_in_forward_is_told_what_to_write_instead():
    """torch.export cannot trace a forward that writes a parameter's ``.data`` (Gemma3n's AltUp clamps its
    coefficients so in training): the error says to write it under ``torch.no_grad()`` or use the Dynamo backend,
    and the same module written so compiles and trains like eager."""

    class Clamps(torch.nn.Module):
        def __init__(self, data: bool):
            super().__init__()
            self.data_write = data
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            if self.data_write:
                self.lin.weight.data.clamp_(-0.1, 0.1)
            else:
                with torch.no_grad():
                    self.lin.weight.clamp_(-0.1, 0.1)
            return self.lin(x).pow(2).sum()

    x = torch.randn(2, 4)
    with pytest.raises(pb.PullbackError, match=r"\.data.*torch\.no_grad\(\).*backend=\"pullback\""):
        pb_compile(Clamps(True), (x,))
    torch.manual_seed(0)
    model = Clamps(False)
    eager = copy.deepcopy(model)
    pb_compile(model, (x,))(x).backward()
    eager(x).backward()
    torch.testing.assert_close(model.lin.weight.grad, eager.lin.weight.grad)
    assert torch.equal(model.lin.weight, eager.lin.weight)
