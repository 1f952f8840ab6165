"""RecognizeOps: the decomposed tanh GELU (Hugging Face's gelu_new) becomes nn.gelu(approximate="tanh"), in
every operand order; near misses stay as they are; the importer applies it."""

import math

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.transform import FirstOrderGradient, RecognizeOps

from cleanup_util import assert_same_results, assert_valid, mod_of

K = math.sqrt(2.0 / math.pi)


def _mul(a, b, swap):
    return op.multiply(b, a) if swap else op.multiply(a, b)


def _add(a, b, swap):
    return op.add(b, a) if swap else op.add(a, b)


def new_gelu(x, swaps=(False,) * 7, cube="power", c=0.044715, k=K, half=0.5):
    """``0.5 x (1 + tanh(k (x + c x^3)))`` with each commutative call's operands optionally swapped."""
    s = iter(swaps)
    x3 = {"power": lambda: op.power(x, 3.0),
          "xx*x": lambda: op.multiply(op.multiply(x, x), x),
          "x*xx": lambda: op.multiply(x, op.multiply(x, x))}[cube]()
    inner = _add(x, _mul(x3, c, next(s)), next(s))
    t = op.tanh(_mul(inner, k, next(s)))
    return _mul(_mul(x, half, next(s)), _add(t, 1.0, next(s)), next(s))


def _pair(build_body, shape=(4, 6), dtype="float32"):
    x = pb.var("x", shape=shape, dtype=dtype)
    before = mod_of([x], build_body(x))
    x2 = pb.var("x", shape=shape, dtype=dtype)
    expected = mod_of([x2], op.nn.gelu(x2, approximate="tanh"))
    return before, expected


@pytest.mark.parametrize("swaps", [(False,) * 6, (True,) * 6, (True, False, True, False, True, False),
                                   (False, True, False, True, False, True)])
@pytest.mark.parametrize("cube", ["power", "xx*x", "x*xx"])
def test_decomposed_tanh_gelu_becomes_one_op(swaps, cube):
    before, expected = _pair(lambda x: new_gelu(x, swaps, cube))
    after = RecognizeOps()(before)
    pb.assert_structural_equal(after, expected)
    assert_valid(after)
    assert_same_results(before, after)
    assert RecognizeOps()(after) is after


def test_gelu_inside_a_program_keeps_the_rest_and_other_users_of_parts():
    x, w = pb.var("x", shape=(3, 5)), pb.var("w", shape=(5, 5))
    h = op.nn.dense(x, w)
    t_used_twice = op.tanh(op.multiply(op.add(h, op.multiply(op.power(h, 3.0), 0.044715)), K))
    g = op.multiply(op.multiply(h, 0.5), op.add(t_used_twice, 1.0))
    before = mod_of([x, w], pb.Tuple([op.exp(g), t_used_twice]))
    after = RecognizeOps()(before)
    calls = {n.op.name for n in pb.ir.traversal.post_order(after["main"].body) if isinstance(n, pb.Call) and hasattr(n.op, "name")}
    assert "nn.gelu" in calls and "tanh" in calls  # the tanh is still computed for its other user
    assert_same_results(before, after)


@pytest.mark.parametrize("change", [dict(c=0.04), dict(k=0.8), dict(half=0.25)])
def test_other_constants_are_not_gelu(change):
    x = pb.var("x", shape=(4, 6))
    before = mod_of([x], new_gelu(x, **change))
    assert RecognizeOps()(before) is before


def test_a_different_cube_or_a_broadcasting_constant_is_not_gelu():
    x, y = pb.var("x", shape=(4, 6)), pb.var("y", shape=(4, 6))
    x3 = op.power(y, 3.0)  # y^3, not x^3
    body = op.multiply(op.multiply(x, 0.5),
                       op.add(op.tanh(op.multiply(op.add(x, op.multiply(x3, 0.044715)), K)), 1.0))
    before = mod_of([x, y], body)
    assert RecognizeOps()(before) is before
    x = pb.var("x", shape=(6,))
    wide = pb.const(np.full((4, 6), 0.5, "float32"))  # broadcasts x: the result is not x's type
    body = op.multiply(op.multiply(x, wide), op.add(op.tanh(op.multiply(
        op.add(x, op.multiply(op.power(x, 3.0), 0.044715)), K)), 1.0))
    before = mod_of([x], body)
    assert RecognizeOps()(before) is before


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gradient_of_the_recognized_op_matches_the_formula(dtype):
    before, _ = _pair(lambda x: op.sum(new_gelu(x) * x), shape=(3, 7), dtype=dtype)
    after = RecognizeOps()(before)
    x = np.random.default_rng(3).standard_normal((3, 7)).astype(dtype) * 3
    want = pb.build(FirstOrderGradient()(before))["main_grad"](x)
    got = pb.build(FirstOrderGradient()(after))["main_grad"](x)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[0], want[0], **tol)
    np.testing.assert_allclose(got[1][0], want[1][0], **tol)


def test_the_importer_recognizes_hugging_faces_gelu_new():
    torch = pytest.importorskip("torch")
    from pullback.frontend import from_torch

    class NewGELU(torch.nn.Module):  # transformers.activations.NewGELUActivation
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    m = torch.nn.Sequential(torch.nn.Linear(8, 8), NewGELU())
    x = torch.randn(4, 8)
    mod, params = from_torch(m, (x,))
    names = [n.op.name for n in pb.ir.traversal.post_order(mod["main"].body) if isinstance(n, pb.Call) and hasattr(n.op, "name")]
    assert "nn.gelu" in names and "tanh" not in names and "power" not in names
    args = [x.numpy()] + [params[p.name_hint] for p in mod["main"].params[1:]]
    np.testing.assert_allclose(pb.build(mod)["main"](*args), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_recognized_gelu_new_trains_like_pytorch_autograd_in_float64():
    """The imported module's loss gradient (through nn.gelu's rule) equals PyTorch autograd of the Python formula."""
    torch = pytest.importorskip("torch")
    from pullback.frontend import from_torch

    class NewGELU(torch.nn.Module):
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 6), NewGELU()).double()
    x = torch.randn(5, 6, dtype=torch.float64) * 2
    mod, params = from_torch(m, (x,))
    assert any(isinstance(n, pb.Call) and getattr(n.op, "name", "") == "nn.gelu"
               for n in pb.ir.traversal.post_order(mod["main"].body))
    names = [p.name_hint for p in mod["main"].params]
    body = mod["main"].body
    loss = pb.IRModule.from_expr(pb.Function(mod["main"].params, op.sum(op.multiply(body, body))))
    grads = pb.build(FirstOrderGradient()(loss))["main_grad"](x.numpy(), *[params[n] for n in names[1:]])[1]
    (m(x) ** 2).sum().backward()
    want = [p.grad.numpy() for p in m.parameters()]  # weight, bias: the order of @main's parameters
    for got, w in zip(grads[1:], want):
        np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-12)


def _eager_attention(q, k, v, scale_kind, dtype="float32", mask=None):
    """Hugging Face's eager attention as the importer lowers it: two 4-D matmuls through 3-D batch_matmul, a
    constant scale (``* c``, ``c *``, ``/ c`` or none), an additive ``mask`` (``s + mask``; ``mask + s`` when
    the scale is ``c *``) and a softmax over the last axis."""
    b, h, length, e = q.checked_type.shape
    keys = k.checked_type.shape[2]
    kt = op.reshape(op.transpose(k, (0, 1, 3, 2)), (-1, e, keys))
    s = op.reshape(op.nn.batch_matmul(op.reshape(q, (-1, length, e)), kt, transpose_b=False), (b, h, length, keys))
    c = pb.const(0.25, dtype)
    s = {"mul": lambda: op.multiply(s, c), "rmul": lambda: op.multiply(c, s), "div": lambda: op.divide(s, pb.const(4.0, dtype)),
         "none": lambda: s}[scale_kind]()
    if mask is not None:
        s = op.add(mask, s) if scale_kind == "rmul" else op.add(s, mask)
    p = op.reshape(op.nn.softmax(s, axis=-1), (-1, length, keys))
    ev = v.checked_type.shape[3]
    return op.reshape(op.nn.batch_matmul(p, op.reshape(v, (-1, keys, ev)), transpose_b=False), (b, h, length, ev))


def _qkv(dtype="float32", shapes=((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4))):
    return [pb.var(n, shape=s, dtype=dtype) for n, s in zip("qkv", shapes)]


@pytest.mark.parametrize("scale_kind", ["mul", "rmul", "div", "none"])
def test_eager_attention_becomes_one_op_with_the_same_results_and_gradients(scale_kind):
    """Two matmuls with a softmax between (no mask, no dropout) become ``nn.attention``, whose backward recomputes
    the probabilities: the results and every gradient equal the formula's."""
    q, k, v = _qkv("float64")
    before = mod_of([q, k, v], _eager_attention(q, k, v, scale_kind, "float64"))
    after = RecognizeOps()(before)
    calls = [n.op.name for n in pb.ir.traversal.post_order(after["main"].body) if isinstance(n, pb.Call) and hasattr(n.op, "name")]
    assert "nn.attention" in calls and "nn.softmax" not in calls and "nn.batch_matmul" not in calls
    att = next(n for n in pb.ir.traversal.post_order(after["main"].body) if isinstance(n, pb.Call) and getattr(n.op, "name", "") == "nn.attention")
    assert att.attrs.scale == {"none": 1.0}.get(scale_kind, 0.25)
    assert_valid(after)
    assert_same_results(before, after)
    loss = lambda m: pb.IRModule.from_expr(pb.Function(m["main"].params, op.sum(op.multiply(m["main"].body, m["main"].body))))  # noqa: E731
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(x.checked_type.shape) for x in (q, k, v)]
    want = pb.build(FirstOrderGradient()(loss(before)))["main_grad"](*args)[1]
    got = pb.build(FirstOrderGradient()(loss(after)))["main_grad"](*args)[1]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scale_kind", ["mul", "rmul", "div"])
@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 7), (2, 3, 5, 7)])
def test_masked_eager_attention_becomes_one_op_with_the_same_results_and_gradients(scale_kind, mask_shape):
    """An additive mask between the scale and the softmax (Hugging Face's eager attention over a padded batch) is
    ``nn.attention``'s bias: the results and the gradients, the mask's included, equal the formula's."""
    q, k, v = _qkv("float64")
    mask = pb.var("mask", shape=mask_shape, dtype="float64")
    before = mod_of([q, k, v, mask], _eager_attention(q, k, v, scale_kind, "float64", mask))
    after = RecognizeOps()(before)
    calls = [n for n in pb.ir.traversal.post_order(after["main"].body) if isinstance(n, pb.Call) and hasattr(n.op, "name")]
    assert [len(n.args) for n in calls if n.op.name == "nn.attention"] == [4]
    assert not [n for n in calls if n.op.name in ("nn.softmax", "nn.batch_matmul")]
    assert_valid(after)
    assert_same_results(before, after)
    loss = lambda m: pb.IRModule.from_expr(pb.Function(m["main"].params, op.sum(op.multiply(m["main"].body, m["main"].body))))  # noqa: E731
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(x.checked_type.shape) for x in (q, k, v, mask)]
    args[3][0, ..., 4:] = -1e9  # padding: the first sample's last keys masked
    want = pb.build(FirstOrderGradient()(loss(before)))["main_grad"](*args)[1]
    got = pb.build(FirstOrderGradient()(loss(after)))["main_grad"](*args)[1]
    assert len(got) == 4
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask_of, fused", [("w", False), ("stop_gradient(w)", True), ("pad", True), ("frozen", True)])
def test_attention_whose_mask_a_learnable_parameter_reaches_keeps_its_form(mask_of, fused):
    """A mask that a parameter of ``learnable`` reaches through floating-point values (a learnt position bias):
    the gradient needs the probabilities, so the attention keeps eager's form; a mask from an integer padding
    mask, through ``stop_gradient``, or from a parameter not named learnable is fused."""
    q, k, v = _qkv()
    w, pad = pb.var("w", shape=(2, 3, 5, 7)), pb.var("pad", shape=(2, 1, 1, 7), dtype="int64")
    padding = op.multiply(op.cast(pad, "float32"), pb.const(-1e9, "float32"))
    source = {"w": w, "stop_gradient(w)": op.stop_gradient(w), "pad": None, "frozen": w}[mask_of]
    mask = padding if source is None else op.add(op.multiply(source, pb.const(0.5, "float32")), padding)
    before = mod_of([q, k, v, w, pad], _eager_attention(q, k, v, "mul", mask=mask))
    after = RecognizeOps(frozenset({"pad"} if mask_of == "frozen" else {"w", "pad"}))(before)
    assert ("nn.attention" in pb.astext(after)) == fused
    assert_same_results(before, after)


@pytest.mark.parametrize("fill, causal, biased", [(-np.inf, True, False), (np.finfo(np.float32).min, True, False),
                                                  (-1e9, False, True), (0.0, False, False)])
def test_eager_attention_under_a_constant_causal_mask_is_causal_attention(fill, causal, biased):
    """A mask from constants keeping exactly the lower triangle (0 there, -inf or float32's least value elsewhere:
    Hugging Face's eager attention under export) -> ``nn.attention(is_causal=True)`` without a bias; another fill
    keeps it the bias, and a mask of zeros everywhere is no bias at all. The results are the formula's."""
    q, k, v = _qkv(shapes=((2, 3, 5, 4),) * 3)
    tril = pb.const(np.tril(np.ones((5, 5), dtype=bool)))
    mask = op.broadcast_to(op.where(tril, pb.const(0.0, "float32"), pb.const(fill, "float32")), (2, 1, 5, 5))
    before = mod_of([q, k, v], _eager_attention(q, k, v, "mul", mask=mask))
    after = RecognizeOps()(before)
    (att,) = [n for n in pb.ir.traversal.post_order(after["main"].body) if isinstance(n, pb.Call) and getattr(n.op, "name", "") == "nn.attention"]
    assert att.attrs.is_causal == causal and len(att.args) == 3 + biased
    assert_same_results(before, after)


def _alibi_attention(q, k, v, alibi, mask, scale_after=False):
    """Bloom's eager attention as the importer lowers it: ``baddbmm(alibi, q, k^T, alpha=0.25)`` over the
    flattened heads (the flattened keys transposed), reshaped to 4-D, then the mask added, a softmax, the values;
    ``scale_after``: the scale applied to the 4-D sum instead (another formula)."""
    b, h, length, e = q.checked_type.shape
    keys = k.checked_type.shape[2]
    kt = op.transpose(op.reshape(k, (-1, keys, e)), (0, 2, 1))
    qk = op.nn.batch_matmul(op.reshape(q, (-1, length, e)), kt, transpose_b=False)
    c = pb.const(0.25, "float64")
    s = op.reshape(op.add(alibi, qk if scale_after else op.multiply(qk, c)), (b, h, length, keys))
    s = op.add(op.multiply(s, c) if scale_after else s, mask)
    p = op.reshape(op.nn.softmax(s, axis=-1), (-1, length, keys))
    return op.reshape(op.nn.batch_matmul(p, op.reshape(v, (-1, keys, e)), transpose_b=False), (b, h, length, e))


@pytest.mark.parametrize("mask_kind", ["causal", "padding", "scaled_after"])
def test_alibi_attention_becomes_one_op_with_the_same_results_and_gradients(mask_kind):
    """A bias added to the flattened scores before they are reshaped (Bloom's ALiBi, (B*H, 1, S)) joins the mask
    as ``nn.attention``'s bias: under the constant causal mask the ALiBi alone, with ``is_causal``; under a padding
    mask their sum. The results and the float64 gradients equal the formula's. A scale applied after the bias is
    another formula and stays."""
    q, k, v = _qkv("float64", shapes=((2, 3, 5, 4),) * 3)
    alibi = pb.var("alibi", shape=(6, 1, 5), dtype="float64")
    tril = pb.const(np.tril(np.ones((5, 5), dtype=bool)))
    fill = pb.const(np.finfo(np.float64).min, "float64")
    pad = pb.var("pad", shape=(2, 1, 5, 5), dtype="float64")
    mask = op.broadcast_to(op.where(tril, pb.const(0.0, "float64"), fill), (2, 1, 5, 5)) if mask_kind == "causal" else pad
    body = _alibi_attention(q, k, v, alibi, mask, scale_after=mask_kind == "scaled_after")
    params = [q, k, v, alibi] + ([] if mask_kind == "causal" else [pad])
    before = mod_of(params, body)
    after = RecognizeOps()(before)
    atts = [n for n in pb.ir.traversal.post_order(after["main"].body) if isinstance(n, pb.Call) and getattr(n.op, "name", "") == "nn.attention"]
    if mask_kind == "scaled_after":
        assert not atts
        return
    (att,) = atts
    assert att.attrs.is_causal == (mask_kind == "causal") and len(att.args) == 4 and att.attrs.scale == 0.25
    assert "nn.softmax" not in pb.astext(after)
    assert_valid(after)
    assert_same_results(before, after)
    loss = lambda m: pb.IRModule.from_expr(pb.Function(m["main"].params, op.sum(op.multiply(m["main"].body, m["main"].body))))  # noqa: E731
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(x.checked_type.shape) for x in params]
    if mask_kind == "padding":
        args[4][1, ..., :2] = -1e9  # the second sample's first keys padded
    want = pb.build(FirstOrderGradient()(loss(before)))["main_grad"](*args)[1]
    got = pb.build(FirstOrderGradient()(loss(after)))["main_grad"](*args)[1]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_eager_attention_over_a_left_padded_batch_trains_like_eager(target):
    """Hugging Face's eager attention over a left-padded batch: a padded query sees no key, its whole row is the
    mask's least value, and eager's softmax spreads it over every key (the labels of the next position read it).
    Fused, its log-sum-exp has lost the sum: the backward normalises such rows again and training matches eager."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pullback.integrations.torch import check_side_by_side, train_side_by_side
    from pullback.integrations.torch import compile as pb_compile

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=100, attn_implementation="eager")

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = transformers.LlamaForCausalLM(cfg)

        def forward(self, ids, mask, labels):
            return self.lm(input_ids=ids, attention_mask=mask, labels=labels).loss

    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :5] = 0
    batches = []
    for _ in range(3):
        ids = torch.randint(0, 100, (2, 12))
        batches.append(((ids, mask, ids.masked_fill(mask == 0, -100)), None))
    model = LM()
    (tp,) = pb_compile(model, batches[0][0], target=target)._programs.values()
    assert "nn.attention(" in pb.astext(tp.mod["main_fwd"])
    result = train_side_by_side(model, batches, lambda loss, _: loss, lr=0.05, target=target, verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-5, verbose=False)


@pytest.mark.parametrize("name", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("detached", [False, True])
def test_a_softmax_of_its_input_less_its_maximum_is_the_softmax_of_its_input(name, detached):
    """``softmax(x - max(x))`` over the same axis (a hand-written stable softmax, GPT-OSS's attention sinks) is
    ``softmax(x)``: the same values bit for bit, and the same gradient without the maximum's (zero in exact
    arithmetic: a comparison, a count and a division over all of x)."""
    x = pb.var("x", shape=(3, 4, 5), dtype="float64")
    f = getattr(op.nn, name.split(".")[1])
    m = op.max(x, axis=(-1,), keepdims=True)
    before = mod_of([x], op.multiply(f(op.subtract(x, op.stop_gradient(m) if detached else m), axis=2), x))
    after = RecognizeOps()(before)
    pb.assert_structural_equal(after, mod_of([x], op.multiply(f(x, axis=2), x)))
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((3, 4, 5)) * 30
    for target in ("numpy", "torch"):
        want, got = (np.asarray(pb.build(mod, target=target)["main"](xs)) for mod in (before, after))
        np.testing.assert_array_equal(got, want)
    loss = lambda mod: pb.IRModule.from_expr(pb.Function(mod["main"].params, op.sum(mod["main"].body)))  # noqa: E731
    want = pb.build(FirstOrderGradient()(loss(before)))["main_grad"](xs)[1][0]
    got = pb.build(FirstOrderGradient()(loss(after)))["main_grad"](xs)[1][0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["other_axis", "other_tensor", "no_keepdims_broadcast", "two_axes"])
def test_other_shifts_before_a_softmax_are_kept(case):
    x, y = pb.var("x", shape=(3, 4, 5)), pb.var("y", shape=(3, 4, 5))
    m = {"other_axis": op.max(x, axis=(1,), keepdims=True), "other_tensor": op.max(y, axis=(2,), keepdims=True),
         "no_keepdims_broadcast": op.expand_dims(op.max(x, axis=(2,)), 2),
         "two_axes": op.max(x, axis=(1, 2), keepdims=True)}[case]
    before = mod_of([x, y], op.nn.softmax(op.subtract(x, m), axis=2))
    assert RecognizeOps()(before) is before


def test_bfloat16_masked_or_other_attention_keeps_its_form():
    """bfloat16 keeps eager's roundings (its form); a ``where`` mask between the scale and the softmax, an added
    mask of another rank than 4, a softmax over another axis, or keys and
    values of other shapes are not this attention."""
    q, k, v = _qkv("bfloat16")
    cases = [mod_of([q, k, v], _eager_attention(q, k, v, "mul", "bfloat16"))]
    q, k, v = _qkv(shapes=((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6)))
    cases.append(mod_of([q, k, v], _eager_attention(q, k, v, "mul")))
    q, k, v = _qkv()
    for mask in (pb.var("m", shape=(3, 5, 7)), pb.var("m", shape=(5, 7))):
        cases.append(mod_of([q, k, v, mask], _eager_attention(q, k, v, "mul", mask=mask)))
    s = op.reshape(op.nn.batch_matmul(op.reshape(q, (-1, 5, 4)), op.reshape(k, (-1, 7, 4)), transpose_b=True), (2, 3, 5, 7))
    masked = op.where(pb.const(np.tril(np.ones((5, 7), dtype=bool))), s, pb.const(-1e9, "float32"))
    for scores, axis in ((masked, -1), (s, 2)):
        p = op.reshape(op.nn.softmax(scores, axis=axis), (-1, 5, 7))
        cases.append(mod_of([q, k, v], op.nn.batch_matmul(p, op.reshape(v, (-1, 7, 4)), transpose_b=False)))
    for before in cases:
        assert RecognizeOps()(before) is before


def test_hugging_faces_eager_attention_is_recognized_and_keeps_no_probabilities():
    """A Hugging Face BertLayer built directly runs eager attention; imported, it is ``nn.attention``, and its
    training program keeps no (L, S) probabilities for the backward."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pullback.integrations.torch import compile as pb_compile
    from pullback.testing.torch_models import make_workload

    wl = make_workload("bert", small=True)
    (tp,) = pb_compile(wl.model, wl.example_inputs, target="numpy")._programs.values()
    calls = [n.op.name for n in pb.ir.traversal.post_order(tp.prog.main.body) if isinstance(n, pb.Call) and hasattr(n.op, "name")]
    assert "nn.attention" in calls and "nn.softmax" not in calls
    length = wl.example_inputs[0].shape[1]
    residuals = tp.mod["main_fwd"].checked_type.ret_type.fields[1].fields
    assert not [t for t in residuals if tuple(t.shape[-2:]) == (length, length)]


def test_hugging_faces_eager_attention_over_a_padded_batch_is_recognized_and_trains_like_eager():
    """A Hugging Face BertModel with eager attention and a padded batch adds its extended attention mask to the
    scores: recognized, the mask is ``nn.attention``'s bias; no per-head (L, S) probabilities are kept and training
    matches eager's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from pullback.integrations.torch import check_side_by_side, train_side_by_side
    from pullback.integrations.torch import compile as pb_compile

    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  vocab_size=100, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                  attn_implementation="eager")

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = transformers.BertModel(cfg)

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state.pow(2).mean()

    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, -4:] = 0
    batches = [((torch.randint(0, 100, (2, 12)), mask), None) for _ in range(3)]
    model = Encoder()
    (tp,) = pb_compile(model, batches[0][0], target="numpy")._programs.values()
    calls = [n for n in pb.ir.traversal.post_order(tp.prog.main.body) if isinstance(n, pb.Call) and hasattr(n.op, "name")]
    assert [len(n.args) for n in calls if n.op.name == "nn.attention"] == [4, 4]
    assert not [n for n in calls if n.op.name == "nn.softmax"]
    residuals = tp.mod["main_fwd"].checked_type.ret_type.fields[1].fields
    assert not [t for t in residuals if tuple(t.shape[-3:]) == (4, 12, 12)], residuals
    result = train_side_by_side(model, batches, lambda loss, _: loss, lr=0.05, target="numpy", verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-5, verbose=False)
