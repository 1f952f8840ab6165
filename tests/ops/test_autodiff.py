"""stop_gradient: identity forward, no gradient (PyTorch's detach), on every namespace and through the AD pass."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import op

from namespaces import check_namespaces
from opgrad import case, dtype_check, rule_vjp, torch_check

X = np.random.default_rng(3).standard_normal((2, 3))
CASES = [case("stop_gradient", X, wrt=[], torch=lambda x: x.detach()),
         case("stop_gradient", np.array([1, 2], dtype="int64"), wrt=[], torch=lambda x: x.detach())]


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_forward_matches_torch(c):
    pytest.importorskip("torch")
    torch_check(c)


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_kernel_on_every_namespace_and_dtype(c):
    check_namespaces(c)
    dtype_check(c, "float32")


def test_rule_gives_no_gradient():
    assert rule_vjp(CASES[0], np.ones((2, 3))) == [None]


def test_ad_pass_blocks_the_gradient_of_one_use_only():
    x = pb.var("x", shape=(3,))
    f = pb.Function([x], op.sum(op.add(op.multiply(op.stop_gradient(x), x), x)))
    g = pb.transform.FirstOrderGradient()(pb.IRModule.from_expr(f))
    _, (dx,) = pb.build(g)["main_grad"](np.arange(3.0, dtype="float32"))
    np.testing.assert_allclose(dx, [1.0, 2.0, 3.0])  # d/dx (sg(x) * x + x) = sg(x) + 1
