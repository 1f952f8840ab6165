"""Liveness, peak memory, FLOPs and program statistics on hand-computed programs."""

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.analysis import (
    count_identity_arith,
    count_like_ops,
    flops,
    liveness,
    op_histogram,
    peak_memory,
    program_stats,
    type_bytes,
)
from pullback.ir.types import Any, TensorType, TupleType

V10 = TensorType((10,), "float32")  # 40 bytes


def fan_out():
    """x -> a=exp(x) -> b=tanh(a) -> c=negative(b) -> d=add(a, c) -> e=sum(d)."""
    x = pb.var("x", V10)
    a = op.exp(x)
    b = op.tanh(a)
    c = op.negative(b)
    d = op.add(a, c)
    e = op.sum(d)
    return pb.IRModule.from_expr(pb.Function([x], e)), (x, a, b, c, d, e)


def test_liveness_hand_computed():
    mod, (x, a, b, c, d, e) = fan_out()
    lives = liveness(mod["main"])
    assert [(lv.node, lv.first_def, lv.last_use) for lv in lives] == [
        (x, 0, 1), (a, 1, 4), (b, 2, 3), (c, 3, 4), (d, 4, 5), (e, 5, 6)]


def test_peak_memory_hand_computed():
    mod, _ = fan_out()
    # live intermediates per step: a=40 | a,b=80 | a,b,c=120 | a,c,d=120 | d,e=44; param x=40
    assert peak_memory(mod) == 40 + 120
    # nothing freed: x + a + b + c + d + e
    assert peak_memory(mod, reuse=False) == 40 + 4 * 40 + 4
    assert peak_memory(mod["main"]) == 160  # a bare Function works too


def test_tuple_keeps_fields_alive():
    x = pb.var("x", V10)
    a = op.exp(x)
    b = op.tanh(a)
    s = op.sum(a)
    t = pb.Tuple([b, s])
    fn = pb.Function([x], t)
    lives = {id(lv.node): lv for lv in liveness(fn)}
    assert lives[id(b)].last_use == 5  # returned through the tuple: live to the end
    assert lives[id(a)].last_use == 3
    # a | a,b | a,b,s = 84 | b,s = 44
    assert peak_memory(fn) == 40 + 84


def test_tuple_get_item_and_if_alias():
    x = pb.var("x", V10)
    cond = pb.var("c", shape=(), dtype="bool")
    a = op.exp(x)
    t = pb.Tuple([a, op.tanh(x)])
    branch = pb.If(cond, t[0], t[1])
    out = op.negative(branch)
    fn = pb.Function([x, cond], out)
    lives = {id(lv.node): lv for lv in liveness(fn)}
    steps = {id(lv.node): lv.first_def for lv in liveness(fn)}
    # a is read (through the tuple, the item and the If) by the negative call
    assert lives[id(a)].last_use == steps[id(out)]
    assert lives[id(cond)].last_use == steps[id(branch)]


def test_constants_resident_and_dynamic_dims_zero():
    x = pb.var("x", V10)
    fn = pb.Function([x], op.add(x, pb.const(np.ones(10, "float32"))))
    assert peak_memory(fn) == 40 + 40 + 40
    assert type_bytes(TensorType((Any, 3), "float32")) == 0
    assert type_bytes(TupleType((TensorType((2,), "float64"), TensorType((), "int8")))) == 17
    y = pb.var("y", TensorType((Any,), "float32"))
    assert peak_memory(pb.Function([y], op.exp(y))) == 0


def test_flops_hand_computed_and_per_call():
    mod, _ = fan_out()
    pb.analysis.infer_module(mod)
    main = mod["main"]
    per_call = {}
    for n in pb.ir.post_order(main.body):
        if isinstance(n, pb.Call):
            per_call[n.op.name] = n.op.flops([a.checked_type for a in n.args], n.checked_type, n.attrs)
    # elementwise ops cost a fixed number per element
    assert per_call["exp"] == 10 and per_call["negative"] == 10 and per_call["add"] == 10
    assert flops(mod) == sum(per_call.values())
    # a global function called twice counts twice; a primitive function counts its body
    x = pb.var("x", V10)
    g = pb.GlobalVar("f")
    p = pb.var("p", V10)
    prim = pb.Function([p], op.exp(p), attrs={"Primitive": 1})
    two = pb.Function([x], op.add(pb.Call(g, [x]), pb.Call(g, [pb.Call(prim, [x])])))
    mod2 = pb.IRModule({"main": two, "f": main})
    assert flops(mod2) == 2 * flops(mod) + 10 + 1  # exp in the primitive, add of two scalars
    assert flops(mod2, "f") == flops(mod)


def test_flops_recursion_terminates():
    x = pb.var("x", V10)
    g = pb.GlobalVar("main")
    fn = pb.Function([x], op.exp(pb.Call(g, [x])), ret_type=V10)
    mod = pb.IRModule({g: fn})
    assert flops(mod) == 10


def like_program():
    x = pb.var("x", TensorType((2, 3), "float32"))
    z = op.zeros_like(x)
    o = op.ones_like(x)
    e1 = op.add(x, z)  # identity
    e2 = op.multiply(o, e1)  # identity
    e3 = op.subtract(op.zeros((2, 3), "float32"), e2)  # 0 - x: not an identity
    e4 = op.divide(e3, pb.const(np.ones((2, 3), "float32")))  # identity
    e5 = op.add(e4, op.full(pb.const(0.0), (2, 3), "float32"))  # identity
    e6 = op.multiply(e5, op.full_like(x, pb.const(2.0)))  # not an identity
    e7 = op.collapse_sum_like(e6, x)
    return pb.IRModule.from_expr(pb.Function([x], e7))


def test_histogram_like_and_identity_counts():
    mod = like_program()
    hist = op_histogram(mod)
    assert hist == {"add": 2, "collapse_sum_like": 1, "divide": 1, "full": 1, "full_like": 1, "multiply": 2,
                    "ones_like": 1, "subtract": 1, "zeros": 1, "zeros_like": 1}
    assert count_like_ops(mod) == 4  # zeros_like, ones_like, full_like, collapse_sum_like
    assert count_identity_arith(mod) == 4


def test_histogram_into_primitive_functions_and_callees():
    p = pb.var("p", V10)
    prim = pb.Function([p], op.tanh(op.exp(p)), attrs={"Primitive": 1})
    x = pb.var("x", V10)
    y = pb.var("y", V10)
    mod = pb.IRModule({
        "main": pb.Function([x], pb.Call(prim, [pb.Call(pb.GlobalVar("f"), [x])])),
        "f": pb.Function([y], op.zeros_like(y)),
        "unused": pb.Function([pb.var("u", V10)], op.ones((1,), "float32")),
    })
    assert op_histogram(mod) == {"exp": 1, "ones": 1, "tanh": 1, "zeros_like": 1}
    assert op_histogram(mod, "main") == {"exp": 1, "tanh": 1, "zeros_like": 1}
    stats = program_stats(mod)
    assert stats["ops"] == {"exp": 1, "tanh": 1, "zeros_like": 1}
    assert stats["calls"] == 3 and stats["like_ops"] == 1 and stats["identity_arith"] == 0
    assert stats["flops"] == 10 + 40  # exp + tanh; zeros_like is free
    assert stats["peak_bytes"] == 40 + 40 + 40  # x, @f result, primitive result
    with pytest.raises(pb.PullbackError):
        op_histogram(mod, "nope")


def test_program_stats_fan_out():
    mod, _ = fan_out()
    stats = program_stats(mod)
    assert stats["peak_bytes"] == 160 and stats["peak_bytes_no_reuse"] == 204
    assert stats["flops"] == flops(mod)
    assert set(stats) == {"ops", "calls", "like_ops", "identity_arith", "flops", "peak_bytes", "peak_bytes_no_reuse"}


@pytest.mark.slow
def test_million_node_chain_liveness():
    x = pb.var("x", TensorType((4,), "float32"))
    e = x
    for _ in range(1_000_000):
        e = op.negative(e)
    mod = pb.IRModule.from_expr(pb.Function([x], e))
    assert peak_memory(mod) == 16 + 32  # the param, plus one input and one output at a time
    assert flops(mod) == 4_000_000
