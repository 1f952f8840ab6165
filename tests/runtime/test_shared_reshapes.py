"""Reshapes of one value share its copy (``runtime.plan.share_reshape_sources``): a later reshape of a value an
earlier reshape reads reshapes that earlier result instead, on every target, with the same results."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Function, IRModule, Tuple, op, var
from pullback.ir.traversal import post_order
from pullback.runtime.plan import share_reshape_sources

TARGETS = ["numpy", "torch", "jax"]


def _two_reshapes_of_a_transpose(second=(6, 4, 8)):
    x = var("x", shape=(4, 6, 8))
    t = op.transpose(x, (1, 0, 2))  # not contiguous: each reshape of it to rows copies
    return Function([x], Tuple([op.reshape(t, (24, 8)), op.sum(op.reshape(t, second), axis=0)])), x


def test_the_second_reshape_reads_the_first():
    f, _ = _two_reshapes_of_a_transpose()
    body = share_reshape_sources(f.body, post_order(f.body))
    first, summed = body.fields
    second = summed.args[0]
    assert second.args[0] is first and second.attrs.newshape == (6, 4, 8)
    assert second.checked_type == f.body.fields[1].args[0].checked_type
    assert share_reshape_sources(body, post_order(body)) is body  # nothing left to share


def test_a_reshape_copying_a_dim_of_its_operand_is_kept():
    f, _ = _two_reshapes_of_a_transpose(second=(0, 4, 8))  # 0: the operand's dim 0, which differs between the two
    assert share_reshape_sources(f.body, post_order(f.body)) is f.body


@pytest.mark.parametrize("target", TARGETS)
def test_results_are_those_of_each_reshape_of_the_value(target):
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[target])
    f, _ = _two_reshapes_of_a_transpose()
    x = np.random.default_rng(0).standard_normal((4, 6, 8)).astype("float32")
    keep = x.copy()
    rows, sums = pb.build(IRModule.from_expr(f), target=target)["main"](x)
    t = x.transpose(1, 0, 2)
    np.testing.assert_array_equal(np.asarray(rows), t.reshape(24, 8))
    np.testing.assert_allclose(np.asarray(sums), t.reshape(6, 4, 8).sum(0), rtol=1e-6)
    np.testing.assert_array_equal(x, keep)


def test_the_torch_target_copies_the_value_once():
    torch = pytest.importorskip("torch")
    x = var("x", shape=(4, 6, 8))
    t = op.transpose(x, (1, 0, 2))
    f = Function([x], Tuple([op.reshape(t, (24, 8)), op.reshape(t, (6, 32))]))
    a, b = pb.build(IRModule.from_expr(f), target="torch")["main"](torch.randn(4, 6, 8))
    assert a.data_ptr() == b.data_ptr()  # before: two copies of the transposed value
    assert torch.equal(a.reshape(6, 32), b)
