"""nn.* operators: forward and vjp against PyTorch, gradient rules against finite differences, kernel dtypes.

One table of cases (``CASES``) drives every check; conv and pool cases cover
strides, padding (symmetric and (top, left, bottom, right)), dilation, groups,
depthwise, non-square kernels and sizes the stride does not divide.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.analysis import infer_expr
from pullback.ir.errors import TypeInferenceError
from opgrad import case, check_ad, check_rule, dtype_check, torch_check
from test_grouped import GROUPED

RNG = np.random.default_rng(7)


def normal(*shape):
    return RNG.standard_normal(shape)


def positive(*shape):
    return RNG.uniform(0.2, 1.0, shape)


# cases added later draw from their own generator: the earlier cases keep their inputs
FRESH = np.random.default_rng(65)


def fresh_normal(*shape):
    return FRESH.standard_normal(shape)


def fresh_positive(*shape):
    return FRESH.uniform(0.2, 1.0, shape)


def F(name, *a, **k):  # torch.nn.functional by name, resolved lazily
    def f(*xs):
        import torch.nn.functional as tF

        return getattr(tF, name)(*xs, *a, **k)

    return f


def torch_pad(x, p):  # (top, left, bottom, right) as torch wants it
    import torch.nn.functional as tF

    return tF.pad(x, (p[1], p[3], p[0], p[2]))


def conv_case(n, c, h, w, o, k, s=(1, 1), p=(0, 0, 0, 0), d=(1, 1), g=1):
    kw = dict(strides=s, padding=p, dilation=d, groups=g)
    return case("nn.conv2d", normal(n, c, h, w), normal(o, c // g, *k), attrs=kw,
                torch=lambda x, wt: F("conv2d", stride=s, dilation=d, groups=g)(torch_pad(x, p), wt),
                id=f"conv2d-{n}x{c}x{h}x{w}-o{o}-k{k}-s{s}-p{p}-d{d}-g{g}")


def conv_bias_case(n, c, h, w, o, k, s=(1, 1), p=(0, 0, 0, 0), g=1):
    kw = dict(strides=s, padding=p, groups=g)
    return case("nn.conv2d_bias", normal(n, c, h, w), normal(o, c // g, *k), normal(o), attrs=kw,
                torch=lambda x, wt, b: F("conv2d", stride=s, groups=g)(torch_pad(x, p), wt, b),
                id=f"conv2d_bias-{n}x{c}x{h}x{w}-o{o}-k{k}-s{s}-p{p}-g{g}")


def convT_case(n, c, h, w, o, k, s=(1, 1), p=(0, 0), d=(1, 1), g=1, op=(0, 0)):
    kw = dict(strides=s, padding=p, dilation=d, groups=g, output_padding=op)
    return case("nn.conv2d_transpose", normal(n, c, h, w), normal(c, o // g, *k), attrs=kw,
                torch=F("conv_transpose2d", stride=s, padding=p, dilation=d, groups=g, output_padding=op),
                id=f"conv2d_transpose-{n}x{c}x{h}x{w}-o{o}-k{k}-s{s}-p{p}-d{d}-g{g}-op{op}")


def pool_case(kind, shape, k, s, p=(0, 0), d=(1, 1), ceil=False, cip=None):
    attrs = dict(pool_size=k, strides=s, padding=p, ceil_mode=ceil)
    if kind == "max":
        attrs["dilation"] = d
        tf = F("max_pool2d", k, s, p, dilation=d, ceil_mode=ceil)
    else:
        attrs["count_include_pad"] = cip
        tf = F("avg_pool2d", k, s, p, ceil_mode=ceil, count_include_pad=cip)
    return case(f"nn.{kind}_pool2d", normal(*shape), attrs=attrs, torch=tf,
                id=f"{kind}_pool2d-{shape}-k{k}-s{s}-p{p}-d{d}-ceil{ceil}-cip{cip}")


def matmul_torch(ta, tb):
    return lambda a, b: (a.transpose(-1, -2) if ta else a) @ (b.transpose(-1, -2) if tb else b)


def layer_norm_torch(axis, eps=1e-5):
    def f(x, gamma, beta):
        import torch.nn.functional as tF

        xm = x.movedim(axis, -1)
        return tF.layer_norm(xm, (xm.shape[-1],), gamma, beta, eps).movedim(-1, axis)

    return f


def batch_norm_torch(training, momentum=0.1, eps=1e-5):
    def f(x, gamma, beta, mm, mv):
        import torch
        import torch.nn.functional as tF

        rm, rv = mm.detach().clone(), mv.detach().clone()
        out = tF.batch_norm(x, rm, rv, gamma, beta, training=training, momentum=momentum, eps=eps)
        if not training:  # stats pass through; tie them to the graph (zero gradient w.r.t. x)
            return out, mm + 0 * x.sum(), mv + 0 * x.sum()
        dims = [0] + list(range(2, x.ndim))  # the same update, written differentiably
        new_mm = (1 - momentum) * mm + momentum * x.mean(dims)
        new_mv = (1 - momentum) * mv + momentum * x.var(dims, unbiased=True)
        assert torch.allclose(new_mm, rm) and torch.allclose(new_mv, rv), "running-stat formula differs from PyTorch's"
        return out, new_mm, new_mv

    return f


def statistics_torch(x, stat, eps, keepdim):
    """``(mean, rstd)`` over ``stat``, written differentiably (ATen's native_* ops do not differentiate them)."""
    mean = x.mean(stat, keepdim=keepdim)
    return mean, (x.var(stat, unbiased=False, keepdim=keepdim) + eps).rsqrt()


def native_layer_norm_torch(axis, eps=1e-5):
    def f(x, gamma, beta):
        return (layer_norm_torch(axis, eps)(x, gamma, beta),) + statistics_torch(x, (axis,), eps, True)

    return f


def native_batch_norm_torch(training, momentum=0.1, eps=1e-5):
    def f(x, gamma, beta, mm, mv):
        out = batch_norm_torch(training, momentum, eps)(x, gamma, beta, mm, mv)
        if training:
            return out + statistics_torch(x, [0] + list(range(2, x.ndim)), eps, False)
        return out + (mm + 0 * x.sum(), (mv + eps).rsqrt() + 0 * x.sum())  # tied to the graph, as the moving ones

    return f


def saved_norm_grad_torch(kind, axis=-1):
    """ATen's native_layer_norm_backward / native_batch_norm_backward (the statistics given), written with
    differentiable ops: its vjp covers the statistics too."""

    def f(g, x, gamma, mean, rstd):
        nd = x.ndim
        stat = (axis % nd,) if kind == "layer" else tuple(i for i in range(nd) if i != axis % nd)
        others = tuple(i for i in range(nd) if i != axis % nd)
        shape = [1] * nd
        shape[axis] = -1
        if kind == "batch":
            mean, rstd = mean.reshape(shape), rstd.reshape(shape)
        xhat = (x - mean) * rstd
        gx = g * gamma.reshape(shape)
        dx = rstd * (gx - gx.mean(stat, keepdim=True) - xhat * (gx * xhat).mean(stat, keepdim=True))
        return dx, (g * xhat).sum(others), g.sum(others)

    return f


def cross_entropy_torch(x, t):
    return -(x.log() * t).sum() / x.shape[0]


def targets(shape, c, ignore=None):
    t = RNG.integers(0, c, shape)
    if ignore is not None:
        t.flat[0] = ignore
    return t


_HARD = np.random.default_rng(13).standard_normal  # its own generator: the other cases keep their inputs


def hardsigmoid_exact(x):
    """``relu6(x + 3) / 6`` in torch ops: ATen's float64 ``hardsigmoid_backward`` multiplies by 1/6 rounded to
    float32 (a float constant), 3e-8 off; ours is exact."""
    import torch

    return torch.clamp(x + 3, 0, 6) / 6


def hardsigmoid_back(g, x):
    return g * ((x > -3) & (x < 3)).to(g.dtype) / 6


ACTIVATIONS = [
    case("nn.relu", normal(2, 3), torch=F("relu")),
    case("nn.leaky_relu", normal(2, 5), attrs=dict(alpha=0.2), torch=F("leaky_relu", 0.2)),
    case("nn.gelu", normal(3, 4), torch=F("gelu")),
    case("nn.gelu", normal(3, 4), attrs=dict(approximate="tanh"), torch=F("gelu", approximate="tanh"), id="gelu-tanh"),
    case("nn.silu", normal(2, 3, 2), torch=F("silu")),
    case("nn.hardswish", _HARD((3, 8)) * 3, torch=F("hardswish")),
    case("nn.hardsigmoid", _HARD((3, 8)) * 3, torch=hardsigmoid_exact),
    case("nn.softplus", normal(3, 4) * 3, torch=F("softplus")),
    case("nn.softplus", normal(3, 4) * 3, attrs=dict(beta=2.0, threshold=3.0), torch=F("softplus", 2.0, 3.0), id="softplus-b2-t3"),
    case("nn.mish", fresh_normal(3, 4) * 3, torch=F("mish")),
    case("nn.mish", np.array([-100.0, -30.0, 0.0, 30.0, 100.0]), torch=F("mish"), id="mish-saturated"),
    case("nn.softmax", normal(3, 5), torch=F("softmax", dim=-1)),
    case("nn.softmax", normal(2, 3, 4), attrs=dict(axis=1), torch=F("softmax", dim=1), id="softmax-axis1"),
    case("nn.log_softmax", normal(3, 5), torch=F("log_softmax", dim=-1)),
    case("nn.log_softmax", normal(2, 3, 4), attrs=dict(axis=0), torch=F("log_softmax", dim=0), id="log_softmax-axis0"),
]

LINEAR = (
    [case("nn.dense", normal(*xs), normal(4, xs[-1]), torch=F("linear")) for xs in [(3, 5), (2, 3, 5), (5,)]]
    + [case("nn.linear", normal(*xs), normal(4, xs[-1]), normal(4), torch=F("linear"), id=f"linear-{len(xs)}d")
       for xs in [(3, 5), (2, 3, 5), (5,)]]
    + [case("nn.matmul", normal(*((4, 3) if ta else (3, 4))), normal(*((5, 4) if tb else (4, 5))),
            attrs=dict(transpose_a=ta, transpose_b=tb), torch=matmul_torch(ta, tb), id=f"matmul-ta{ta}-tb{tb}")
       for ta in (False, True) for tb in (False, True)]
    + [case("nn.batch_matmul", normal(ba, *((4, 3) if ta else (3, 4))), normal(bb, *((5, 4) if tb else (4, 5))),
            attrs=dict(transpose_a=ta, transpose_b=tb), torch=matmul_torch(ta, tb),
            id=f"batch_matmul-{ba}x{bb}-ta{ta}-tb{tb}")
       for ta, tb, ba, bb in [(False, True, 2, 2), (False, False, 2, 2), (True, True, 2, 2), (True, False, 1, 3), (False, True, 3, 1)]]
    + [case("nn.bias_add", normal(2, 3, 2, 2), normal(3), torch=lambda x, b: x + b[:, None, None]),
       case("nn.bias_add", normal(2, 4), normal(4), attrs=dict(axis=-1), torch=lambda x, b: x + b, id="bias_add-axis-1")]
)

CONV = [
    conv_case(2, 3, 5, 5, 4, (3, 3)),
    conv_case(2, 3, 7, 8, 4, (3, 2), s=(2, 1), p=(1, 0, 2, 1), d=(1, 2)),  # non-square, asymmetric pad
    conv_case(1, 2, 8, 7, 3, (2, 3), s=(3, 2), p=(1, 1, 1, 1)),  # stride does not divide
    conv_case(2, 4, 6, 6, 6, (3, 3), s=(2, 2), p=(1, 1, 1, 1), g=2),  # groups
    conv_case(1, 4, 6, 5, 4, (3, 3), s=(1, 2), p=(1, 1, 1, 1), d=(2, 1), g=4),  # depthwise
    conv_case(1, 3, 5, 5, 6, (3, 1), s=(2, 2), g=3),  # depthwise with multiplier 2
    convT_case(2, 3, 4, 4, 2, (3, 3)),
    convT_case(1, 4, 3, 4, 6, (3, 2), s=(2, 3), p=(1, 0), d=(1, 2), g=2, op=(1, 2)),
    convT_case(1, 2, 3, 3, 2, (2, 2), s=(2, 2), p=(1, 1), g=2, op=(1, 0)),
]

POOL = [
    pool_case("max", (2, 3, 6, 6), (2, 2), (2, 2)),
    pool_case("max", (1, 2, 7, 6), (3, 2), (2, 1), p=(1, 1), ceil=True),
    pool_case("max", (1, 2, 7, 8), (2, 3), (2, 3), p=(1, 1), d=(2, 1)),
    pool_case("max", (1, 1, 5, 5), (2, 2), (2, 2), ceil=True),
    pool_case("avg", (2, 3, 6, 6), (2, 2), (2, 2), cip=False),
    pool_case("avg", (1, 2, 7, 6), (3, 2), (2, 1), p=(1, 1), ceil=True, cip=True),
    pool_case("avg", (1, 2, 7, 6), (3, 3), (2, 2), p=(1, 1), ceil=True, cip=False),
    pool_case("avg", (1, 2, 5, 7), (2, 3), (3, 2), p=(1, 1), cip=True),
    case("nn.global_avg_pool2d", normal(2, 3, 4, 5), torch=F("adaptive_avg_pool2d", 1)),
    case("nn.adaptive_avg_pool2d", normal(2, 3, 7, 5), attrs=dict(output_size=(3, 2)), torch=F("adaptive_avg_pool2d", (3, 2))),
    case("nn.adaptive_avg_pool2d", normal(1, 2, 4, 6), attrs=dict(output_size=(None, 4)), torch=F("adaptive_avg_pool2d", (4, 4)),
         id="adaptive_avg_pool2d-none"),
]


def _bilinear(size=None, align_corners=False, scale=None):
    if scale is not None:
        return F("interpolate", scale_factor=scale, mode="bilinear", align_corners=align_corners, recompute_scale_factor=False)
    return F("interpolate", size=size, mode="bilinear", align_corners=align_corners)


def _bilinear_back(size, in_size, align_corners=False, scales=(None, None)):
    return lambda g: aten("upsample_bilinear2d_backward")(g, size, [*g.shape[:2], *in_size], align_corners, *scales)


IMAGE = [  # bilinear resizing: up, down, a scale factor that is not the sizes' ratio, one pixel
    case("image.resize2d", fresh_normal(2, 3, 5, 7), attrs=dict(size=(10, 14)), torch=_bilinear((10, 14))),
    case("image.resize2d", fresh_normal(2, 3, 5, 7), attrs=dict(size=(8, 11), coordinate_transformation_mode="align_corners"),
         torch=_bilinear((8, 11), True), id="resize2d-align_corners"),
    case("image.resize2d", fresh_normal(1, 2, 7, 9), attrs=dict(size=(3, 4)), torch=_bilinear((3, 4)), id="resize2d-down"),
    case("image.resize2d", fresh_normal(1, 2, 7, 9), attrs=dict(size=(10, 13), scales=(1.5, 1.5)), torch=_bilinear(scale=1.5),
         id="resize2d-scales"),
    case("image.resize2d", fresh_normal(1, 2, 4, 3), attrs=dict(size=(1, 1), coordinate_transformation_mode="align_corners"),
         torch=_bilinear((1, 1), True), id="resize2d-one-pixel"),
    case("image.resize2d_grad", fresh_normal(2, 3, 10, 14), attrs=dict(size=(10, 14), in_size=(5, 7)),
         torch=_bilinear_back([10, 14], (5, 7))),
    case("image.resize2d_grad", fresh_normal(1, 2, 10, 13), attrs=dict(size=(10, 13), in_size=(7, 9), scales=(1.5, 1.5)),
         torch=_bilinear_back([10, 13], (7, 9), scales=(1.5, 1.5)), id="resize2d_grad-scales"),
    case("image.resize2d_grad", fresh_normal(1, 2, 3, 4), attrs=dict(size=(3, 4), in_size=(7, 9),
                                                            coordinate_transformation_mode="align_corners"),
         torch=_bilinear_back([3, 4], (7, 9), True), id="resize2d_grad-align_corners-down"),
]

NORM = [
    case("nn.layer_norm", normal(3, 5), normal(5), normal(5), torch=layer_norm_torch(-1)),
    case("nn.layer_norm", normal(2, 4, 3), normal(4), normal(4), attrs=dict(axis=1, epsilon=1e-3),
         torch=layer_norm_torch(1, 1e-3), id="layer_norm-axis1"),
    case("nn.layer_norm", normal(2, 4), normal(4), normal(4), attrs=dict(center=False, scale=False),
         torch=lambda x, g, b: layer_norm_torch(-1)(x, None, None), wrt=[0], id="layer_norm-plain"),
    case("nn.batch_norm", normal(4, 3, 2, 2), normal(3), normal(3), normal(3), positive(3), wrt=[0, 1, 2],
         torch=batch_norm_torch(False), id="batch_norm-inference"),
    case("nn.batch_norm", normal(4, 3, 2, 2), normal(3), normal(3), normal(3), positive(3), attrs=dict(training=True, momentum=0.3),
         torch=batch_norm_torch(True, 0.3), wrt=[0, 1, 2], id="batch_norm-training"),
]
# the normalisations that keep their statistics (PyTorch's native_* ops)
NATIVE_NORM = [
    case("nn.native_layer_norm", normal(3, 5), normal(5), normal(5), torch=native_layer_norm_torch(-1)),
    case("nn.native_layer_norm", normal(2, 4, 3), normal(4), normal(4), attrs=dict(axis=1, epsilon=1e-3),
         torch=native_layer_norm_torch(1, 1e-3), id="native_layer_norm-axis1"),
    case("nn.native_batch_norm", normal(4, 3, 2, 2), normal(3), normal(3), normal(3), positive(3),
         attrs=dict(training=True, momentum=0.3), torch=native_batch_norm_torch(True, 0.3), wrt=[0, 1, 2],
         id="native_batch_norm-training"),
    case("nn.native_batch_norm", normal(4, 3, 2, 2), normal(3), normal(3), normal(3), positive(3),
         torch=native_batch_norm_torch(False), wrt=[0, 1, 2], id="native_batch_norm-inference"),
    case("nn.native_layer_norm_grad", normal(3, 5), normal(3, 5), normal(5), normal(3, 1), positive(3, 1),
         torch=saved_norm_grad_torch("layer")),
    case("nn.native_layer_norm_grad", normal(2, 4, 3), normal(2, 4, 3), normal(4), normal(2, 1, 3), positive(2, 1, 3),
         attrs=dict(axis=1), torch=saved_norm_grad_torch("layer", 1), id="native_layer_norm_grad-axis1"),
    case("nn.native_batch_norm_grad", normal(4, 3, 2, 2), normal(4, 3, 2, 2), normal(3), normal(3), positive(3),
         torch=saved_norm_grad_torch("batch", 1)),
    case("nn.native_batch_norm_grad", normal(5, 3), normal(5, 3), normal(3), normal(3), positive(3), attrs=dict(axis=-1),
         torch=saved_norm_grad_torch("batch", -1), id="native_batch_norm_grad-axis-1"),
]
# every input, including the moving statistics (PyTorch does not differentiate those)
NORM_FD = [
    case("nn.batch_norm", normal(4, 3, 2), normal(3), normal(3), normal(3), positive(3), id="batch_norm-inference-all"),
    case("nn.batch_norm", normal(4, 3, 2), normal(3), normal(3), normal(3), positive(3), attrs=dict(training=True),
         id="batch_norm-training-all"),
    case("nn.batch_norm", normal(5, 3), normal(3), normal(3), normal(3), positive(3), attrs=dict(axis=-1, training=True, scale=False),
         wrt=[0, 2, 3, 4], id="batch_norm-training-axis-1-noscale"),
    case("nn.native_batch_norm", normal(5, 3), normal(3), normal(3), normal(3), positive(3), attrs=dict(axis=-1, training=True),
         id="native_batch_norm-training-all"),
    case("nn.native_batch_norm", normal(4, 3, 2), normal(3), normal(3), normal(3), positive(3), id="native_batch_norm-inference-all"),
    case("nn.native_layer_norm_grad", normal(2, 4), normal(2, 4), normal(4), normal(2, 1), positive(2, 1),
         attrs=dict(scale=False, center=False), wrt=[0, 1, 3, 4], id="native_layer_norm_grad-plain"),
    case("nn.native_batch_norm_grad", normal(4, 3, 2), normal(4, 3, 2), normal(3), normal(3), positive(3),
         attrs=dict(center=False), id="native_batch_norm_grad-nocenter"),
]

MISC = [
    case("nn.dropout", normal(3, 4), (RNG.uniform(size=(3, 4)) > 0.3).astype("float64"), attrs=dict(rate=0.3),
         torch=lambda x, m: x * m / 0.7),
    case("nn.dropout", normal(3, 4), (RNG.uniform(size=(4,)) > 0.5).astype("float64"), attrs=dict(rate=0.5),
         torch=lambda x, m: x * m / 0.5, id="dropout-broadcast-mask"),
    case("nn.batch_flatten", normal(2, 3, 2), torch=lambda x: x.flatten(1)),
    case("nn.pad", normal(2, 3), attrs=dict(pad_width=((1, 0), (2, 1)), pad_value=0.5),
         torch=F("pad", (2, 1, 1, 0), value=0.5)),
    case("nn.pad", normal(3, 5), attrs=dict(pad_width=((-1, 1), (2, -2))), torch=F("pad", (2, -2, -1, 1)), id="pad-crop"),
    case("nn.pad", normal(1, 2, 4, 5), attrs=dict(pad_width=((0, 0), (0, 0), (2, 1), (3, 1)), pad_mode="reflect"),
         torch=F("pad", (3, 1, 2, 1), mode="reflect"), id="pad-reflect"),
    case("nn.pad", normal(1, 2, 3, 2), attrs=dict(pad_width=((0, 0), (0, 0), (2, 1), (3, 4)), pad_mode="edge"),
         torch=F("pad", (3, 4, 2, 1), mode="replicate"), id="pad-edge"),
    case("nn.cross_entropy", positive(3, 4), positive(3, 4), torch=cross_entropy_torch),
    case("nn.cross_entropy_with_logits", normal(3, 4), positive(3, 4), torch=lambda x, t: -(x * t).sum() / x.shape[0]),
    case("nn.nll_loss", normal(4, 5), targets((4,), 5), positive(5), torch=lambda x, t, w: F("nll_loss", weight=w)(x, t)),
    case("nn.nll_loss", normal(3, 4, 2), targets((3, 2), 4, ignore=1), positive(4), attrs=dict(reduction="sum", ignore_index=1),
         torch=lambda x, t, w: F("nll_loss", weight=w, reduction="sum", ignore_index=1)(x, t), wrt=[0], id="nll_loss-sum-ignore"),
    case("nn.nll_loss", normal(4, 3), targets((4,), 3, ignore=-100), positive(3), attrs=dict(reduction="none"),
         torch=lambda x, t, w: F("nll_loss", weight=w, reduction="none")(x, t), wrt=[0], id="nll_loss-none-ignore"),
]


def fake_quant_torch(qmin: int, qmax: int):
    """ATen's fake quantization of x by a broadcast scale and zero point (per tensor, or per channel)."""
    def f(x, scale, zp):
        import torch

        zi = zp.reshape(-1).to(torch.int32)
        axis = [i for i, d in enumerate(scale.shape) if d != 1]
        if not axis:
            return torch.fake_quantize_per_tensor_affine(x, scale.reshape(()), zi.reshape(()), qmin, qmax)
        return torch.fake_quantize_per_channel_affine(x, scale.reshape(-1).float(), zi, axis[0], qmin, qmax)
    return f


# scales that are powers of two: float32 and float64 reciprocals agree (ATen's per-channel kernel takes float32)
PER_CHANNEL_Q = (np.array([0.125, 0.25, 0.5, 0.0625]).reshape(1, 4, 1), np.array([0.0, 1.0, 2.0, -3.0]).reshape(1, 4, 1))
MISC += [
    case("nn.fake_quantize", normal(3, 4) * 2, np.array(0.125), np.array(3.0), attrs=dict(quant_min=-20, quant_max=20),
         torch=fake_quant_torch(-20, 20), wrt=[0], fd=False),  # the straight-through gradient is not the derivative
    case("nn.fake_quantize", normal(2, 4, 3), *PER_CHANNEL_Q, attrs=dict(quant_min=-8, quant_max=7),
         torch=fake_quant_torch(-8, 7), wrt=[0], fd=False, id="fake_quantize-per-channel"),
]


def _attention_scores(torch, q, k, bias, scale: float, causal: bool):
    """``q k^T scale + bias`` (-inf above the diagonal when causal) and which rows are masked everywhere."""
    s = q @ k.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    dead = torch.isinf(s).all(-1, keepdim=True) & (s < 0).all(-1, keepdim=True)
    return s.masked_fill(dead, 0.0), dead


def shared_heads(x, heads: int):
    """Keys or values (torch or NumPy) with each head repeated to the queries' ``heads`` (grouped-query attention:
    query head h reads head h // (heads / Hkv)); differentiable, so their gradients add over the sharing heads."""
    n = heads // x.shape[1]
    return x if n == 1 else (x.repeat_interleave(n, 1) if hasattr(x, "repeat_interleave") else np.repeat(x, n, 1))


def attention_torch(scale: float, causal: bool):
    """softmax(q k^T scale + bias) v and the rows' log-sum-exp, by their definition (float64, autograd through
    both); a row masked everywhere gives 0 and a log-sum-exp of 0, as ATen's kernel does."""
    def f(q, k, v, bias=None):
        import torch

        k, v = shared_heads(k, q.shape[1]), shared_heads(v, q.shape[1])
        s, dead = _attention_scores(torch, q, k, bias, scale, causal)
        live = (~dead).to(s.dtype)
        return (torch.softmax(s, -1) * live) @ v, torch.logsumexp(s, -1) * live[..., 0]
    return f


_ATT = np.random.default_rng(11).standard_normal  # its own generator: the other cases keep their inputs


def attention_grad_torch(scale: float, causal: bool):
    """dq, dk, dv by flash attention's backward formulas (float64, differentiable: the reference of the second
    derivative)."""
    def f(g, q, k, v, o, lse, bias=None):
        import torch

        kv = k.shape[1]
        k, v = shared_heads(k, q.shape[1]), shared_heads(v, q.shape[1])
        s, dead = _attention_scores(torch, q, k, bias, scale, causal)
        p = torch.exp(s - lse[..., None]) * (~dead).to(s.dtype)
        ds = p * (g @ v.transpose(-1, -2) - (g * o).sum(-1, keepdim=True))

        def fold(d):  # summed over the query heads sharing a key/value head
            return d.reshape(d.shape[0], kv, -1, *d.shape[2:]).sum(2)

        return ds @ k * scale, fold(ds.transpose(-1, -2) @ q * scale), fold(p.transpose(-1, -2) @ g)
    return f


def attention_grad_inputs(q, k, v, scale: float, causal: bool, bias=None) -> tuple:
    """(out_grad, q, k, v, out, lse[, bias]) with the out and lse attention gives for q, k, v (and bias)."""
    s = q @ np.swapaxes(shared_heads(k, q.shape[1]), -1, -2) * scale + (0.0 if bias is None else bias)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    live = np.isfinite(m)
    e = np.exp(s - np.where(live, m, 0.0))
    z = e.sum(-1, keepdims=True)
    out = (e / np.where(live, z, 1.0)) @ shared_heads(v, q.shape[1])
    lse = np.where(live, m + np.log(np.where(live, z, 1.0)), 0.0)[..., 0]
    return (_ATT(q.shape), q, k, v, out, lse) + (() if bias is None else (bias,))


_LEAST = np.random.default_rng(12).standard_normal


def least_value_row(shape: tuple, row: int) -> np.ndarray:
    """A random additive bias of ``shape`` with float64's least value over the whole query row ``row``."""
    b = _LEAST(shape)
    b[..., row, :] = np.finfo(np.float64).min
    return b


def padding_bias(shape: tuple, *masked) -> np.ndarray:
    """A random additive bias of ``shape`` with -inf at each index of ``masked``."""
    b = _ATT(shape)
    for index in masked:
        b[index] = -np.inf
    return b


MISC += [
    case("nn.attention", _ATT((2, 3, 5, 4)), _ATT((2, 3, 7, 4)), _ATT((2, 3, 7, 4)), attrs=dict(scale=0.4),
         torch=attention_torch(0.4, False)),
    case("nn.attention", _ATT((1, 2, 6, 3)), _ATT((1, 2, 4, 3)), _ATT((1, 2, 4, 3)), attrs=dict(scale=0.7, is_causal=True),
         torch=attention_torch(0.7, True), id="attention-causal"),
    case("nn.attention_grad", *attention_grad_inputs(_ATT((2, 2, 5, 4)), _ATT((2, 2, 6, 4)), _ATT((2, 2, 6, 4)), 0.4, False),
         attrs=dict(scale=0.4), torch=attention_grad_torch(0.4, False)),
    case("nn.attention_grad", *attention_grad_inputs(_ATT((1, 2, 6, 3)), _ATT((1, 2, 4, 3)), _ATT((1, 2, 4, 3)), 0.7, True),
         attrs=dict(scale=0.7, is_causal=True), torch=attention_grad_torch(0.7, True), id="attention_grad-causal"),
    case("nn.attention", _ATT((2, 3, 5, 4)), _ATT((2, 3, 7, 4)), _ATT((2, 3, 7, 4)),
         padding_bias((2, 1, 5, 7), (0, 0, 1, slice(4, None)), (1, 0, slice(None), 0)), attrs=dict(scale=0.4),
         torch=attention_torch(0.4, False), id="attention-bias"),
    case("nn.attention", _ATT((1, 2, 4, 3)), _ATT((1, 2, 6, 3)), _ATT((1, 2, 6, 3)),
         padding_bias((1, 2, 4, 6), (0, 1, 2, slice(None))), attrs=dict(scale=0.6),  # a row masked everywhere
         torch=attention_torch(0.6, False), id="attention-bias-masked-row"),
    case("nn.attention", _ATT((1, 2, 6, 3)), _ATT((1, 2, 4, 3)), _ATT((1, 2, 4, 3)), _ATT((1, 2, 1, 4)),
         attrs=dict(scale=0.7, is_causal=True), torch=attention_torch(0.7, True), id="attention-bias-causal"),
    case("nn.attention_grad", *attention_grad_inputs(_ATT((2, 3, 5, 4)), _ATT((2, 3, 7, 4)), _ATT((2, 3, 7, 4)), 0.4, False,
                                                     padding_bias((2, 1, 1, 7), (1, 0, 0, slice(5, None)))),
         attrs=dict(scale=0.4), torch=attention_grad_torch(0.4, False), id="attention_grad-bias"),
    case("nn.attention_grad", *attention_grad_inputs(_ATT((1, 2, 4, 3)), _ATT((1, 2, 6, 3)), _ATT((1, 2, 6, 3)), 0.6, False,
                                                     padding_bias((1, 1, 4, 6), (0, 0, 3, slice(None)))),
         attrs=dict(scale=0.6), torch=attention_grad_torch(0.6, False), id="attention_grad-bias-masked-row"),
    # a row covered by the dtype's least value (Hugging Face's eager mask over a left-padded query): eager's softmax
    # spreads it over the keys, and its log-sum-exp has no bits left for the sum's logarithm. Not against finite
    # differences: the least value absorbs any small change of the scores, so the row is locally constant. The
    # bias's own gradient there is left out: it is computed from exp(s - lse) in pullback's operators
    case("nn.attention", *(_LEAST((1, 2, 4, 3)), _LEAST((1, 2, 6, 3)), _LEAST((1, 2, 6, 3))), least_value_row((1, 2, 4, 6), 1),
         attrs=dict(scale=0.6), torch=attention_torch(0.6, False), wrt=[0, 1, 2], fd=False, id="attention-bias-least-value-row"),
    # grouped-query attention: fewer key/value heads, each shared by H / Hkv query heads
    case("nn.attention", _ATT((2, 4, 5, 4)), _ATT((2, 2, 7, 4)), _ATT((2, 2, 7, 4)), attrs=dict(scale=0.4),
         torch=attention_torch(0.4, False), id="attention-gqa"),
    case("nn.attention", _ATT((1, 6, 6, 3)), _ATT((1, 2, 4, 3)), _ATT((1, 2, 4, 3)), _ATT((1, 6, 1, 4)),
         attrs=dict(scale=0.7, is_causal=True), torch=attention_torch(0.7, True), id="attention-gqa-bias-causal"),
    case("nn.attention_grad", *attention_grad_inputs(_ATT((2, 4, 5, 4)), _ATT((2, 2, 7, 4)), _ATT((2, 2, 7, 4)), 0.4, False),
         attrs=dict(scale=0.4), torch=attention_grad_torch(0.4, False), id="attention_grad-gqa"),
    case("nn.attention_grad", *attention_grad_inputs(_ATT((1, 6, 4, 3)), _ATT((1, 3, 6, 3)), _ATT((1, 3, 6, 3)), 0.6, True,
                                                     padding_bias((1, 1, 4, 6), (0, 0, 3, slice(None)))),
         attrs=dict(scale=0.6, is_causal=True), torch=attention_grad_torch(0.6, True), id="attention_grad-gqa-bias-causal"),
]


def _bce(reduction, weighted=False, pos_weighted=False):
    def f(z, y, w, pw):
        import torch.nn.functional as tF

        return tF.binary_cross_entropy_with_logits(z, y, w if weighted else None, reduction=reduction,
                                                   pos_weight=pw if pos_weighted else None)

    return f


MISC += [  # soft targets (a gradient for them too, PyTorch's); the weights get none, as in PyTorch
    case("nn.binary_cross_entropy_with_logits", normal(4, 3) * 3, RNG.uniform(0, 1, (4, 3)), np.ones(()), np.ones(()),
         torch=_bce("mean"), wrt=[0, 1], id="bce_with_logits-mean"),
    case("nn.binary_cross_entropy_with_logits", normal(4, 3) * 3, RNG.uniform(0, 1, (4, 3)), positive(4, 1), positive(3),
         attrs=dict(reduction="sum", weighted=True, pos_weighted=True), torch=_bce("sum", True, True), wrt=[0, 1],
         id="bce_with_logits-sum-weights"),
    case("nn.binary_cross_entropy_with_logits", normal(2, 3, 2) * 30, RNG.uniform(0, 1, (2, 3, 2)), np.ones(()), positive(2),
         attrs=dict(reduction="none", pos_weighted=True), torch=_bce("none", False, True), wrt=[0, 1],
         id="bce_with_logits-none-saturated"),
]
HELPERS_BCE = [
    case("nn.binary_cross_entropy_with_logits_grad", np.array(0.7), fresh_normal(4, 3), FRESH.uniform(0, 1, (4, 3)), np.ones(()),
         np.ones(()), wrt=[0, 1, 2], id="bce_with_logits_grad-mean"),
    case("nn.binary_cross_entropy_with_logits_grad", fresh_normal(4, 3), fresh_normal(4, 3), FRESH.uniform(0, 1, (4, 3)), fresh_positive(4, 3),
         fresh_positive(3), attrs=dict(reduction="none", weighted=True, pos_weighted=True), wrt=[0, 1, 2],
         id="bce_with_logits_grad-none-weights"),
    case("nn.binary_cross_entropy_with_logits_grad", np.array(1.3), fresh_normal(4, 3), FRESH.uniform(0, 1, (4, 3)), fresh_positive(3),
         fresh_positive(3), attrs=dict(reduction="sum", weighted=True, pos_weighted=True), wrt=[0, 1, 2],
         id="bce_with_logits_grad-sum-weights"),
]
for _c in MISC:
    if _c.op == "nn.nll_loss":
        _c.wrt = [0]  # weights are constants, as in PyTorch

ATEN_RNN = {"lstm": "lstm", "gru": "gru", "rnn": "rnn_tanh", "rnn-relu": "rnn_relu"}


def rnn_torch(cell: str, reverse=False):
    """One LSTM, GRU or Elman RNN layer by ATen's ``lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` (eager's), the
    reversed direction over the flipped sequence: ``(y, h_T[, c_T])``."""
    def f(x, *rest):
        import torch

        n = 2 if cell == "lstm" else 1
        states, (w_ih, w_hh, *b) = [s[None] for s in rest[:n]], rest[n:]
        out = getattr(torch, ATEN_RNN[cell])(x.flip(0) if reverse else x, states if n == 2 else states[0],
                                             [w_ih, w_hh, *b], bool(b), 1, 0.0, False, False, False)
        y, *last = out[0], *(out[1:] if n == 2 else out[1:2])
        return ((y.flip(0) if reverse else y), *[v[0] for v in last])

    return f


def rnn_grad_torch(cell: str, reverse=False):
    """The gradients of the layer's operands by autograd through ``rnn_torch`` (``y`` unused: recomputed); an LSTM's
    or Elman RNN's one bias gradient (both biases get it)."""
    def f(*args):
        import torch

        n = 2 if cell == "lstm" else 1
        cts, (*operands, _y), b = args[:n + 1], args[n + 1:n + 5 + n], args[n + 5 + n:]
        leaves = [t.detach().requires_grad_() for t in (*operands, *b)]
        grads = torch.autograd.grad(rnn_torch(cell, reverse)(*leaves), leaves, cts)
        return grads[:len(grads) - (1 if cell != "gru" and b else 0)]

    return f


GATES = {"lstm": 4, "gru": 3, "rnn": 1, "rnn-relu": 1}


def rnn_inputs(cell: str, t, b, i, h, biases=True) -> list:
    """x, the initial states, w_ih, w_hh (and the biases)."""
    g = GATES[cell]
    states = [fresh_normal(b, h) * 0.5] + ([fresh_normal(b, h)] if cell == "lstm" else [])
    ws = [fresh_normal(t, b, i), *states, fresh_normal(g * h, i) * 0.5, fresh_normal(g * h, h) * 0.5]
    return ws + ([fresh_normal(g * h) * 0.5, fresh_normal(g * h) * 0.5] if biases else [])


def rnn_grad_inputs(cell: str, reverse, *dims, biases=True) -> list:
    """Cotangents, the layer's operands and its hidden states ``y`` (pullback's NumPy kernel: checked against
    ATen's by the layer's cases)."""
    ops = rnn_inputs(cell, *dims, biases=biases)
    t, b, _, h = dims
    layer = pullback.ops.get_op(f"nn.{cell.split('-')[0]}")
    y = layer.compute(*ops, layer.make_attrs(reverse=reverse, **_elman(cell)))[0]
    n = len(ops) - (2 if biases else 0)
    return [fresh_normal(t, b, h)] + [fresh_normal(b, h) for _ in range(n - 3)] + ops[:n] + [y] + ops[n:]


def _elman(cell: str) -> dict:
    return dict(nonlinearity="relu") if cell == "rnn-relu" else {}


def rnn_cases(cell: str) -> list:
    """One layer over a sequence, each direction, with and without biases; its gradient (no rule of its own: AD
    differentiates its expansion, test_a_recurrent_gradient_is_differentiated_through_its_expansion)."""
    op, kw = f"nn.{cell.split('-')[0]}", _elman(cell)
    return [
        case(op, *rnn_inputs(cell, 4, 2, 3, 5), attrs=kw, torch=rnn_torch(cell), id=cell),
        case(op, *rnn_inputs(cell, 3, 2, 4, 3, biases=False), attrs=dict(reverse=True, **kw), torch=rnn_torch(cell, True),
             id=f"{cell}-reverse-nobias"),
        case(op, *rnn_inputs(cell, 1, 3, 2, 2), attrs=dict(reverse=True, **kw), torch=rnn_torch(cell, True),
             id=f"{cell}-one-step"),
        case(f"{op}_grad", *rnn_grad_inputs(cell, False, 4, 2, 3, 5), attrs=kw, torch=rnn_grad_torch(cell), fd=False,
             id=f"{cell}_grad", wrt=_smooth_in(cell, 9)),
        case(f"{op}_grad", *rnn_grad_inputs(cell, True, 3, 2, 4, 3, biases=False), attrs=dict(reverse=True, **kw),
             torch=rnn_grad_torch(cell, True), fd=False, id=f"{cell}_grad-reverse-nobias", wrt=_smooth_in(cell, 7)),
    ]


def _smooth_in(cell: str, operands: int):
    """The operands a gradient case is differentiated in: relu's slope is a step in ``y`` (operand 6, with exact
    zeros where finite differences cross it), so an Elman relu gradient is not differentiated in ``y``."""
    return [i for i in range(operands) if i != 6] if cell == "rnn-relu" else None


MISC += rnn_cases("lstm") + rnn_cases("gru") + rnn_cases("rnn") + rnn_cases("rnn-relu")


HELPERS = [  # gradient ops: their own rules are checked too
    case("nn.fake_quantize_grad", normal(2, 4, 3), normal(2, 4, 3) * 2, *PER_CHANNEL_Q, attrs=dict(quant_min=-8, quant_max=7),
         wrt=[0]),
    case("nn.conv2d_backward_weight", normal(1, 4, 4, 2), normal(1, 2, 7, 6),
         attrs=dict(kernel_size=(3, 2), strides=(2, 3), padding=(1, 1), dilation=(1, 2), groups=2)),
    case("nn.max_pool2d_grad", normal(1, 2, 4, 3), normal(1, 2, 7, 6), attrs=dict(pool_size=(3, 2), strides=(2, 2), padding=(1, 0)),
         wrt=[0]),
    case("nn.max_pool2d_gather", normal(1, 2, 7, 6), normal(1, 2, 7, 6), attrs=dict(pool_size=(3, 2), strides=(2, 2), padding=(1, 0)),
         wrt=[1]),
    case("nn.avg_pool2d_grad", normal(1, 2, 4, 4), normal(1, 2, 7, 6),
         attrs=dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1), ceil_mode=True), wrt=[0]),
    case("nn.adaptive_avg_pool2d_grad", normal(1, 2, 3, 2), normal(1, 2, 7, 5), attrs=dict(output_size=(3, 2)), wrt=[0]),
    case("nn.pad_backward", normal(1, 2, 7, 9), attrs=dict(pad_width=((0, 0), (0, 0), (2, 1), (3, 1)), pad_mode="reflect")),
    case("nn.pad_backward", normal(2, 7), attrs=dict(pad_width=((0, 0), (2, 3)), pad_mode="edge"), id="pad_backward-edge"),
    case("nn.nll_loss_grad", np.array(0.7), normal(4, 5), targets((4,), 5), positive(5), wrt=[0]),
    case("nn.nll_loss_grad", normal(4), normal(4, 3), targets((4,), 3, ignore=-100), positive(3), attrs=dict(reduction="none"),
         wrt=[0], id="nll_loss_grad-none"),
]



def aten(name, *a, **k):  # a torch.ops.aten function by name, resolved lazily
    def f(*xs):
        import torch

        return getattr(torch.ops.aten, name)(*xs, *a, **k)

    return f


def softmax_back(name, dim):  # ATen's _softmax_backward_data / _log_softmax_backward_data take the input dtype
    return lambda g, y: aten(f"_{name}_backward_data", dim, y.dtype)(g, y)


def norm_grad_torch(kind, axis=-1, eps=1e-5):
    """PyTorch's own first-order gradient of layer/batch norm, differentiable (create_graph): its vjp is
    PyTorch's double backward."""

    def f(g, x, gamma):
        import torch
        import torch.nn.functional as tF

        beta = torch.zeros_like(gamma, requires_grad=True)
        xin, ct = x.movedim(axis, -1 if kind == "layer" else 1), g.movedim(axis, -1 if kind == "layer" else 1)
        if kind == "layer":
            y = tF.layer_norm(xin, (xin.shape[-1],), gamma, beta, eps)
        else:
            y = tF.batch_norm(xin, None, None, gamma, beta, training=True, eps=eps)
        dx, dg, db = torch.autograd.grad(y, (xin, gamma, beta), ct, create_graph=True)
        return dx.movedim(-1 if kind == "layer" else 1, axis), dg, db

    return f


def norm_grad_case(kind, shape, axis, **attrs):
    c = shape[axis]
    return case(f"nn.{kind}_norm_grad", normal(*shape), normal(*shape), normal(c), attrs=dict(axis=axis, **attrs),
                torch=norm_grad_torch(kind, axis, attrs.get("epsilon", 1e-5)), id=f"{kind}_norm_grad-{shape}-axis{axis}")


def clamp_back(lo, hi):  # PyTorch's clamp backward (autograd), differentiable in the output gradient
    def f(g, x):
        import torch

        xv = x.detach().requires_grad_()
        return torch.autograd.grad(torch.clamp(xv, lo, hi), xv, g, create_graph=True)[0]

    return f


def silu_back(g, x):  # PyTorch's silu derivative in differentiable torch ops (ATen's silu_backward has none)
    import torch

    s = torch.sigmoid(x)
    return g * s * (1 + x * (1 - s))


def mish_back(g, x):  # PyTorch's mish derivative in differentiable torch ops (ATen's mish_backward has none)
    import torch

    t = torch.tanh(torch.nn.functional.softplus(x))
    return g * (t + x * torch.sigmoid(x) * (1 - t * t))


def on_bounds(lo, hi, *shape):
    """Normal values, every third one exactly ``lo`` or ``hi`` (clip's gradient keeps them)."""
    x = normal(*shape) * 2
    flat = x.reshape(-1)
    flat[::3] = lo
    flat[1::6] = hi
    return x


# the fused gradient operators; PyTorch references are ATen's backward functions (their vjps: double backward)
FUSED_GRADS = [
    case("nn.clip_grad", normal(4, 6), on_bounds(-0.5, 1.0, 4, 6), attrs=dict(a_min=-0.5, a_max=1.0),
         torch=clamp_back(-0.5, 1.0), wrt=[0]),
    case("nn.clip_grad", normal(2, 3, 5), on_bounds(0.0, 6.0, 2, 3, 5) * 3, attrs=dict(a_min=0.0, a_max=6.0),
         torch=clamp_back(0.0, 6.0), wrt=[0], id="clip_grad-relu6"),
    case("nn.clip_grad", normal(3, 4), on_bounds(0.0, 0.0, 3, 4), attrs=dict(a_min=0.0, a_max=math.inf),
         torch=clamp_back(0.0, None), wrt=[0], id="clip_grad-min-only"),
    case("nn.softmax_grad", normal(3, 5), positive(3, 5), torch=softmax_back("softmax", -1)),
    case("nn.softmax_grad", normal(2, 3, 4), positive(2, 3, 4), attrs=dict(axis=1), torch=softmax_back("softmax", 1),
         id="softmax_grad-axis1"),
    case("nn.log_softmax_grad", normal(3, 5), -positive(3, 5), torch=softmax_back("log_softmax", -1)),
    case("nn.log_softmax_grad", normal(2, 3, 4), -positive(2, 3, 4), attrs=dict(axis=0),
         torch=softmax_back("log_softmax", 0), id="log_softmax_grad-axis0"),
    case("nn.gelu_grad", normal(3, 4), normal(3, 4) * 2, torch=aten("gelu_backward")),
    case("nn.gelu_grad", normal(3, 4), normal(3, 4) * 2, attrs=dict(approximate="tanh"), torch=aten("gelu_backward", approximate="tanh"),
         id="gelu_grad-tanh"),
    case("nn.threshold_grad", normal(3, 4), normal(3, 4), torch=aten("threshold_backward", 0.0), wrt=[0]),
    case("nn.gelu_grad", normal(), normal(), torch=aten("gelu_backward"), id="gelu_grad-rank0"),
    case("nn.silu_grad", normal(3, 4), normal(3, 4) * 4, torch=silu_back),
    case("nn.silu_grad", normal(), normal(), torch=silu_back, id="silu_grad-rank0"),
    case("nn.hardswish_grad", _HARD((3, 8)), _HARD((3, 8)) * 3, torch=aten("hardswish_backward")),
    case("nn.hardsigmoid_grad", _HARD((3, 8)), _HARD((3, 8)) * 3, torch=hardsigmoid_back, wrt=[0]),
    case("nn.softplus_grad", normal(3, 4), normal(3, 4) * 4, torch=aten("softplus_backward", 1.0, 20.0)),
    case("nn.softplus_grad", normal(3, 4), normal(3, 4) * 2, attrs=dict(beta=2.0, threshold=1.5),
         torch=aten("softplus_backward", 2.0, 1.5), id="softplus_grad-b2-t1.5"),
    case("nn.mish_grad", fresh_normal(3, 4), fresh_normal(3, 4) * 3, torch=mish_back),
    case("tanh_grad", normal(3, 4), np.tanh(normal(3, 4) * 2), torch=aten("tanh_backward")),
    case("tanh_grad", normal(), np.tanh(normal()), torch=aten("tanh_backward"), id="tanh_grad-rank0"),
    case("sigmoid_grad", normal(3, 4), 1 / (1 + np.exp(-2 * normal(3, 4))), torch=aten("sigmoid_backward")),
    case("sigmoid_grad", normal(2, 3, 2), 1 / (1 + np.exp(-normal(2, 3, 2))), torch=aten("sigmoid_backward"),
         id="sigmoid_grad-rank3"),
    case("nn.threshold_grad", normal(), positive(), torch=aten("threshold_backward", 0.0), wrt=[0], id="threshold_grad-rank0"),
    case("nn.threshold_grad", normal(2, 5), normal(2, 5), attrs=dict(threshold=0.5), torch=aten("threshold_backward", 0.5),
         wrt=[0], id="threshold_grad-0.5"),
    case("nn.leaky_relu_grad", normal(3, 4), normal(3, 4), attrs=dict(alpha=0.2), torch=aten("leaky_relu_backward", 0.2, False),
         wrt=[0]),
    case("nn.leaky_relu_grad", normal(), -positive(), torch=aten("leaky_relu_backward", 0.01, False), wrt=[0],
         id="leaky_relu_grad-rank0"),
    norm_grad_case("layer", (3, 5), -1),
    norm_grad_case("layer", (2, 4, 3), 1, epsilon=1e-3),
    norm_grad_case("batch", (4, 3, 2, 2), 1),
    norm_grad_case("batch", (5, 3), -1),
]
# every input including gamma with scale/center off (PyTorch has no such variant)
FUSED_GRADS_FD = [
    case("nn.layer_norm_grad", normal(2, 4), normal(2, 4), normal(4), attrs=dict(scale=False, center=False), wrt=[0, 1],
         id="layer_norm_grad-plain"),
    case("nn.batch_norm_grad", normal(4, 3, 2), normal(4, 3, 2), normal(3), attrs=dict(center=False), id="batch_norm_grad-nocenter"),
]



def pooled_shape(shape, attrs) -> tuple:
    """The pooled shape of data ``shape`` under max-pool ``attrs``."""
    import pullback

    return pullback.analysis.infer_expr(pullback.op.nn.max_pool2d(pullback.var("x", shape=shape, dtype="float64"), **attrs)).shape


def pool_indices(x, **attrs):
    """The indices nn.max_pool2d_with_indices gives for ``x`` (NumPy kernel)."""
    from pullback.ops import get_op

    o = get_op("nn.max_pool2d_with_indices")
    return o.compute(x, o.make_attrs(**attrs))[1]


# (attributes, data shape): tiles, overlapping windows with padding, ceil mode, dilation, asymmetric padding
WITH_INDICES = [
    (dict(pool_size=(2, 2), strides=(2, 2)), (2, 3, 6, 6)),
    (dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1)), (1, 2, 7, 6)),
    (dict(pool_size=(3, 2), strides=(2, 1), padding=(1, 1), ceil_mode=True), (1, 2, 7, 6)),
    (dict(pool_size=(2, 3), strides=(2, 3), padding=(1, 1), dilation=(2, 1)), (1, 2, 7, 8)),
    (dict(pool_size=(2, 2), strides=(1, 2), padding=(0, 1, 1, 0)), (1, 2, 5, 6)),
]
POOL_INDICES = [  # gradient rules against finite differences (PyTorch: test_nn_program.py)
    case("nn.max_pool2d_with_indices", normal(*shape), attrs=attrs, id=f"max_pool2d_with_indices-{shape}-{k}")
    for k, (attrs, shape) in enumerate(WITH_INDICES)
] + [
    case("nn.max_pool2d_with_indices_grad", normal(*pooled_shape(shape, attrs)), x := normal(*shape), pool_indices(x, **attrs),
         attrs=attrs, wrt=[0], id=f"max_pool2d_with_indices_grad-{shape}-{k}")
    for k, (attrs, shape) in enumerate(WITH_INDICES)
]

# drawn last: the cases above keep the inputs they were written against
CONV_BIAS = [
    conv_bias_case(2, 3, 5, 5, 4, (3, 3), p=(1, 1, 1, 1)),
    conv_bias_case(1, 4, 6, 6, 4, (3, 3), s=(2, 2), p=(1, 0, 1, 0), g=4),  # depthwise
    conv_bias_case(3, 4, 1, 1, 5, (3, 3), p=(1, 1, 1, 1)),  # one tap: a GEMM plus the bias on torch
    conv_bias_case(2, 3, 3, 3, 5, (3, 3)),  # a 1x1 output: a GEMM of the windows plus the bias on torch
]

TORCH_CASES = ACTIVATIONS + LINEAR + GROUPED + CONV + CONV_BIAS + POOL + IMAGE + NORM + NATIVE_NORM + MISC + FUSED_GRADS
CASES = TORCH_CASES + NORM_FD + HELPERS + HELPERS_BCE + FUSED_GRADS_FD + POOL_INDICES


@pytest.mark.parametrize("c", TORCH_CASES, ids=repr)
def test_forward_and_vjp_match_torch(c):
    pytest.importorskip("torch")
    torch_check(c)


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_gradient_rule_matches_finite_differences(c):
    check_rule(c)


@pytest.mark.parametrize("c", [c for c in CASES if c.op in ("nn.lstm_grad", "nn.gru_grad", "nn.rnn_grad")], ids=repr)
def test_a_recurrent_gradient_is_differentiated_through_its_expansion(c):
    """``nn.lstm_grad`` and ``nn.gru_grad`` have no rule of their own: AD differentiates their step-by-step
    expansions (second derivatives of an LSTM or a GRU), against finite differences of their kernels in every
    operand."""
    check_ad(dataclasses.replace(c, fd=True))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("c", CASES, ids=repr)
def test_kernel_returns_inferred_dtype(c, dtype):
    dtype_check(c, dtype)


@pytest.mark.parametrize("shape, widths", [((1, 5), ((-2, 1), (0, 0))), ((3, 5), ((-4, 2), (0, 0))),
                                           ((3, 5), ((0, 0), (3, -6))), ((0, 5), ((-1, 1), (2, -2)))])
def test_pad_refuses_a_crop_beyond_the_axis_as_eager_does(shape, widths):
    """Negative widths crop before any padding: cropping more than an axis holds is a type error (eager: "narrow():
    length must be non-negative"), even where the padding would bring the size back (the kernel returned a row
    its type did not have)."""
    import torch
    import torch.nn.functional as F

    flat = tuple(w for pair in reversed(widths) for w in pair)
    with pytest.raises(RuntimeError, match="narrow"):
        F.pad(torch.ones(shape), flat)
    x = pullback.var("x", shape=shape)
    with pytest.raises(TypeInferenceError, match="crops more than the dimension"):
        infer_expr(op.nn.pad(x, pad_width=widths))


@pytest.mark.parametrize("widths", [((-3, 1), (0, 0)), ((-2, -1), (1, -1)), ((-1, 2), (-5, 0))])
def test_pad_crops_then_pads_as_eager_on_every_target(widths):
    import torch
    import torch.nn.functional as F

    xs = np.arange(15, dtype="float32").reshape(3, 5)
    want = F.pad(torch.from_numpy(xs), tuple(w for pair in reversed(widths) for w in pair)).numpy()
    x = pullback.var("x", shape=(3, 5))
    fn = pullback.Function([x], op.nn.pad(x, pad_width=widths))
    np.testing.assert_array_equal(pullback.build(fn)["main"](xs), want)
    np.testing.assert_array_equal(pullback.build(fn, target="torch")["main"](torch.from_numpy(xs)).numpy(), want)


@pytest.mark.parametrize("shapes, match", [
    (dict(h0=(2, 6)), r"nn\.lstm.*shapes .*\(2, 6\).* are not x \(T, B, I\).*H = 6"),  # c0 (2, 5) against h0 (2, 6)
    (dict(w_ih=(20, 4)), r"nn\.lstm.*w_ih \(4H, I\)"),  # I = 3, not 4
    (dict(x=(4, 3)), r"nn\.lstm.*expects x \(T, B, I\), h0 and c0 \(B, H\)"),
])
def test_lstm_names_the_operands_that_do_not_fit(shapes, match):
    dims = dict(x=(4, 2, 3), h0=(2, 5), c0=(2, 5), w_ih=(20, 3), w_hh=(20, 5))
    dims.update(shapes)
    xs = [pullback.var(k, shape=s, dtype="float32") for k, s in dims.items()]
    with pytest.raises(TypeInferenceError, match=match):
        infer_expr(op.nn.lstm(*xs))


def test_second_derivatives_of_an_lstm_over_a_varying_length_say_why_not():
    from pullback.ir.errors import PullbackError
    from pullback.ir.types import Any, TensorType

    dims = dict(x=(Any, 2, 3), h0=(2, 5), c0=(2, 5), w_ih=(20, 3), w_hh=(20, 5))
    xs = [pullback.var(k, TensorType(s, "float64")) for k, s in dims.items()]
    g = pullback.var("g", TensorType((Any, 2, 5), "float64"))
    zero = pullback.var("z", TensorType((2, 5), "float64"))
    y = pullback.ir.expr.TupleGetItem(op.nn.lstm(*xs), 0)
    d = pullback.ir.expr.TupleGetItem(op.nn.lstm_grad(g, zero, zero, *xs, y), 3)  # dW_ih
    mod = pullback.IRModule({"main": pullback.Function([*xs, g, zero], op.sum(d * d))})
    with pytest.raises(PullbackError, match="static sequence length"):
        pullback.transform.FirstOrderGradient(wrt=[xs[3]])(mod)
