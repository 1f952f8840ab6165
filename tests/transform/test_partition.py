"""PartitionForwardBackward: main_fwd then main_bwd equals main_grad, for both policies."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import analysis, op, transform
from pullback.ir.traversal import count_calls

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


def check_equal(mod, inputs, ct):
    exe = pullback.build(mod)
    out, grads = exe["main_grad"](*inputs, ct)
    fwd_out, residuals = exe["main_fwd"](*inputs)
    assert len(residuals) == len(mod["main_bwd"].params) - 1
    np.testing.assert_array_equal(fwd_out, out)
    bwd = exe["main_bwd"](*residuals, ct)
    assert len(bwd) == len(grads)
    for a, b in zip(bwd, grads):
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
