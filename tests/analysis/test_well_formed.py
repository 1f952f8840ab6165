"""check_well_formed: binding, globals, arity, cached types; every problem listed at once."""

import pytest

import pullback as pb
from pullback import op
from pullback.analysis import check_well_formed, infer_module, is_well_formed
from pullback.ir.types import TensorType, TupleType
from pullback.ops.registry import get_op

T23 = TensorType((2, 3), "float32")


def problems_of(target, **kw):
    with pytest.raises(pb.WellFormedError) as info:
        check_well_formed(target, **kw)
    err = info.value
    assert str(len(err.problems)) in str(err)
    return err.problems


def good_module():
    x = pb.var("x", T23)
    y = pb.var("y", T23)
    p = pb.var("p", T23)
    prim = pb.Function([p], op.exp(p), attrs={"Primitive": 1})
    f = pb.Function([y], op.tanh(y))
    t = pb.Tuple([pb.Call(prim, [x]), pb.Call(pb.GlobalVar("f"), [x])])
    main = pb.Function([x], op.add(t[0], t[1]))
    return pb.IRModule({"main": main, "f": f})


def test_valid_module_typed_and_untyped():
    mod = good_module()
    check_well_formed(mod)
    infer_module(mod)
    check_well_formed(mod)
    assert is_well_formed(mod)


def test_closure_value_is_allowed():
    x = pb.var("x", T23)
    z = pb.var("z", T23)
    closure = pb.Function([z], op.multiply(z, x))  # captures x from the enclosing function
    main = pb.Function([x], pb.Tuple([closure, x]))
    mod = pb.IRModule.from_expr(main)
    check_well_formed(mod)
    infer_module(mod)
    check_well_formed(mod)


def test_bare_expression_may_have_free_vars():
    x = pb.var("x", T23)
    check_well_formed(op.exp(x))
    assert not is_well_formed(pb.Function([], op.exp(x)))


def test_every_problem_listed_at_once():
    x, y, z = pb.var("x", T23), pb.var("y", T23), pb.var("z", T23)
    inner = pb.Function([z], op.exp(z))
    main = pb.Function([x], op.add(op.add(x, y), pb.Call(pb.GlobalVar("missing"), [x])))
    g = pb.Function([z], pb.Tuple([inner, z]))  # z bound by g and by inner
    w = pb.var("w", T23)
    h = pb.Function([w], pb.Tuple([pb.Call(pb.GlobalVar("g"), [w, w]), pb.Call(op.exp, [w, w])]))
    mod = pb.IRModule({"main": main, "g": g, "h": h})
    probs = problems_of(mod)
    text = "\n".join(probs)
    assert len(probs) == 5, text
    assert any("@main" in p and "free variable %y" in p for p in probs)
    assert any("@main" in p and "@missing" in p for p in probs)
    assert any("@g" in p and "%z is bound by two functions" in p for p in probs)
    assert any("@h" in p and "@g takes 1 argument, got 2" in p for p in probs)
    assert any("@h" in p and "exp takes 1 argument, got 2" in p for p in probs)


def test_optional_operands_counted():
    """An operator with an optional operand (attention's bias) takes either count, and no other."""
    q = pb.var("q", pb.TensorType((1, 2, 3, 4), "float32"))
    b = pb.var("b", pb.TensorType((1, 1, 3, 3), "float32"))
    for args, bad in (([q, q, q], False), ([q, q, q, b], False), ([q, q], True), ([q, q, q, b, b], True)):
        call = pb.Call(get_op("nn.attention"), args, get_op("nn.attention").make_attrs())
        mod = pb.IRModule({"main": pb.Function([q, b], call)})
        if bad:
            assert any("nn.attention takes 3 or 4 arguments" in p for p in problems_of(mod))
        else:
            assert is_well_formed(mod)


def test_var_used_outside_its_binder():
    x, z = pb.var("x", T23), pb.var("z", T23)
    inner = pb.Function([z], op.exp(z))
    main = pb.Function([x], pb.Tuple([inner, op.add(x, z)]))
    probs = problems_of(pb.IRModule.from_expr(main))
    assert len(probs) == 1 and "%z is used outside the function that binds it" in probs[0]


def test_globals_checked_only_with_a_module():
    x = pb.var("x", T23)
    fn = pb.Function([x], pb.Call(pb.GlobalVar("f"), [x]))
    check_well_formed(fn)  # no module: nothing to resolve against
    probs = problems_of(fn, mod=pb.IRModule({"g": pb.Function([pb.var("a", T23)], pb.var("b", T23))}))
    assert len(probs) == 1 and "@f" in probs[0]


def typed_module():
    x = pb.var("x", T23)
    e = op.exp(x)
    tup = pb.Tuple([e, x])
    mod = pb.IRModule.from_expr(pb.Function([x], op.add(tup[0], tup[1])))
    infer_module(mod)
    check_well_formed(mod)
    return mod, x, e


def test_inconsistent_call_and_tuple_types():
    mod, x, e = typed_module()
    e._checked_type = TensorType((3, 2), "float32")  # simulate a wrong cache
    probs = problems_of(mod)
    assert len(probs) == 2, probs
    assert "exp" in probs[0] and "cached type Tensor[(3, 2), float32] but its operands give Tensor[(2, 3), float32]" in probs[0]
    assert "cached type (Tensor[(2, 3), float32], Tensor[(2, 3), float32])" in probs[1]


def test_param_type_must_equal_annotation():
    mod, x, e = typed_module()
    x._checked_type = TensorType((2, 3), "float64")
    probs = problems_of(mod)
    assert "%x" in probs[0] and "cached type Tensor[(2, 3), float64] but its annotation is Tensor[(2, 3), float32]" in probs[0]


def test_global_call_type_must_match_callee():
    mod = good_module()
    infer_module(mod)
    main = mod["main"]
    gcall = main.body.args[1].tuple_value.fields[1]
    assert isinstance(gcall.op, pb.GlobalVar)
    gcall._checked_type = TupleType((T23,))
    probs = problems_of(mod)
    assert any("@main" in p and "cached type (Tensor[(2, 3), float32],)" in p for p in probs), probs


def test_rejects_non_ir():
    with pytest.raises(pb.WellFormedError):
        check_well_formed(42)


def test_long_chain():
    x = pb.var("x", shape=(2,))
    e = x
    for _ in range(300_000):
        e = op.negative(e)
    mod = pb.IRModule.from_expr(pb.Function([x], e))
    infer_module(mod)
    check_well_formed(mod)
