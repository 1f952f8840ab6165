"""``Expr.checked_type`` computed on first access: the one way to type a new node."""

import pytest

import pullback as pb
from pullback import op
from pullback.analysis import infer_expr, infer_module
from pullback.ir.traversal import post_order, rebuild


def T(*shape, dtype="float32"):
    return pb.TensorType(shape, dtype)


def test_new_node_is_typed_on_first_access_and_cached():
    x = pb.var("x", shape=(2, 3))
    e = op.tanh(op.exp(x) + x)
    assert not e.has_type and not e.args[0].has_type
    t = e.checked_type
    assert t == T(2, 3)
    assert e.checked_type is t  # cached
    assert all(n.has_type for n in post_order(e))  # the operands were typed on the way


def test_only_the_untyped_part_is_visited():
    x = pb.var("x", shape=(3,))
    typed = op.exp(x)
    _ = typed.checked_type
    wrong = T(7)
    typed.args[0]._checked_type = wrong  # a typed node is not entered again
    assert op.negative(typed).checked_type == T(3)
    assert x._checked_type is wrong


def test_every_node_kind_has_its_rule():
    c = pb.var("c", shape=(), dtype="bool")
    a = pb.var("a", shape=(2, 3))
    b = pb.var("b", pb.TensorType((pb.Any, 3), "float32"))
    tup = pb.Tuple([a, op.sum(b)])
    assert tup.checked_type == pb.TupleType((T(2, 3), T()))
    assert tup[1].checked_type == T()
    assert pb.If(c, a, b).checked_type == pb.TensorType((pb.Any, 3), "float32")
    fn = pb.Function([a], op.exp(a))
    assert fn.checked_type == pb.FuncType((T(2, 3),), T(2, 3))
    prim = pb.Function([pb.var("p", shape=(2, 3))], op.exp(pb.var("p2", shape=(2, 3))), attrs={"Primitive": 1})
    p = prim.params[0]
    prim = pb.Function([p], op.negative(p), attrs={"Primitive": 1})
    assert pb.Call(prim, [a]).checked_type == T(2, 3)
    assert pb.const(1, "int8").checked_type == T(dtype="int8")


def test_lazy_errors_are_inferences_errors():
    x = pb.var("x", shape=(2, 3))
    y = pb.var("y", shape=(4,))
    bad = op.exp(x + y)
    with pytest.raises(pb.TypeInferenceError) as lazy:
        _ = bad.checked_type
    mod = pb.IRModule.from_expr(pb.Function([x, y], bad))
    with pytest.raises(pb.TypeInferenceError) as eager:
        infer_module(mod)
    assert str(eager.value) == f"{lazy.value} in @main"  # the same message; InferType names the function
    assert "add" in str(lazy.value) and "(2, 3)" in str(lazy.value) and "(4,)" in str(lazy.value)
    with pytest.raises(pb.TypeInferenceError, match="%v has no type annotation"):
        _ = op.exp(pb.Var("v")).checked_type
    with pytest.raises(pb.TypeInferenceError, match="bool scalar"):
        _ = pb.If(x, x, x).checked_type


def test_a_call_to_a_module_function_needs_the_module():
    a = pb.var("a", shape=(3,))
    x = pb.var("x", shape=(3,))
    mod = pb.IRModule({"f": pb.Function([a], op.exp(a)), "main": pb.Function([x], x)})
    call = op.negative(pb.Call(mod.get_global_var("f"), [x]))
    with pytest.raises(pb.TypeInferenceError, match=r"@f is only known with its module.*InferType"):
        _ = call.checked_type
    assert not call.has_type
    assert infer_expr(call, mod) == T(3)  # the module-aware form of the same lazy typing
    assert mod["f"].has_type  # the callee was typed on demand
    with pytest.raises(pb.TypeInferenceError, match="unknown global function @g"):
        infer_expr(pb.Call(pb.GlobalVar("g"), [x]), mod)


def test_infer_expr_with_a_module_types_only_what_it_needs():
    a, b, x = pb.var("a", shape=(3,)), pb.var("b", shape=(3,)), pb.var("x", shape=(3,))
    mod = pb.IRModule({"f": pb.Function([a], op.exp(a)), "g": pb.Function([b], op.tanh(b)), "main": pb.Function([x], x)})
    infer_expr(pb.Call(mod.get_global_var("f"), [x]), mod)
    assert mod["f"].has_type and not mod["g"].has_type


@pytest.mark.slow
def test_million_node_chain_built_without_infer_type_is_typed_on_first_access():
    x = pb.var("x", shape=(2,))
    e = x
    for _ in range(1_000_000):
        e = op.negative(e)
    assert not e.has_type
    assert e.checked_type == T(2)
    assert e.args[0].has_type


def test_rebuild_keeps_the_type_when_operand_types_are_unchanged():
    x, y = pb.var("x", shape=(2,)), pb.var("y", shape=(2,))
    e = op.exp(x)
    _ = e.checked_type
    same = rebuild(e, lambda c: y)
    assert same is not e and same._checked_type is e._checked_type
    z = pb.var("z", shape=(5,))
    other = rebuild(e, lambda c: z)
    assert not other.has_type and other.checked_type == T(5)  # operand type changed: inferred afresh


def test_rebuild_does_not_carry_the_type_of_a_call_to_a_module_function():
    a, x, y = pb.var("a", shape=(3,)), pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    mod = pb.IRModule({"f": pb.Function([a], op.exp(a)), "main": pb.Function([x], x)})
    call = pb.Call(mod.get_global_var("f"), [x])
    infer_expr(call, mod)
    assert not rebuild(call, lambda c: y).has_type  # the callee's signature may have changed
