"""PartitionForwardBackward: main_fwd then main_bwd equals main_grad, for both policies."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import analysis, op, transform
from pullback.ir.expr import If, TupleGetItem
from pullback.ir.traversal import count_calls, post_order
from pullback.ops import FusionKind, Recompute, get_op

HEAVY = ["nn.dense", "nn.matmul", "nn.batch_matmul", "nn.conv2d", "sum", "mean", "nn.softmax", "nn.layer_norm"]


def mlp_module():
    x = pullback.var("x", shape=(4, 6))
    w1 = pullback.var("w1", shape=(8, 6))
    w2 = pullback.var("w2", shape=(3, 8))
    h = op.tanh(op.exp(op.nn.dense(x, w1)) * pullback.const(0.5))
    y = op.nn.softmax(op.nn.dense(op.nn.relu(h) + h, w2))
    return pullback.IRModule.from_expr(pullback.Function([x, w1, w2], y))


def grad_module(mod):
    return transform.standard_cleanup()(transform.FirstOrderGradient(mode="vjp")(mod))


def flat(value) -> list:
    """The arrays of a value nested in tuples, in order."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        else:
            out.append(np.asarray(v))
    return out


def check_equal(mod, inputs, ct):
    exe = pullback.build(mod)
    out, grads = exe["main_grad"](*inputs, ct)
    fwd_out, residuals = exe["main_fwd"](*inputs)
    assert len(residuals) == len(mod["main_bwd"].params) - 1
    for a, b in zip(flat(fwd_out), flat(out), strict=True):
        np.testing.assert_array_equal(a, b)
    bwd = exe["main_bwd"](*residuals, ct)
    assert len(bwd) == len(grads)
    for a, b in zip(flat(bwd), flat(grads), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("policy", ["save_all", "min_cut"])
def test_fwd_bwd_equals_grad(policy):
    mod = grad_module(mlp_module())
    pm = transform.PartitionForwardBackward(policy=policy)(mod)
    fwd, bwd, grad = pm["main_fwd"], pm["main_bwd"], pm["main_grad"]
    assert [p.name_hint for p in fwd.params] == ["x", "w1", "w2"]
    assert bwd.params[-1].name_hint == "ct"
    assert fwd.ret_type.fields[0] == grad.ret_type.fields[0]
    assert bwd.ret_type == grad.ret_type.fields[1]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in ((4, 6), (8, 6), (3, 8))]
    check_equal(pm, inputs, rng.standard_normal((4, 3)).astype("float32"))


def test_save_all_rebuilds_copies_of_parameters_and_keeps_their_views():
    """``save_all`` saves every forward value the backward reads, but for the torch and jax targets a copy that
    only moves a parameter's data (a weight's centre tap, sliced and reshaped) is rebuilt in the backward from
    the parameter, which the caller holds anyway (for numpy, slower to gather, it stays saved); a view of a
    parameter (a transposed input) holds no memory and stays saved."""
    x, w, v = pullback.var("x", shape=(4, 8)), pullback.var("w", shape=(6, 8, 3)), pullback.var("v", shape=(6, 5))
    tap = op.reshape(op.strided_slice(w, begin=[0, 0, 1], end=[6, 8, 2]), newshape=(6, 8))
    y = op.nn.dense(op.tanh(op.nn.dense(x, tap)), op.transpose(v))
    mod = grad_module(pullback.IRModule.from_expr(pullback.Function([x, w, v], y)))
    kept = transform.PartitionForwardBackward(policy="save_all")(mod)  # target numpy
    assert not analysis.recomputed_calls(kept) and w not in kept["main_fwd"].body.fields[1].fields
    pm = transform.PartitionForwardBackward(policy="save_all", target="torch")(mod)
    residuals = pm["main_fwd"].body.fields[1].fields
    calls = [r for r in residuals if not isinstance(r, pullback.Var)]
    assert w in residuals and not [r for r in calls if r.op.name in ("strided_slice", "reshape")]
    assert [r for r in calls if r.op.name == "transpose" and r.args[0] is x]  # x's transpose: a view, saved
    assert analysis.recomputed_calls(pm) == {"strided_slice": 1, "reshape": 1}
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in ((4, 8), (6, 8, 3), (6, 5))]
    check_equal(pm, inputs, rng.standard_normal((4, 5)).astype("float32"))


def test_min_cut_recomputes_only_cheap_ops_and_saves_less():
    mod = grad_module(mlp_module())
    save_all = transform.PartitionForwardBackward(policy="save_all")(mod)
    min_cut = transform.PartitionForwardBackward(policy="min_cut")(mod)
    assert analysis.saved_bytes(min_cut) < analysis.saved_bytes(save_all)
    # the backward never recomputes matmuls, reductions or opaque ops
    assert count_calls(min_cut["main_bwd"].body, HEAVY) == count_calls(save_all["main_bwd"].body, HEAVY)
    # ... but does recompute elementwise ops (tanh/exp/relu) the forward also computes
    assert count_calls(min_cut["main_bwd"].body, ["tanh", "exp", "nn.relu", "multiply"]) > \
        count_calls(save_all["main_bwd"].body, ["tanh", "exp", "nn.relu", "multiply"])


def test_registered_by_name_and_names():
    mod = grad_module(mlp_module())
    pm = transform.get_pass("PartitionForwardBackward")(mod)  # registered with the defaults: save_all
    assert {"main", "main_grad", "main_fwd", "main_bwd"} <= set(pm)
    with pytest.raises(pullback.PassError, match="policy"):
        transform.PartitionForwardBackward(policy="greedy")


def test_rejects_grad_mode_function():
    mod = transform.FirstOrderGradient(mode="grad")(mlp_module())
    with pytest.raises(pullback.PassError, match="vjp"):
        transform.PartitionForwardBackward()(mod)


def test_saved_bytes_rejects_non_forward_function():
    with pytest.raises(pullback.PullbackError, match="residuals"):
        analysis.saved_bytes(mlp_module(), "main")


def test_transformer_layer_min_cut_saves_no_more_than_save_all():
    torch = pytest.importorskip("torch")
    from pullback.frontend import import_torch, main_inputs

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True).train()
    x = torch.randn(2, 6, 16)
    prog = import_torch(layer, (x,))
    wrt = [prog.inputs[0]] + prog.trainable
    mod = transform.standard_cleanup()(transform.FirstOrderGradient(mode="vjp", wrt=wrt)(prog.mod))
    sizes = {}
    rng = np.random.default_rng(0)
    masks = [(rng.random(m.shape) > m.rate).astype("float32") for m in prog.masks]
    for policy in ("save_all", "min_cut"):
        pm = transform.PartitionForwardBackward(policy=policy)(mod)
        sizes[policy] = analysis.saved_bytes(pm)
        check_equal(pm, main_inputs(prog, (x,), masks), rng.standard_normal((2, 6, 16)).astype("float32"))
    assert 0 < sizes["min_cut"] <= sizes["save_all"]


# ------------------------------------------------------------------ options, metadata, saved bytes


def test_bad_options_are_pass_errors():
    with pytest.raises(pullback.PassError, match="target"):
        transform.PartitionForwardBackward(policy="min_cut", target="tpu")
    with pytest.raises(pullback.PassError, match="recompute_ns_per_byte"):
        transform.PartitionForwardBackward(policy="min_cut", recompute_ns_per_byte=-1.0)


def test_heavy_ops_are_never_recomputable():
    from pullback.ops import FusionKind, list_ops

    heavy = (FusionKind.OUT_ELEMWISE_FUSABLE, FusionKind.COMM_REDUCE, FusionKind.OPAQUE)
    assert all(o.recompute is Recompute.NEVER for o in list_ops() if o.pattern in heavy)
    assert {get_op(n).recompute for n in ("reshape", "transpose", "squeeze", "broadcast_to")} == {Recompute.VIEW}
    assert {get_op(n).recompute for n in ("add", "multiply", "exp", "tanh", "nn.relu", "where")} == {Recompute.CHEAP}
    assert {get_op(n).recompute for n in ("erf", "nn.gelu", "sigmoid", "nn.silu")} == {Recompute.SPECIAL}


def test_saved_bytes_with_and_without_parameters():
    mod = grad_module(mlp_module())
    pm = transform.PartitionForwardBackward(policy="min_cut")(mod)
    fwd = pm["main_fwd"]
    residuals = fwd.body.fields[1].fields
    params = [r for r in residuals if r in fwd.params]
    assert params  # the weights the dense gradients read are saved as they are (free)
    param_bytes = sum(analysis.type_bytes(p.checked_type) for p in params)
    assert analysis.saved_bytes(pm) - analysis.saved_bytes(pm, inputs=False) == param_bytes


def test_parameters_are_saved_rather_than_their_transposes():
    mod = grad_module(mlp_module())
    save_all = transform.PartitionForwardBackward(policy="save_all")(mod)
    min_cut = transform.PartitionForwardBackward(policy="min_cut")(mod)
    assert count_calls(save_all["main_fwd"].body.fields[1], ["transpose"]) > 0
    assert count_calls(min_cut["main_fwd"].body.fields[1], ["transpose"]) == 0
    assert analysis.saved_bytes(min_cut, inputs=False) < analysis.saved_bytes(save_all, inputs=False)


# ------------------------------------------------------------------ If


def if_module():
    c = pullback.var("c", shape=(), dtype="bool")
    x, w = pullback.var("x", shape=(4, 6)), pullback.var("w", shape=(5, 6))
    h = op.nn.dense(x, w)
    e = op.exp(h)
    y = If(c, op.multiply(op.tanh(e), e), op.sigmoid(op.add(h, h)))
    return pullback.IRModule.from_expr(pullback.Function([c, x, w], op.multiply(y, op.nn.relu(h))))


@pytest.mark.parametrize("opts", [dict(policy="save_all"), dict(policy="min_cut"), dict(policy="min_cut", target="torch"),
                                  dict(policy="min_cut", recompute_ns_per_byte=float("inf"))])
@pytest.mark.parametrize("cond", [True, False])
def test_if_fwd_bwd_equals_grad(opts, cond):
    mod = grad_module(if_module())
    assert any(isinstance(n, If) for n in post_order(mod["main_grad"].body))
    pm = transform.PartitionForwardBackward(**opts)(mod)
    analysis.check_well_formed(pm)
    fwd, bwd = pm["main_fwd"], pm["main_bwd"]
    assert any(isinstance(n, If) for n in post_order(fwd.body)) and any(isinstance(n, If) for n in post_order(bwd.body))
    assert not {n for n in analysis.recomputed_calls(pm) if n in HEAVY}
    rng = np.random.default_rng(1)
    inputs = [np.array(cond), rng.standard_normal((4, 6)).astype("float32"), rng.standard_normal((5, 6)).astype("float32")]
    check_equal(pm, inputs, rng.standard_normal((4, 5)).astype("float32"))


@pytest.mark.parametrize("policy", ["save_all", "min_cut"])
def test_if_guarded_log_stays_in_its_branch(policy):
    x = pullback.var("x", shape=(3,))
    cond = op.greater(op.min(x), pullback.const(0.0))
    f = pullback.Function([x], op.sum(If(cond, op.multiply(op.log(x), x), op.negative(x))))
    pm = transform.PartitionForwardBackward(policy=policy)(grad_module(pullback.IRModule.from_expr(f)))
    exe = pullback.build(pm)
    neg = -np.abs(np.random.default_rng(0).standard_normal(3)).astype("float32") - 0.5
    with np.errstate(invalid="raise", divide="raise"):  # log of a negative number would raise
        out, residuals = exe["main_fwd"](neg)
        (gx,) = exe["main_bwd"](*residuals, np.float32(1.0))
    np.testing.assert_allclose(gx, -np.ones(3))


# ------------------------------------------------------------------ the bench's model programs


def model_gradient(name, small=True):
    pytest.importorskip("torch")
    if name == "bert":
        pytest.importorskip("transformers")
    from pullback.frontend.torch_importer import export, import_exported, tied_keys
    from pullback.integrations.torch import draw_masks, float_wrt
    from pullback.testing.torch_models import make_workload

    wl = make_workload(name, small=small)
    prog = import_exported(export(wl.model, wl.example_inputs), tied=tied_keys(wl.model))
    mod = transform.FirstOrderGradient("main", wrt=float_wrt(prog, prog.inputs) + prog.trainable, mode="vjp")(prog.mod)
    state = dict(wl.model.named_parameters(remove_duplicate=False))
    state.update(wl.model.named_buffers(remove_duplicate=False))
    tensors = list(wl.example_inputs) + [state[prog.state_key(n)] for n in prog.params] + draw_masks(prog, wl.example_inputs)
    return transform.standard_cleanup()(mod), [t.detach().numpy() for t in tensors]


MODELS = ["transformer", "bert", "cnn", "resnet"]


def ones_like(value):
    """A cotangent for ``value``: ones where it is float (nested tuples too)."""
    if isinstance(value, tuple):
        return tuple(ones_like(v) for v in value)
    value = np.asarray(value)
    return np.ones_like(value) if value.dtype.kind == "f" else np.zeros_like(value)


@pytest.mark.parametrize("name", MODELS)
def test_model_min_cut_saves_no_more_and_recomputes_no_heavy_op(name):
    mod, inputs = model_gradient(name)
    save_all = transform.PartitionForwardBackward(policy="save_all")(mod)
    base_act = analysis.saved_bytes(save_all, inputs=False)
    moves = analysis.recomputed_calls(save_all)  # save_all rebuilds only copies of the parameters (centre taps)
    assert all(get_op(n).recompute <= Recompute.CHEAP and get_op(n).pattern == FusionKind.INJECTIVE for n in moves), moves
    ct = ones_like(pullback.build(save_all)["main_fwd"](*inputs)[0])
    for target, budget in (("numpy", 1.0), ("numpy", None), ("torch", None)):
        opts = {} if budget is None else dict(recompute_ns_per_byte=budget)
        pm = transform.PartitionForwardBackward(policy="min_cut", target=target, **opts)(mod)
        # parameters are free to save (the caller holds them): min_cut may save one instead of a slice of it and
        # slice again in the backward (the ResNet's one-tap dense layers); the activations it saves must shrink
        assert analysis.saved_bytes(pm, inputs=False) < base_act
        twice = analysis.recomputed_calls(pm)
        assert not {op_name for op_name in twice if get_op(op_name).recompute is Recompute.NEVER}, twice
        if budget == 1.0:  # special functions (erf, gelu) cost more with NumPy than 1 ns per byte they free
            assert not {op_name for op_name in twice if get_op(op_name).recompute is Recompute.SPECIAL}, twice
        check_equal(pm, inputs, ct)


@pytest.mark.parametrize("name", ["transformer", "bert"])
def test_transformer_layers_recompute_gelu_within_budget(name):
    mod, _ = model_gradient(name)
    base = analysis.saved_bytes(transform.PartitionForwardBackward(policy="save_all")(mod), inputs=False)
    sizes = {}
    default = transform.partition.DEFAULT_NS_PER_BYTE
    for target, budget in (("numpy", 1.0), ("numpy", default), ("torch", default), ("jax", default)):
        pm = transform.PartitionForwardBackward(policy="min_cut", target=target, recompute_ns_per_byte=budget)(mod)
        sizes[target, budget] = analysis.saved_bytes(pm, inputs=False)
        # gelu's gradient (nn.gelu_grad) reads its input, saved anyway: recomputing gelu from it for the
        # next dense's weight gradient costs one more gelu where the budget pays for it
        assert analysis.recomputed_calls(pm)["nn.gelu"] == (budget > 1)
    assert sizes["torch", default] == sizes["numpy", default] < sizes["numpy", 1.0] < base


@pytest.mark.parametrize("name", ["transformer", "bert"])
def test_transformer_layers_save_at_most_60_percent(name):
    """Issue 14's memory target at the bench's sizes: at most 60% of save_all's activation bytes (parameters
    left out), never recomputing a heavy operator."""
    mod, _ = model_gradient(name, small=False)
    save_all = transform.PartitionForwardBackward(policy="save_all")(mod)
    for target in ("numpy", "jax"):
        pm = transform.PartitionForwardBackward(policy="min_cut", target=target)(mod)
        assert analysis.saved_bytes(pm, inputs=False) <= 0.6 * analysis.saved_bytes(save_all, inputs=False)
        assert not {n for n in analysis.recomputed_calls(pm) if get_op(n).recompute is Recompute.NEVER}


# ------------------------------------------------------------------ If programs, table-driven


def _bool(name):
    return pullback.var(name, shape=(), dtype="bool")


def nested_if():
    """An If inside a branch of an If, each branch reading the dense output differently."""
    c, d = _bool("c"), _bool("d")
    x, w = pullback.var("x", shape=(4, 6)), pullback.var("w", shape=(5, 6))
    h = op.nn.dense(x, w)
    inner = If(d, op.multiply(op.exp(h), h), op.tanh(op.multiply(h, h)))
    y = If(c, op.sigmoid(inner), op.nn.relu(op.add(h, pullback.const(1.0))))
    return pullback.IRModule.from_expr(pullback.Function([c, d, x, w], op.multiply(y, op.tanh(h))))


def tuple_if():
    """A tuple-valued If whose fields are used separately (one field by a GEMM)."""
    c, d = _bool("c"), _bool("d")
    x, w = pullback.var("x", shape=(4, 6)), pullback.var("w", shape=(6, 6))
    h = op.exp(op.nn.dense(x, w))
    t = If(c, pullback.Tuple([op.tanh(h), op.multiply(h, x)]), pullback.Tuple([op.multiply(x, x), op.sigmoid(h)]))
    a, b = pullback.TupleGetItem(t, 0), pullback.TupleGetItem(t, 1)
    out = op.add(op.nn.dense(a, w), If(d, b, op.negative(b)))
    return pullback.IRModule.from_expr(pullback.Function([c, d, x, w], pullback.Tuple([out, op.sum(a)])))


def one_branch_residual():
    """Values only one branch reads: a softmax and a layer norm in the true branch, a GEMM in the false one."""
    c, d = _bool("c"), _bool("d")
    x, w = pullback.var("x", shape=(4, 6)), pullback.var("w", shape=(6, 6))
    g, b = pullback.var("g", shape=(6,)), pullback.var("b", shape=(6,))
    s = op.nn.softmax(op.nn.dense(x, w))
    n = op.nn.layer_norm(op.exp(x), g, b)
    y = If(c, op.multiply(s, n), op.nn.dense(op.tanh(x), w))
    z = If(d, op.multiply(y, y), y)
    return pullback.IRModule.from_expr(pullback.Function([c, d, x, w, g, b], op.add(z, x)))


def norms_and_branches():
    """A training batch norm before two Ifs and a layer norm inside a branch, their outputs read by GEMMs (min_cut
    may rebuild the batch norm's in the backward, never the one in a branch)."""
    c, d = _bool("c"), _bool("d")
    x, w = pullback.var("x", shape=(4, 6)), pullback.var("w", shape=(6, 6))
    g, b, mm, mv = (pullback.var(n, shape=(6,)) for n in ("g", "b", "mm", "mv"))
    bn = op.nn.native_batch_norm(op.nn.dense(x, w), g, b, mm, mv, axis=1, training=True)[0]
    y = If(c, op.nn.dense(op.nn.native_layer_norm(op.exp(bn), g, b)[0], w), op.tanh(bn))
    z = If(d, op.nn.dense(bn, w), op.multiply(y, y))
    return pullback.IRModule.from_expr(pullback.Function([c, d, x, w, g, b, mm, mv], op.add(z, y)))


IF_PROGRAMS = {"nested": nested_if, "tuple": tuple_if, "one_branch": one_branch_residual, "norms": norms_and_branches}
PARTITIONS = [dict(policy="save_all"), dict(policy="min_cut"), dict(policy="min_cut", target="jax"),
              dict(policy="min_cut", recompute_ns_per_byte=1.0),
              dict(policy="min_cut", recompute_ns_per_byte=float("inf")), dict(policy="min_cut", recompute_ns_per_byte=0)]


def _random_args(fn, conds, rng):
    args, it = [], iter(conds)
    for p in fn.params:
        t = p.type_annotation
        args.append(np.array(next(it)) if t.dtype == "bool" else rng.standard_normal(tuple(t.shape)).astype(t.dtype))
    return args


@pytest.mark.parametrize("opts", PARTITIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("name", sorted(IF_PROGRAMS))
def test_if_programs_min_cut_equals_save_all(name, opts):
    """Every partition of a program with Ifs gives @main_grad's outputs and gradients for each branch taken,
    computes no GEMM, reduction, softmax or normalisation twice, and min_cut saves no more than save_all."""
    mod = grad_module(IF_PROGRAMS[name]())
    pm = transform.PartitionForwardBackward(**opts)(mod)
    analysis.check_well_formed(pm)
    assert not {n for n in analysis.recomputed_calls(pm) if get_op(n).recompute is Recompute.NEVER}
    base = transform.PartitionForwardBackward(policy="save_all")(mod)
    assert analysis.saved_bytes(pm, inputs=False) <= analysis.saved_bytes(base, inputs=False)
    fn = mod["main"]
    out_type = fn.body.checked_type
    rng = np.random.default_rng(3)
    for conds in ((True, True), (True, False), (False, True), (False, False)):
        inputs = _random_args(fn, conds, rng)
        check_equal(pm, inputs, ones_like(pullback.build(mod)["main"](*inputs)))
    assert out_type == pm["main_fwd"].ret_type.fields[0]


# ------------------------------------------------------------------ heavy ops are never recomputed


def _heavy_programs():
    x, w1, w2 = pullback.var("x", shape=(8, 16)), pullback.var("w1", shape=(64, 16)), pullback.var("w2", shape=(4, 64))
    yield "dense", [x, w1, w2], op.nn.dense(op.nn.relu(op.exp(op.nn.dense(x, w1))), w2)
    q, k = pullback.var("q", shape=(2, 8, 4)), pullback.var("k", shape=(2, 8, 4))
    att = op.nn.softmax(op.nn.batch_matmul(q, k, transpose_b=True))
    yield "batch_matmul_softmax", [q, k], op.nn.batch_matmul(op.multiply(att, att), q, transpose_b=False)
    img, f1 = pullback.var("img", shape=(1, 2, 8, 8)), pullback.var("f1", shape=(8, 2, 3, 3))
    f2 = pullback.var("f2", shape=(2, 8, 3, 3))
    yield "conv2d", [img, f1, f2], op.nn.conv2d(op.tanh(op.nn.conv2d(img, f1, padding=(1, 1))), f2, padding=(1, 1))
    v = pullback.var("v", shape=(8, 16))
    s = op.sum(op.exp(v), axis=1, keepdims=True)
    yield "sum_mean", [v], op.mean(op.multiply(op.tanh(op.multiply(v, s)), op.sigmoid(s)), axis=0)
    g, b = pullback.var("g", shape=(16,)), pullback.var("b", shape=(16,))
    yield "layer_norm", [v, g, b], op.nn.gelu(op.nn.layer_norm(op.exp(v), g, b))


@pytest.mark.parametrize("budget", [1.0, float("inf")])
@pytest.mark.parametrize("name, params, body", list(_heavy_programs()), ids=lambda v: v if isinstance(v, str) else "")
def test_min_cut_never_recomputes_gemms_convolutions_or_reductions(name, params, body, budget):
    """Even when recomputation is free (``inf``), GEMMs, convolutions, reductions, softmax and normalisations are
    computed once: their count in @main_fwd + @main_bwd is @main_grad's, and the results are @main_grad's."""
    mod = grad_module(pullback.IRModule.from_expr(pullback.Function(params, body)))
    pm = transform.PartitionForwardBackward(policy="min_cut", recompute_ns_per_byte=budget)(mod)
    heavy = [o.name for o in pullback.ops.list_ops() if o.recompute is Recompute.NEVER]
    grad_heavy = count_calls(pm["main_grad"].body, heavy)
    assert grad_heavy > 0
    # layer_norm is decomposed into its statistics (sums) shared with its gradient: no more heavy calls than before
    assert count_calls(pm["main_fwd"].body, heavy) + count_calls(pm["main_bwd"].body, heavy) <= grad_heavy
    assert not {n for n in analysis.recomputed_calls(pm) if get_op(n).recompute is Recompute.NEVER}
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(tuple(p.type_annotation.shape)).astype("float32") for p in params]
    check_equal(pm, inputs, ones_like(pullback.build(mod)["main"](*inputs)))


# ------------------------------------------------------------------ normalised outputs rebuilt from their statistics


def _norm_then_dense(norm: str, dtype: str):
    """A layer norm over axis 1 of (6, 5, 4) or a batch norm (``"batch"``: training, ``"frozen batch"``: the moving
    statistics) over the channels of (4, 3, 2, 2), its output reshaped into a dense layer whose weight gradient
    reads it."""
    shape, channels = ((6, 5, 4), 5) if norm == "layer" else ((4, 3, 2, 2), 3)
    x = pullback.var("x", shape=shape, dtype=dtype)
    g, b = (pullback.var(n, shape=(channels,), dtype=dtype) for n in ("g", "b"))
    w = pullback.var("w", shape=(7, int(np.prod(shape[1:]))), dtype=dtype)
    if norm == "layer":
        call, params = op.nn.native_layer_norm(x, g, b, axis=1, epsilon=1e-3), [x, g, b, w]
    else:
        mm, mv = (pullback.var(n, shape=(channels,), dtype=dtype) for n in ("mm", "mv"))
        call = op.nn.native_batch_norm(x, g, b, mm, mv, axis=1, training=norm == "batch")
        params = [x, g, b, mm, mv, w]
    y = op.nn.dense(op.reshape(call[0], (shape[0], -1)), w)
    return grad_module(pullback.IRModule.from_expr(pullback.Function(params, y))), params


def _reads_norm_output(residual) -> bool:
    return any(isinstance(n, TupleGetItem) and n.index == 0 for n in post_order(residual))


@pytest.mark.parametrize("norm", ["layer", "batch", "frozen batch"])
def test_min_cut_rebuilds_normalised_output_from_statistics(norm):
    """The weight gradient reads the norm's output: save_all saves it (transposed), min_cut only the statistics
    (the data is an input, free) and computes ``(x - mean) * rstd * g + b`` in the backward; same gradients."""
    mod, params = _norm_then_dense(norm, "float64")
    save_all = transform.PartitionForwardBackward(policy="save_all")(mod)
    pm = transform.PartitionForwardBackward(policy="min_cut")(mod)
    assert any(map(_reads_norm_output, save_all["main_fwd"].body.fields[1].fields))
    residuals = pm["main_fwd"].body.fields[1].fields
    assert not any(map(_reads_norm_output, residuals))
    stats = 6 * 4 if norm == "layer" else 3  # elements of a statistic: one per row / channel
    assert all(np.prod(r.checked_type.shape) <= stats for r in residuals if not isinstance(r, pullback.Var))
    if norm != "frozen batch":  # (x - mean) per row; b - mean * k per channel (frozen: elementwise, no statistics)
        assert count_calls(pm["main_bwd"].body, ["subtract"]) == 1
    assert not {n for n in analysis.recomputed_calls(pm) if get_op(n).recompute is Recompute.NEVER}
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(p.type_annotation.shape) for p in params]
    if norm != "layer":
        inputs[4] = np.abs(inputs[4])  # the moving variance
    check_equal(pm, inputs, rng.standard_normal((params[0].type_annotation.shape[0], 7)))


def test_half_precision_norm_output_is_saved_not_rebuilt():
    """float16 statistics are rounded to float16: the backward reads the norm's own output."""
    mod, _ = _norm_then_dense("layer", "float16")
    pm = transform.PartitionForwardBackward(policy="min_cut")(mod)
    assert any(map(_reads_norm_output, pm["main_fwd"].body.fields[1].fields))
    assert not count_calls(pm["main_bwd"].body, ["subtract"])


def test_a_value_the_backward_reads_for_its_dynamic_shape_is_saved_as_a_view_of_nothing():
    """``mean``'s gradient broadcasts to its operand's shape (``broadcast_to_like``): over a dynamic batch no
    ConcretizeLike writes it out, and the backward read the whole operand for its shape. The forward saves a
    zero broadcast to it instead (a view holding no memory on NumPy and torch), and lets the operand go."""
    x, w = pullback.var("x", shape=(pullback.Any, 6)), pullback.var("w", shape=(8, 6))
    y = op.tanh(op.nn.dense(x, w)) * pullback.const(2.0)
    mod = grad_module(pullback.IRModule.from_expr(pullback.Function([x, w], op.mean(y))))
    pm = transform.PartitionForwardBackward()(mod)
    residuals = pm["main_fwd"].body.fields[1].fields
    carriers = [r for r in residuals if isinstance(r, pullback.Call) and r.op.name == "broadcast_to_like"]
    assert len(carriers) == 1 and carriers[0].args[1].op.name == "multiply"
    rng = np.random.default_rng(0)
    for target in ("numpy", "torch"):
        pytest.importorskip(target)
        exe = pullback.build(pm, target=target)
        for rows in (3, 5):
            inputs = [rng.standard_normal(s).astype("float32") for s in ((rows, 6), (8, 6))]
            _, saved = exe["main_fwd"](*inputs)
            held = saved[residuals.index(carriers[0])]
            assert tuple(held.shape) == (rows, 8)
            assert set(held.stride() if target == "torch" else held.strides) == {0}
            ct = np.float32(rng.standard_normal())
            grads = exe["main_bwd"](*saved, ct)
            _, want = exe["main_grad"](*inputs, ct)
            for a, b in zip(flat(grads), flat(want), strict=True):
                np.testing.assert_allclose(np.asarray(a), b, rtol=1e-6, atol=1e-7)
