"""RemoveUnusedParameters: call sites rewritten, entries kept, fixed point."""

import pytest

import pullback as pb
from pullback import op
from pullback.transform import RemoveUnusedParameters

from cleanup_util import assert_same_results, assert_valid


def _module(with_b: bool) -> pb.IRModule:
    f_gv = pb.GlobalVar("f")
    a = pb.var("a", shape=(2, 3))
    params = [a, pb.var("b", shape=(3,))] if with_b else [a]
    f = pb.Function(params, op.tanh(a))
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(3,))
    args = [x, y] if with_b else [x]
    main = pb.Function([x, y], op.exp(pb.Call(f_gv, args)))
    return pb.IRModule.from_expr(main, {"f": f})


def test_drops_parameter_and_rewrites_call_site():
    before = _module(True)
    after = RemoveUnusedParameters()(before)
    pb.assert_structural_equal(after, _module(False))
    assert len(after["main"].params) == 2  # main keeps its signature
    assert_valid(after)
    assert_same_results(before, after)
    assert RemoveUnusedParameters()(after) is after  # idempotent
    assert len(before["f"].params) == 2  # input not mutated


def test_chain_of_callers_to_fixed_point():
    # @g(%p, %q) passes %q only to @f's unused slot: both lose a parameter
    a, b = pb.var("a", shape=(3,)), pb.var("b", shape=(3,))
    f = pb.Function([a, b], op.exp(a))
    p, q = pb.var("p", shape=(3,)), pb.var("q", shape=(3,))
    g = pb.Function([p, q], pb.Call(pb.GlobalVar("f"), [p, q]))
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    main = pb.Function([x, y], pb.Call(pb.GlobalVar("g"), [x, y]))
    before = pb.IRModule({"f": f, "g": g, "main": main})
    after = RemoveUnusedParameters()(before)
    assert [len(after[n].params) for n in ("f", "g", "main")] == [1, 1, 2]
    assert_valid(after)
    assert_same_results(before, after)


def test_include_entry():
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    before = pb.IRModule.from_expr(pb.Function([x, y], op.exp(x)))
    assert RemoveUnusedParameters()(before) is before
    after = RemoveUnusedParameters(include_entry=True)(before)
    assert len(after["main"].params) == 1
    assert_valid(after)
    other = RemoveUnusedParameters(entry=("other",))(before)
    assert len(other["main"].params) == 1


def test_bad_entry_raises():
    with pytest.raises(pb.PassError):
        RemoveUnusedParameters(entry=[""])
