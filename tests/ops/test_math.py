"""More elementwise math and bitwise operators: forward vs PyTorch, kernels on every namespace, gradient rules."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.analysis import infer_expr
from pullback.ir.errors import AttrError, TypeInferenceError

from namespaces import check_namespaces
from opgrad import case, check_ad, check_rule, check_second, dtype_check, torch_check

RNG = np.random.default_rng(7)
U = RNG.uniform(-0.9, 0.9, (3, 4))  # inside (-1, 1)
BIG = RNG.uniform(1.2, 3.0, (3, 4))  # > 1 (acosh)
N = RNG.standard_normal((3, 4))
OFF = np.floor(RNG.uniform(-3, 3, (3, 4))) + RNG.uniform(0.1, 0.4, (3, 4))  # away from integers
DIV = RNG.uniform(0.7, 1.6, (4,)) * RNG.choice([-1.0, 1.0], (4,))


def T(name, *a, **k):
    def f(*xs):
        import torch

        fn = getattr(torch, name)
        return fn(*xs, *a, **k)

    return f


CASES = [
    case("acos", U, torch=T("acos")), case("asin", U, torch=T("asin")), case("atan", N, torch=T("atan")),
    case("sinh", N, torch=T("sinh")), case("cosh", N, torch=T("cosh")), case("asinh", N, torch=T("asinh")),
    case("acosh", BIG, torch=T("acosh")), case("atanh", U, torch=T("atanh")), case("expm1", N * 1e-3, torch=T("expm1")),
    case("expm1", N, torch=T("expm1")), case("log10", BIG, torch=T("log10")), case("trunc", OFF, torch=T("trunc")),
    case("atan2", N, N[::-1].copy(), torch=T("atan2")), case("atan2", N, RNG.standard_normal((4,)), torch=T("atan2")),
    case("remainder", OFF * 3, DIV, torch=T("remainder")),
    case("mod", OFF * 3, DIV, torch=T("fmod")),
    case("multiply_scalar", N, attrs={"value": 0.044715}, torch=lambda x: x * 0.044715),
    case("divide_scalar", N, attrs={"value": 2.302585092994046}, torch=lambda x: x / 2.302585092994046),
]
INT_A = np.array([[5, -3, 0, 12], [7, 1, -8, 3]], dtype="int64")
INT_B = np.array([3, -2, 5, 4], dtype="int64")
BOOL_A = np.array([[True, False], [True, True]])
BOOL_B = np.array([False, True])
NONDIFF = [
    case("remainder", INT_A, INT_B, torch=T("remainder")), case("mod", INT_A, INT_B, torch=T("fmod")),
    case("bitwise_and", INT_A, INT_B, torch=T("bitwise_and")), case("bitwise_or", INT_A, INT_B, torch=T("bitwise_or")),
    case("bitwise_xor", INT_A, INT_B, torch=T("bitwise_xor")), case("bitwise_not", INT_A, torch=T("bitwise_not")),
    case("bitwise_and", BOOL_A, BOOL_B, torch=T("bitwise_and")), case("bitwise_or", BOOL_A, BOOL_B, torch=T("bitwise_or")),
    case("bitwise_xor", BOOL_A, BOOL_B, torch=T("bitwise_xor")), case("bitwise_not", BOOL_A, torch=T("bitwise_not")),
    case("bitwise_and", INT_A.astype("uint8"), INT_B.astype("uint8"), torch=T("bitwise_and")),
    # signs, zeros (gcd(0, 0) = 0, lcm(x, 0) = 0) and broadcasting; np.lcm as Reformer calls it on two ints
    case("gcd", INT_A, INT_B, torch=T("gcd")), case("lcm", INT_A, INT_B, torch=T("lcm")),
    case("gcd", np.array([0, 0, 18, -12], "int32"), np.array([0, 7, 12, -18], "int32"), torch=T("gcd")),
    case("lcm", np.array(4, "int64"), np.array([6, 10], "int64"), torch=T("lcm")),
    case("lcm", INT_A.astype("uint8"), INT_B.astype("uint8"), torch=T("lcm")),
]
ALL = CASES + NONDIFF


@pytest.mark.parametrize("c", ALL, ids=repr)
def test_forward_and_vjp_match_torch(c):
    pytest.importorskip("torch")
    torch_check(c)


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_gradient_rule_matches_finite_differences(c):
    check_rule(c)


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_ad_pass_gradient(c):
    check_ad(c)


@pytest.mark.parametrize("c", [c for c in CASES if c.op not in ("trunc",)], ids=repr)
def test_second_order(c):
    check_second(c)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("c", ALL, ids=repr)
def test_kernel_returns_inferred_dtype(c, dtype):
    dtype_check(c, dtype)


@pytest.mark.parametrize("c", ALL, ids=repr)
def test_kernel_on_every_namespace(c):
    check_namespaces(c)


def test_errors_name_the_op():
    x = pullback.var("x", shape=(2, 3))
    i = pullback.var("i", shape=(2, 3), dtype="int32")
    for e, pattern in [(op.acos(i), "acos.*floating"), (op.atan2(x, i), "atan2"), (op.bitwise_and(x, x), "bitwise_and.*integer or bool"),
                       (op.gcd(i, pullback.var("b", shape=(2, 3), dtype="bool")), "gcd.*must be an integer tensor"),
                       (op.bitwise_or(i, pullback.var("j", shape=(2, 3), dtype="int64")), "bitwise_or.*dtypes differ"),
                       (op.remainder(x, pullback.var("y", shape=(4,))), "remainder.*broadcast")]:
        with pytest.raises(TypeInferenceError, match=pattern):
            infer_expr(e)
    with pytest.raises(AttrError, match="remainder.*mode"):  # one op per rounding: remainder (floor), mod (trunc)
        op.remainder(x, x, mode="round")


def test_bitwise_ops_say_why_they_have_no_gradient():
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "gcd", "lcm"):
        o = pullback.ops.get_op(name)
        assert not o.differentiable and "integer" in o.nondiff_reason


@pytest.mark.parametrize("target", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_scalar_ops_round_once_like_aten(target, dtype):
    """A bfloat16/float16 tensor times or over a Python number: ATen computes in float32 with the number
    unrounded and rounds the result once; a constant of the tensor's dtype would round the number first."""
    torch = pytest.importorskip("torch")
    if target == "jax":
        pytest.importorskip("jax")
    from pullback.ops.math import scaled

    xt = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
    x = pullback.var("x", shape=(4096,), dtype=dtype)
    for value, divide in [(0.044715, False), (1 / 3, True), (0.7978845608028654, False)]:
        body = scaled(x, value, divide)
        assert body.op.name == ("divide_scalar" if divide else "multiply_scalar")
        exe = pullback.build(pullback.IRModule.from_expr(pullback.Function([x], body)), target=target)
        got = exe["main"](xt if target == "torch" else xt.float().numpy().astype(dtype))
        got = got if target == "torch" else torch.from_numpy(np.asarray(got).astype("float32")).to(xt.dtype)
        want = xt / value if divide else xt * value
        assert torch.equal(got, want), (value, divide)
        rounded_first = xt / torch.tensor(value, dtype=xt.dtype) if divide else xt * torch.tensor(value, dtype=xt.dtype)
        assert not torch.equal(got, rounded_first)  # the case tells the two roundings apart
    assert scaled(x, 0.5).op.name == "multiply"  # a value of the dtype: the plain operator, the same bits
    assert scaled(pullback.var("y", shape=(3,)), 0.044715).op.name == "multiply"  # float32: the constant is exact


def test_scalar_ops_print_and_parse_back():
    x = pullback.var("x", shape=(2, 3), dtype="bfloat16")
    mod = pullback.IRModule.from_expr(pullback.Function([x], op.divide_scalar(op.multiply_scalar(x, value=0.1), value=3.0)))
    again = pullback.parse(str(mod))
    assert pullback.structural_equal(again, mod)
    with pytest.raises(AttrError, match="value.*finite"):
        op.multiply_scalar(x, value=float("inf"))
