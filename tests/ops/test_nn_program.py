"""nn.* operators inside programs: AD pass gradients and second derivatives (check_grad /
check_second_order), max-pool ties, dynamic batch dims, attribute validation, patterns, flops."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import Any, Function, op, var
from pullback.analysis import infer_expr
from pullback.ir.traversal import post_order
from pullback.ir.errors import AttrError, PullbackError, TypeInferenceError
from pullback.ops import FusionKind, get_op
from pullback.testing import check_grad, check_second_order

from test_nn_ops import WITH_INDICES

RNG = np.random.default_rng(11)


def V(name, *shape, dtype="float64"):
    return var(name, shape=shape, dtype=dtype)


def _mlp_ln():
    x, w, g, b = V("x", 3, 4), V("w", 5, 4), V("g", 5), V("b", 5)
    return Function([x, w, g, b], op.nn.softmax(op.nn.layer_norm(op.nn.dense(x, w), g, b)))


def _conv_net():
    x, w1, w2 = V("x", 2, 2, 7, 6), V("w1", 4, 2, 3, 2), V("w2", 4, 1, 2, 2)
    h = op.nn.conv2d(x, w1, strides=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2))
    h = op.tanh(op.nn.conv2d(h, w2, strides=(2, 2), padding=(1, 1), groups=4))
    return Function([x, w1, w2], op.nn.avg_pool2d(h, pool_size=(2, 2), strides=(1, 1), count_include_pad=True))


PROGRAMS = {  # name -> (function, second order?)
    "dense": (lambda: Function([a := V("a", 2, 3, 4), w := V("w", 5, 4)], op.nn.dense(a, w)), True),
    "softmax": (lambda: Function([a := V("a", 3, 4)], op.nn.softmax(a, axis=0)), True),
    "log_softmax": (lambda: Function([a := V("a", 3, 4)], op.nn.log_softmax(a)), True),
    "layer_norm": (lambda: Function([a := V("a", 3, 4), g := V("g", 4), b := V("b", 4)], op.nn.layer_norm(a, g, b)), True),
    "conv2d": (lambda: Function([a := V("a", 2, 4, 7, 6), w := V("w", 4, 2, 3, 2)],
                                op.nn.conv2d(a, w, strides=(2, 3), padding=(1, 0, 2, 1), dilation=(1, 2), groups=2)), True),
    "conv2d_transpose": (lambda: Function([a := V("a", 1, 4, 3, 4), w := V("w", 4, 3, 3, 2)],
                                          op.nn.conv2d_transpose(a, w, strides=(2, 3), padding=(1, 0), groups=2,
                                                                 output_padding=(1, 2))), True),
    "batch_matmul": (lambda: Function([a := V("a", 1, 3, 4), b := V("b", 2, 5, 4)], op.nn.batch_matmul(a, b)), True),
    "matmul": (lambda: Function([a := V("a", 4, 3), b := V("b", 5, 4)], op.nn.matmul(a, b, True, True)), True),
    "gelu": (lambda: Function([a := V("a", 3, 4)], op.nn.gelu(a)), True),
    "silu": (lambda: Function([a := V("a", 3, 4)], op.nn.silu(a)), True),
    "batch_norm": (lambda: Function([a := V("a", 4, 3, 2), g := V("g", 3), b := V("b", 3), m := V("m", 3), v := V("v", 3)],
                                    op.nn.batch_norm(a, g, b, m, v, training=True)[0]), True),
    "max_pool2d": (lambda: Function([a := V("a", 1, 2, 5, 6)], op.nn.max_pool2d(a, (3, 2), (2, 2), (1, 1), (1, 1))), True),
    "max_pool2d_with_indices": (lambda: Function([a := V("a", 1, 2, 5, 6)], op.tanh(
        op.nn.max_pool2d_with_indices(a, (3, 2), (2, 2), (1, 1), (1, 1))[0])), True),
    "relu": (lambda: Function([a := V("a", 3, 4)], op.nn.relu(a) * a), True),
    "gelu_tanh": (lambda: Function([a := V("a", 3, 4)], op.nn.gelu(a, "tanh")), True),
    "batch_norm_axis_last": (lambda: Function([a := V("a", 5, 3), g := V("g", 3), b := V("b", 3), m := V("m", 3), v := V("v", 3)],
                                              op.nn.batch_norm(a, g, b, m, v, axis=-1, training=True)[0]), True),
    "layer_norm_axis0": (lambda: Function([a := V("a", 4, 3), g := V("g", 4), b := V("b", 4)],
                                          op.nn.layer_norm(a, g, b, axis=0)), True),
    "adaptive_avg_pool2d": (lambda: Function([a := V("a", 1, 2, 5, 7)], op.nn.adaptive_avg_pool2d(a, (2, 3))), True),
    "global_avg_pool2d": (lambda: Function([a := V("a", 2, 3, 2, 3)], op.nn.global_avg_pool2d(a)), True),
    "pad_reflect": (lambda: Function([a := V("a", 3, 4)], op.nn.pad(a, ((1, 2), (3, 0)), 0.0, "reflect")), True),
    "mlp_layer_norm_softmax": (_mlp_ln, True),
    "conv_net": (_conv_net, True),
    "cross_entropy_log_softmax": (lambda: Function([a := V("a", 3, 4), t := V("t", 3, 4)],
                                                   op.nn.cross_entropy_with_logits(op.nn.log_softmax(a), t)), True),
    "nll_loss": (lambda: Function([a := V("a", 4, 3), t := V("t", 4, dtype="int64"), w := V("w", 3)],
                                  op.nn.nll_loss(op.nn.log_softmax(a), t, w)), True),
    "fused_grad_block": (lambda: _fused_grad_block(), True),
}


def _inputs(fn):
    out = []
    for p in fn.params:
        t = p.type_annotation
        if t.dtype == "int64":
            out.append(RNG.integers(0, 3, t.shape))
        elif p.name_hint in ("v", "t"):
            out.append(RNG.uniform(0.5, 1.5, t.shape))
        else:
            out.append(RNG.standard_normal(t.shape))
    return out


def _wrt(fn):
    return [p for p in fn.params if p.type_annotation.dtype != "int64" and not (p.name_hint == "w" and len(fn.params) == 3
                                                                                 and fn.params[1].type_annotation.dtype == "int64")]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_ad_pass_gradient_matches_finite_differences(name):
    fn = PROGRAMS[name][0]()
    check_grad(fn, _inputs(fn), wrt=_wrt(fn))


@pytest.mark.parametrize("name", sorted(n for n, (_, so) in PROGRAMS.items() if so))
def test_second_order_matches_finite_differences(name):
    fn = PROGRAMS[name][0]()
    check_second_order(fn, _inputs(fn), wrt=_wrt(fn), rtol=1e-4, atol=1e-5)


def test_dense_gradient_has_exactly_three_dense_calls():
    from pullback.ir.traversal import count_calls
    from pullback.transform.first_order_gradient import FirstOrderGradient

    x, w = V("x", 2, 3), V("w", 4, 3)
    mod = FirstOrderGradient()(pullback.IRModule.from_expr(Function([x, w], op.nn.dense(x, w))))
    assert count_calls(mod["main_grad"], ["nn.dense"]) == 3


def _run(fn, *args):
    return pullback.build(pullback.IRModule.from_expr(fn))["main"](*args)


def test_max_pool_ties_route_to_first_maximum_like_torch():
    torch = pytest.importorskip("torch")
    x = np.array([[[[1.0, 1.0, 0.0], [1.0, 1.0, 2.0], [2.0, 0.0, 2.0]]]])
    g = np.arange(1.0, 5.0).reshape(1, 1, 2, 2)
    ours = get_op("nn.max_pool2d_grad").compute(g, x, get_op("nn.max_pool2d").make_attrs((2, 2), (1, 1)))
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(xt, 2, 1).backward(torch.tensor(g))
    np.testing.assert_array_equal(ours, xt.grad.numpy())
    assert ours[0, 0, 0, 0] == 1.0 and ours[0, 0, 1, 2] == 6.0 and ours[0, 0, 2, 2] == 0.0  # first max, row-major


@pytest.mark.parametrize("k", range(len(WITH_INDICES)))
def test_max_pool_with_indices_matches_torch(k):
    """Pooled values, indices (PyTorch's flat positions) and the gradient through the indices equal PyTorch's."""
    torch = pytest.importorskip("torch")
    attrs, shape = WITH_INDICES[k]
    p = attrs.get("padding", (0, 0))
    x = RNG.standard_normal(shape)
    xv = V("x", *shape)
    y, idx = _run(Function([xv], op.nn.max_pool2d_with_indices(xv, **attrs)), x)
    xt = torch.tensor(x, requires_grad=True)
    if len(p) == 4:  # (top, left, bottom, right): pad by hand with -inf, map the indices back
        ref = torch.nn.functional.pad(xt, (p[1], p[3], p[0], p[2]), value=-np.inf)
        ty, ti = torch.nn.functional.max_pool2d(ref, attrs["pool_size"], attrs["strides"], return_indices=True)
        w = shape[3] + p[1] + p[3]
        ti = (ti // w - p[0]) * shape[3] + ti % w - p[1]
    else:
        ty, ti = torch.nn.functional.max_pool2d(xt, attrs["pool_size"], attrs["strides"], p, attrs.get("dilation", (1, 1)),
                                                attrs.get("ceil_mode", False), return_indices=True)
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(idx, ti.numpy())
    g = RNG.standard_normal(y.shape)
    ty.backward(torch.tensor(g))
    gv, iv = V("g", *y.shape), V("i", *y.shape, dtype="int64")
    dx = _run(Function([gv, xv, iv], op.nn.max_pool2d_with_indices_grad(gv, xv, iv, **attrs)), g, x, idx)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_dynamic_batch_dim_infers_and_runs():
    n = Any
    cases = [
        (op.nn.conv2d(V("x", n, 3, 8, 8), V("w", 4, 3, 3, 3), strides=(2, 2), padding=(1, 1)), (n, 4, 4, 4)),
        (op.nn.conv2d_transpose(V("x", n, 4, 4, 4), V("w", 4, 3, 3, 3), strides=(2, 2), padding=(1, 1), output_padding=(1, 1)), (n, 3, 8, 8)),
        (op.nn.max_pool2d(V("x", n, 3, 8, 8), (2, 2), (2, 2)), (n, 3, 4, 4)),
        (op.nn.avg_pool2d(V("x", n, 3, Any, 8), (2, 2), (2, 2)), (n, 3, Any, 4)),
        (op.nn.dense(V("x", n, 7, 5), V("w", 2, 5)), (n, 7, 2)),
        (op.nn.batch_flatten(V("x", n, 3, 4)), (n, 12)),
        (op.nn.batch_matmul(V("x", n, 3, 4), V("y", n, 5, 4)), (n, 3, 5)),
        (op.nn.layer_norm(V("x", n, 4), V("g", 4), V("b", 4)), (n, 4)),
        (op.nn.nll_loss(V("x", n, 4), V("t", n, dtype="int64"), V("w", 4), reduction="none"), (n,)),
    ]
    for expr, shape in cases:
        assert infer_expr(expr).shape == shape, expr


def test_gradient_with_dynamic_batch_runs():
    x, w, g, b = V("x", Any, 4), V("w", 3, 4), V("g", 3), V("b", 3)
    t = V("t", Any, 3)
    loss = op.nn.cross_entropy_with_logits(op.nn.log_softmax(op.nn.layer_norm(op.nn.dense(x, w), g, b)), t)
    fn = Function([x, w, g, b, t], loss)
    from pullback.transform.first_order_gradient import FirstOrderGradient

    mod = FirstOrderGradient()(pullback.IRModule.from_expr(fn))
    exe = pullback.build(mod)
    args = [RNG.standard_normal((5, 4)), RNG.standard_normal((3, 4)), RNG.standard_normal(3), RNG.standard_normal(3),
            RNG.uniform(size=(5, 3))]
    out, grads = exe["main_grad"](*args)
    torch = pytest.importorskip("torch")
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    h = torch.nn.functional.linear(ts[0], ts[1])
    h = torch.nn.functional.layer_norm(h, (3,), ts[2], ts[3])
    ref = -(torch.log_softmax(h, -1) * ts[4]).sum() / 5
    ref.backward()
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-10)
    for a, t_ in zip(grads, ts):
        np.testing.assert_allclose(a, t_.grad.numpy(), rtol=1e-9, atol=1e-12)


ATTR_ERRORS = [
    (lambda: op.nn.conv2d(V("x", 1, 1, 3, 3), V("w", 1, 1, 1, 1), data_layout="NHWC"), "data_layout"),
    (lambda: op.nn.conv2d(V("x", 1, 1, 3, 3), V("w", 1, 1, 1, 1), kernel_layout="HWIO"), "kernel_layout"),
    (lambda: op.nn.conv2d(V("x", 1, 1, 3, 3), V("w", 1, 1, 1, 1), strides=(0, 1)), "strides"),
    (lambda: op.nn.conv2d(V("x", 1, 1, 3, 3), V("w", 1, 1, 1, 1), padding=(-1, 0)), "padding"),
    (lambda: op.nn.conv2d(V("x", 1, 1, 3, 3), V("w", 1, 1, 1, 1), padding=(1, 2, 3)), "padding"),
    (lambda: op.nn.conv2d(V("x", 1, 1, 3, 3), V("w", 1, 1, 1, 1), groups=0), "groups"),
    (lambda: op.nn.conv2d_transpose(V("x", 1, 1, 3, 3), V("w", 1, 1, 1, 1), strides=(2, 2), output_padding=(2, 0)), "output_padding"),
    (lambda: op.nn.max_pool2d(V("x", 1, 1, 3, 3), (2, -1)), "pool_size"),
    (lambda: op.nn.max_pool2d(V("x", 1, 1, 3, 3), (2, 2), layout="NHWC"), "layout"),
    (lambda: op.nn.avg_pool2d(V("x", 1, 1, 3, 3), (2, 2), count_include_pad="yes"), "count_include_pad"),
    (lambda: op.nn.adaptive_avg_pool2d(V("x", 1, 1, 3, 3), (0, 2)), "output_size"),
    (lambda: op.nn.leaky_relu(V("x", 2), "a"), "alpha"),
    (lambda: op.nn.gelu(V("x", 2), "erf"), "approximate"),
    (lambda: op.nn.softplus(V("x", 2), beta=0.0), "beta"),
    (lambda: op.nn.softmax(V("x", 2), 1.5), "axis"),
    (lambda: op.nn.layer_norm(V("x", 2), V("g", 2), V("b", 2), epsilon=float("nan")), "epsilon"),
    (lambda: op.nn.batch_norm(*[V(n, 2) for n in "xgbmv"], training=1), "training"),
    (lambda: op.nn.dropout(V("x", 2), V("m", 2), 1.0), "rate"),
    (lambda: op.nn.pad(V("x", 2), ((1,),)), "pad_width"),
    (lambda: op.nn.pad(V("x", 2), ((1, 1),), 0.0, "wrap"), "pad_mode"),
    (lambda: op.nn.pad(V("x", 4), ((-1, 1),), 0.0, "reflect"), "pad_width"),
    (lambda: op.nn.nll_loss(V("x", 2, 2), V("t", 2, dtype="int64"), V("w", 2), reduction="avg"), "reduction"),
    (lambda: op.nn.matmul(V("a", 2, 2), V("b", 2, 2), transpose_a=1), "transpose_a"),
    (lambda: op.nn.bias_add(V("x", 2, 2), V("b", 2), axis="1"), "axis"),
    (lambda: op.nn.conv2d_backward_weight(V("g", 1, 1, 3, 3), V("x", 1, 1, 3, 3)), "kernel_size"),
]


@pytest.mark.parametrize("k", range(len(ATTR_ERRORS)))
def test_bad_attributes_raise_attr_error_naming_op_and_attribute(k):
    build, attr = ATTR_ERRORS[k]
    with pytest.raises(AttrError) as e:
        build()
    assert "nn." in str(e.value) and attr in str(e.value)


TYPE_ERRORS = [
    (lambda: op.nn.conv2d(V("x", 1, 3, 5, 5), V("w", 4, 2, 3, 3)), "channels"),
    (lambda: op.nn.conv2d(V("x", 1, 4, 5, 5), V("w", 3, 2, 3, 3), groups=2), "divisible"),
    (lambda: op.nn.conv2d(V("x", 1, 3, 2, 5), V("w", 4, 3, 3, 3)), "does not fit"),
    (lambda: op.nn.conv2d(V("x", 1, 3, 5), V("w", 4, 3, 3, 3)), "rank 4"),
    (lambda: op.nn.dense(V("x", 2, 3), V("w", 4, 5)), "in_features"),
    (lambda: op.nn.matmul(V("a", 2, 3), V("b", 4, 5)), "contraction"),
    (lambda: op.nn.batch_matmul(V("a", 2, 3, 4), V("b", 3, 5, 4)), "broadcast"),
    (lambda: op.nn.bias_add(V("x", 2, 3), V("b", 2)), "bias"),
    (lambda: op.nn.softmax(V("x", 2, 3), axis=2), "axis 2"),
    (lambda: op.nn.layer_norm(V("x", 2, 3), V("g", 2), V("b", 3)), "argument 1"),
    (lambda: op.nn.max_pool2d(V("x", 1, 1, 2, 2), (3, 3)), "does not fit"),
    (lambda: op.nn.nll_loss(V("x", 2, 3), V("t", 2), V("w", 3)), "integer"),
    (lambda: op.nn.cross_entropy(V("x", 2, 3), V("t", 3, 2)), "same shape"),
    (lambda: op.nn.pad(V("x", 3), ((0, 0), (1, 1))), "pairs"),
    (lambda: op.nn.dropout(V("x", 2, 3), V("m", 4)), "broadcast"),
]


@pytest.mark.parametrize("k", range(len(TYPE_ERRORS)))
def test_type_errors_name_the_op_and_problem(k):
    build, words = TYPE_ERRORS[k]
    expr = build()
    with pytest.raises(TypeInferenceError) as e:
        infer_expr(expr)
    assert "nn." in str(e.value) and words in str(e.value)


def test_gradient_of_strided_conv_with_dynamic_spatial_dims_is_a_clear_error():
    x, w = V("x", 1, 1, Any, 5), V("w", 1, 1, 3, 3)
    call = op.nn.conv2d(x, w, strides=(2, 2))
    infer_expr(call)
    with pytest.raises(PullbackError, match="static spatial dims"):
        call.op.grad(call, V("g", 1, 1, Any, 2))


PATTERNS = {
    "nn.dense": FusionKind.OUT_ELEMWISE_FUSABLE, "nn.matmul": FusionKind.OUT_ELEMWISE_FUSABLE,
    "nn.batch_matmul": FusionKind.OUT_ELEMWISE_FUSABLE, "nn.conv2d": FusionKind.OUT_ELEMWISE_FUSABLE,
    "nn.softmax": FusionKind.OPAQUE, "nn.layer_norm": FusionKind.OPAQUE, "nn.relu": FusionKind.ELEMWISE,
    "nn.gelu": FusionKind.ELEMWISE, "nn.bias_add": FusionKind.BROADCAST, "nn.max_pool2d": FusionKind.OPAQUE,
    "nn.avg_pool2d": FusionKind.OPAQUE, "nn.pad": FusionKind.INJECTIVE, "nn.batch_flatten": FusionKind.INJECTIVE,
    # fused gradients: elementwise ones fuse like their forward ops, the ones that reduce are opaque
    "nn.gelu_grad": FusionKind.ELEMWISE, "nn.threshold_grad": FusionKind.ELEMWISE, "nn.softmax_grad": FusionKind.OPAQUE,
    "nn.log_softmax_grad": FusionKind.OPAQUE, "nn.layer_norm_grad": FusionKind.OPAQUE, "nn.batch_norm_grad": FusionKind.OPAQUE,
    "nn.max_pool2d_with_indices": FusionKind.OPAQUE, "nn.max_pool2d_with_indices_grad": FusionKind.OPAQUE,
}


def test_fusion_patterns():
    assert {n: get_op(n).pattern for n in PATTERNS} == PATTERNS


def test_flops_estimates():
    def flops(expr):
        infer_expr(expr)
        return expr.op.flops([a.checked_type for a in expr.args], expr.checked_type, expr.attrs)

    assert flops(op.nn.dense(V("x", 8, 16), V("w", 4, 16))) == 2 * 8 * 4 * 16
    assert flops(op.nn.matmul(V("a", 16, 8), V("b", 16, 4), transpose_a=True)) == 2 * 8 * 4 * 16
    assert flops(op.nn.batch_matmul(V("a", 3, 8, 16), V("b", 3, 4, 16))) == 2 * 3 * 8 * 4 * 16
    # 2 * out elements * Cin/groups * KH * KW
    assert flops(op.nn.conv2d(V("x", 2, 4, 8, 8), V("w", 6, 2, 3, 3), padding=(1, 1), groups=2)) == 2 * (2 * 6 * 8 * 8) * 2 * 9


def test_every_nn_op_is_differentiable_or_says_why():
    for o in pullback.ops.list_ops():
        if o.name.startswith("nn."):
            assert (o.grad is not None or o.expand is not None) and o.differentiable, o.name


def test_batch_norm_returns_relay_tuple():
    x, g, b, m, v = V("x", 4, 3), V("g", 3), V("b", 3), V("m", 3), V("v", 3)
    t = infer_expr(op.nn.batch_norm(x, g, b, m, v))
    assert [f.shape for f in t.fields] == [(4, 3), (3,), (3,)]
    xs = [RNG.standard_normal((4, 3)), np.ones(3), np.zeros(3), np.zeros(3), np.ones(3)]
    out, mm, mv = _run(Function([x, g, b, m, v], op.nn.batch_norm(x, g, b, m, v)), *xs)
    np.testing.assert_allclose(out, xs[0] / np.sqrt(1 + 1e-5))  # inference: moving statistics
    np.testing.assert_array_equal(mm, xs[3])
    np.testing.assert_array_equal(mv, xs[4])


def test_nll_loss_target_out_of_range_is_an_execution_error():
    x, t, w = V("x", 2, 3), V("t", 2, dtype="int64"), V("w", 3)
    with pytest.raises(PullbackError, match="out of range"):
        _run(Function([x, t, w], op.nn.nll_loss(x, t, w)), np.zeros((2, 3)), np.array([0, 3]), np.ones(3))


def test_kernels_do_not_mutate_inputs():
    x = RNG.standard_normal((1, 2, 5, 5))
    w = RNG.standard_normal((2, 2, 3, 3))
    keep = (x.copy(), w.copy())
    fn = Function([a := V("a", 1, 2, 5, 5), b := V("b", 2, 2, 3, 3)],
                  op.nn.max_pool2d(op.nn.conv2d(a, b, padding=(1, 1)), (2, 2), (1, 1)))
    _run(fn, x, w)
    np.testing.assert_array_equal(x, keep[0])
    np.testing.assert_array_equal(w, keep[1])



def _fused_grad_block():
    """dense -> gelu -> layer_norm -> softmax, a BN-conv-relu-maxpool branch: every fused gradient op in one program."""
    x, w, g, b = V("x", 6, 8), V("w", 8, 8), V("g", 8), V("b", 8)
    h = op.nn.softmax(op.nn.layer_norm(op.nn.gelu(op.nn.dense(x, w)), g, b))
    # one input channel: a float32 conv2d of 27 standard-normal taps differs between targets by ~2e-6 (summation order)
    img, k, c, s, m, v = V("img", 2, 1, 6, 6), V("k", 4, 1, 3, 3), V("c", 4), V("s", 4), V("m", 4), V("v", 4)
    f = op.nn.batch_norm(op.nn.conv2d(img, k, padding=(1, 1)), c, s, m, v, training=True)[0]
    p = op.nn.max_pool2d(op.nn.relu(f), (2, 2), (2, 2))
    loss = op.sum(op.nn.log_softmax(h)) + op.sum(op.tanh(p))
    return Function([x, w, g, b, img, k, c, s, m, v], loss)


def test_fuse_ops_keeps_fused_gradients_whole_and_the_result_unchanged():
    """FuseOps on a gradient program: the elementwise gradients (gelu_grad, threshold_grad) may join groups,
    the reducing ones stay single calls (OPAQUE); the fused program computes the same gradients."""
    from pullback import transform
    from pullback.ir.expr import Call, Function as Fn
    from pullback.ir.traversal import post_order

    fn = _fused_grad_block()
    mod = transform.standard_cleanup()(transform.FirstOrderGradient()(pullback.IRModule.from_expr(fn)))
    fused = transform.FuseOps()(mod)
    body = fused["main_grad"].body
    top = {n.op.name for n in post_order(body) if isinstance(n, Call) and not isinstance(n.op, Fn)}
    assert {"nn.softmax_grad", "nn.log_softmax_grad", "nn.layer_norm_grad", "nn.batch_norm_grad"} <= top
    grouped = {n.op.name for n in post_order(body, into_functions=True) if isinstance(n, Call) and hasattr(n.op, "pattern")}
    assert {"nn.gelu_grad", "nn.threshold_grad", "nn.max_pool2d_grad"} <= grouped
    args = _inputs(fn)
    for a, b in zip(pullback.build(mod)["main_grad"](*args)[1], pullback.build(fused)["main_grad"](*args)[1]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("learnt", [True, False])
def test_a_learnt_attention_bias_takes_every_gradient_from_the_scores_cotangent(learnt):
    """Where AD wants an attention bias's gradient (a learnt relative-position bias: Swin, LeViT), the queries', keys'
    and values' gradients come from the same scores' cotangent (no ``nn.attention_grad``, which would recompute the
    probabilities and ``g v^T`` again); where it does not (a fixed mask), flash attention's backward stays. Both
    give autograd's gradients in float64, with two query heads sharing a key head."""
    torch = pytest.importorskip("torch")
    from pullback.transform import FirstOrderGradient, standard_cleanup

    shapes = {"q": (2, 4, 5, 3), "k": (2, 2, 6, 3), "v": (2, 2, 6, 3), "b": (1, 4, 5, 6)}
    pb = pullback
    vs = {n: pb.var(n, shape=s, dtype="float64") for n, s in shapes.items()}
    out = pb.op.nn.attention(vs["q"], vs["k"], vs["v"], vs["b"], scale=0.4)
    f = pb.Function(list(vs.values()), pb.op.sum(pb.op.multiply(pb.TupleGetItem(out, 0), pb.TupleGetItem(out, 0))))
    wrt = ["q", "k", "v", "b"] if learnt else ["q", "k", "v"]
    mod = standard_cleanup()(FirstOrderGradient(wrt=wrt)(pb.IRModule.from_expr(f)))
    names = {n.op.name for n in post_order(mod["main_grad"].body) if isinstance(n, pb.Call) and hasattr(n.op, "name")}
    assert ("nn.attention_grad" in names) is not learnt, names
    rng = np.random.default_rng(3)
    xs = {n: rng.standard_normal(s) for n, s in shapes.items()}
    ts = {n: torch.tensor(x, requires_grad=n in wrt) for n, x in xs.items()}
    y = torch.nn.functional.scaled_dot_product_attention(ts["q"], ts["k"], ts["v"], attn_mask=ts["b"], scale=0.4,
                                                         enable_gqa=True)
    (y * y).sum().backward()
    _, grads = pb.build(mod)["main_grad"](*xs.values())
    for n, g in zip(wrt, grads):
        np.testing.assert_allclose(g, ts[n].grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=n)


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_rows_a_huge_negative_mask_covers_whole_get_eagers_gradients(target, causal):
    """Rows that a mask of the dtype's least value (or -1e9) covers whole (left-padded queries under Hugging Face's
    eager mask): eager's softmax spreads each over its keys, and the queries', keys' and values' gradients on every
    target are autograd's through that softmax in float64 (two query heads sharing a key head), though such a row's
    log-sum-exp has no bits left for the sum."""
    torch = pytest.importorskip("torch")
    pytest.importorskip(target)
    from pullback.transform import FirstOrderGradient, standard_cleanup

    pb = pullback
    shapes = {"q": (2, 4, 5, 3), "k": (2, 2, 6, 3), "v": (2, 2, 6, 3), "b": (2, 1, 5, 6)}
    vs = {n: pb.var(n, shape=s, dtype="float64") for n, s in shapes.items()}
    out = pb.TupleGetItem(pb.op.nn.attention(vs["q"], vs["k"], vs["v"], vs["b"], scale=0.4, is_causal=causal), 0)
    f = pb.Function(list(vs.values()), pb.op.sum(pb.op.multiply(out, pb.op.sin(out))))
    mod = standard_cleanup()(FirstOrderGradient(wrt=["q", "k", "v"])(pb.IRModule.from_expr(f)))
    rng = np.random.default_rng(4)
    xs = {n: rng.standard_normal(s) for n, s in shapes.items()}
    xs["b"][1, 0, :2] = np.finfo(np.float64).min  # the second sample's first two queries
    xs["b"][0, 0, 3] = -1e9
    ts = {n: torch.tensor(x, requires_grad=n != "b") for n, x in xs.items()}
    k, v = (ts[n].repeat_interleave(2, 1) for n in "kv")
    s = ts["q"] @ k.transpose(-1, -2) * 0.4 + ts["b"]
    if causal:
        s = s.masked_fill(~torch.ones(5, 6, dtype=torch.bool).tril(), float("-inf"))
    y = torch.softmax(s, -1) @ v
    (y * y.sin()).sum().backward()
    _, grads = pb.build(mod, target=target)["main_grad"](*xs.values())
    for n, g in zip("qkv", grads):
        np.testing.assert_allclose(np.asarray(g), ts[n].grad.numpy(), rtol=1e-9, atol=1e-10, err_msg=n)


@pytest.mark.parametrize("target", ["numpy", "jax"])
def test_attention_of_a_nan_query_row_has_a_nan_log_sum_exp_as_atens(target):
    """With a bias, a query row holding a NaN: its output and its log-sum-exp NaN (ATen's flash kernel), where the
    row masked everywhere gets 0 (the masked-row rule once caught the NaN row too, giving it 0)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip(target)
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((1, 2, 4, 3)), rng.standard_normal((1, 2, 6, 3)), rng.standard_normal((1, 2, 6, 3))
    bias = rng.standard_normal((1, 1, 4, 6))
    q[0, 1, 2, 0] = np.nan
    bias[0, 0, 1] = -np.inf  # a row masked everywhere
    vs = [pullback.var(n, shape=x.shape, dtype="float64") for n, x in zip("qkvb", (q, k, v, bias))]
    mod = pullback.IRModule.from_expr(Function(vs, op.nn.attention(*vs, scale=0.5)))
    out, lse = (np.asarray(r) for r in pullback.build(mod, target=target)["main"](q, k, v, bias))
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        *(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(bias).expand(1, 2, 4, 6), scale=0.5)
    np.testing.assert_allclose(out, want[0].numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want[1].numpy(), rtol=1e-12, atol=1e-12)
    assert np.isnan(lse[0, 1, 2]) and lse[0, 0, 1] == 0
