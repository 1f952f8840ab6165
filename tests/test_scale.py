"""No recursion on expression depth: a 1,000,000-node chain through the foundation.

Kept forever (issue 2): InferType, structural_hash, astext, parse and the
executor on a chain of a million nodes.
"""

import numpy as np
import pytest

import pullback as pb
from pullback import op

N = 1_000_000


@pytest.fixture
def chain_module():
    x = pb.var("x", shape=(2,))
    e = x
    for _ in range(N):
        e = op.negative(e)
    return pb.IRModule.from_expr(pb.Function([x], e))


@pytest.mark.slow
def test_chain_infers_hashes_prints_parses_and_runs(chain_module):
    mod = pb.transform.InferType()(chain_module)
    assert mod["main"].body.checked_type == pb.TensorType((2,), "float32")
    h = pb.structural_hash(mod)
    text = pb.astext(mod)
    assert text.count("negative(") == N
    back = pb.parse(text)
    assert pb.structural_hash(back) == h
    assert pb.structural_equal(back, mod)
    out = pb.build(mod)["main"](np.array([1.0, -2.0], "float32"))
    np.testing.assert_array_equal(out, np.array([1.0, -2.0], "float32"))  # N is even
