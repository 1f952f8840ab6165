"""Round trips of the text format: ``parse(astext(m))`` gives back ``m``."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.text.printer import Namer, binding_text
from pullback.ir.traversal import post_order


def f32(name, *shape):
    return pb.var(name, shape=shape)


def node_count(obj) -> int:
    if isinstance(obj, pb.IRModule):
        return sum(node_count(f) for _, f in obj.items())
    return len(post_order(obj, into_functions=True))


def roundtrip_module(m: pb.IRModule) -> pb.IRModule:
    text = pb.astext(m)
    m2 = pb.parse(text)
    assert pb.astext(m2) == text
    assert node_count(m2) == node_count(m)
    pb.assert_structural_equal(m2, m)
    return m2


def roundtrip_expr(e: pb.Expr) -> pb.Expr:
    text = pb.astext(e)
    e2 = pb.parse_expr(text)
    assert pb.astext(e2) == text
    assert node_count(e2) == node_count(e)
    pb.assert_structural_equal(e2, e, map_free_vars=True)
    return e2


def mlp() -> pb.IRModule:
    x, w = f32("x", 2, 3), f32("w", 4, 3)
    return pb.IRModule.from_expr(pb.Function([x, w], op.sum(op.tanh(op.nn.dense(x, w)))))


# ------------------------------------------------------------------ printing


def test_mlp_text_reads_like_relay():
    m = mlp()
    assert pb.astext(m) == (
        "def @main(%x: Tensor[(2, 3), float32], %w: Tensor[(4, 3), float32]) {\n"
        "  %0 = nn.dense(%x, %w);\n"
        "  %1 = tanh(%0);\n"
        "  sum(%1, axis=None, keepdims=False, exclude=False)\n"
        "}\n"
    )
    assert str(m) == pb.astext(m)
    roundtrip_module(m)


def test_ret_type_printed_when_known():
    x = f32("x", 2)
    f = pb.Function([x], op.tanh(x), ret_type=pb.TensorType((2,), "float32"))
    text = pb.astext(f)
    assert text.startswith("fn (%x: Tensor[(2,), float32]) -> Tensor[(2,), float32] {")
    assert pb.parse_expr(text).ret_type == pb.TensorType((2,), "float32")
    roundtrip_module(pb.IRModule.from_expr(f))


def test_inferred_module_round_trips():
    from pullback.analysis import infer_module

    x, c = f32("x", 3), pb.var("c", shape=(), dtype="bool")
    f = pb.Function([c, x], pb.If(c, op.add(op.exp(op.tanh(x)), x), op.negative(x)))
    m = infer_module(pb.IRModule.from_expr(f))
    m2 = roundtrip_module(m)
    assert m2["main"].ret_type is None


def test_optional_operand_round_trips():
    """Attention with and without its optional bias prints and parses back to the same call."""
    q, b = pb.var("q", pb.TensorType((1, 2, 3, 4), "float32")), pb.var("b", pb.TensorType((1, 1, 3, 3), "float32"))
    for args in ([q, q, q], [q, q, q, b]):
        f = pb.Function([q, b], op.nn.attention(*args, scale=0.5))
        g = roundtrip_module(pb.IRModule.from_expr(f))["main"]
        assert len(g.body.args) == len(args) and g.body.attrs.scale == 0.5


def test_repr_uses_text():
    x = f32("x", 3)
    assert repr(op.tanh(x)) == "tanh(%x: Tensor[(3,), float32])"


def test_duplicate_var_names_made_unique():
    a, b = f32("x", 2), f32("x", 2)
    f = pb.Function([a, b], op.subtract(a, b))
    text = pb.astext(f)
    assert "%x: Tensor" in text and "%x_1: Tensor" in text and "subtract(%x, %x_1)" in text
    g = pb.parse_expr(text)
    assert g.body.args == g.params
    roundtrip_expr(f)


def test_odd_var_and_global_names():
    x = pb.var("0.weird name", shape=(2,))
    gv = pb.GlobalVar("my-fn")
    y = pb.var("y", shape=(2,))
    callee = pb.Function([y], op.negative(y))
    main = pb.Function([x], pb.Call(gv, [x]))
    m = pb.IRModule({gv: callee, "main": main})
    text = pb.astext(m)
    assert '@"my-fn"(%v0_weird_name)' in text
    m2 = roundtrip_module(m)
    assert "my-fn" in m2


# ------------------------------------------------------------------ round trips


def test_tuples_nested_and_getitem():
    x, y = f32("x", 2), f32("y", 2)
    t = pb.Tuple([x, pb.Tuple([y, pb.Tuple([op.add(x, y)])]), pb.Tuple([])])
    body = pb.Tuple([pb.TupleGetItem(pb.TupleGetItem(t, 1), 0), t[2], pb.Tuple([x])])
    m = pb.IRModule.from_expr(pb.Function([x, y], body))
    text = pb.astext(m)
    assert "(%x,)" in text and "= ();" in text and ".1;" in text
    roundtrip_module(m)


def test_tuple_params_and_types():
    tt = pb.TupleType((pb.TensorType((2,), "float32"), pb.TupleType((pb.TensorType((), "int32"),))))
    p = pb.Var("p", tt)
    m = pb.IRModule.from_expr(pb.Function([p], p[1][0]))
    text = pb.astext(m)
    assert "%p: (Tensor[(2,), float32], (Tensor[(), int32],))" in text
    m2 = roundtrip_module(m)
    assert m2["main"].params[0].type_annotation == tt


def test_if_with_branch_local_and_shared_nodes():
    x, c = f32("x", 3), pb.var("c", shape=(), dtype="bool")
    shared = op.tanh(x)  # used in both branches: printed once, before the If
    inner = pb.If(c, op.exp(shared), op.negative(x))  # nested If inside the true branch
    then = op.add(inner, op.exp(x))
    els = op.multiply(shared, op.sigmoid(x))
    body = op.add(pb.If(c, then, els), shared)
    m = pb.IRModule.from_expr(pb.Function([c, x], body))
    text = pb.astext(m)
    lines = text.splitlines()
    assert lines[1].strip() == "%0 = tanh(%x);"
    assert lines[2].strip() == "%1 = if (%c) {"
    assert "  %2 = if (%c) {" in text  # nested, indented inside the branch
    assert text.count("tanh(") == 1
    m2 = roundtrip_module(m)
    assert sum(isinstance(n, pb.If) for n in post_order(m2["main"].body)) == 2


def test_if_as_branch_result_and_function_result():
    x, c = f32("x", 3), pb.var("c", shape=(), dtype="bool")
    body = pb.If(c, pb.If(c, op.tanh(x), x), op.exp(x))
    f = pb.Function([c, x], body)
    text = pb.astext(f)
    assert text.splitlines()[1].strip() == "if (%c) {"
    roundtrip_expr(f)


def test_any_dims():
    x = pb.var("x", shape=(pb.Any, 3))
    m = pb.IRModule.from_expr(pb.Function([x], op.tanh(x)))
    text = pb.astext(m)
    assert "Tensor[(?, 3), float32]" in text
    m2 = roundtrip_module(m)
    assert m2["main"].params[0].type_annotation.shape == (pb.Any, 3)


def test_attrs_of_many_kinds():
    x = f32("x", 2, 3, 4)
    r = op.reshape(x, (-1, 0, 2))
    s = op.sum(r, axis=(0, 2), keepdims=True)
    s2 = op.sum(x, axis=None)
    z = op.zeros((2, 3), "int32")
    rl = op.reshape_like(x, r, lhs_begin=1, lhs_end=None, rhs_begin=0, rhs_end=2)
    tr = op.transpose(x)
    tr2 = op.transpose(x, (2, 0, 1))
    m = pb.IRModule.from_expr(pb.Function([x], pb.Tuple([s, s2, z, rl, tr, tr2])))
    text = pb.astext(m)
    for piece in (
        "reshape(%x, newshape=(-1, 0, 2))",
        "axis=(0, 2), keepdims=True",
        "sum(%x, axis=None, keepdims=False, exclude=False)",
        'zeros(shape=(2, 3), dtype="int32")',
        "lhs_begin=1, lhs_end=None, rhs_begin=0, rhs_end=2",
        "transpose(%x, axes=None)",
        "transpose(%x, axes=(2, 0, 1))",
    ):
        assert piece in text
    m2 = roundtrip_module(m)
    calls = {n.op.name: n for n in post_order(m2["main"].body) if isinstance(n, pb.Call)}
    assert calls["reshape"].attrs == r.attrs and calls["zeros"].attrs == z.attrs


def test_attr_tuple_of_one_and_strings():
    x = f32("x", 3)
    e = op.sum(x, axis=(0,))
    assert "axis=(0,)" in pb.astext(e)
    assert pb.parse_expr("sum(%x: Tensor[(3), float32], axis=0)").attrs.axis == (0,)
    e2 = op.cast(x, "float64")
    assert 'cast(%x: Tensor[(3,), float32], dtype="float64")' == pb.astext(e2)
    roundtrip_expr(e2)


@pytest.mark.parametrize(
    "value,dtype",
    [
        (1.5, "float32"),
        (0.1, "float32"),
        (0.1, "float64"),
        (np.float32(3.4028235e38), "float32"),
        (1e-45, "float32"),  # subnormal
        (-0.0, "float32"),
        (math.nan, "float32"),
        (math.inf, "float64"),
        (-math.inf, "float16"),
        (0.1, "float16"),
        (7, "int32"),
        (-(2**63), "int64"),
        (255, "uint8"),
        (True, "bool"),
        ([[1, 2], [3, 4]], "int32"),
        ([[0.1, -2.5e-8], [1e30, math.nan]], "float32"),
        ([True, False, True], "bool"),
    ],
)
def test_constants_bit_exact(value, dtype):
    c = pb.const(value, dtype)
    e = pb.parse_expr(pb.astext(c))
    assert isinstance(e, pb.Constant)
    assert "meta[" not in pb.astext(c)
    assert e.data.dtype == c.data.dtype and e.data.shape == c.data.shape
    assert e.data.tobytes() == c.data.tobytes()


def test_const_default_dtypes_and_strictness():
    assert pb.parse_expr("const(2)").data.dtype == np.int32
    assert pb.parse_expr("const(2.0)").data.dtype == np.float32
    assert pb.parse_expr("const([True])").data.dtype == np.bool_
    for bad in ("const(1.5, int32)", "const(300, uint8)", "const([[1], [1, 2]], float32)", 'const("a", float32)'):
        with pytest.raises(pb.ParseError) as ei:
            pb.parse_expr(bad)
        assert (ei.value.line, ei.value.column) == (1, 1)


def test_large_and_odd_constants_use_metadata():
    rng = np.random.default_rng(0)
    big = pb.const(rng.standard_normal((10, 7)).astype("float32"))
    empty = pb.const(np.zeros((0, 3), "float32"))
    payload = pb.const(np.array([0x7FC00001], dtype="uint32").view("float32"))  # NaN payload
    x = f32("x", 10, 7)
    body = pb.Tuple([op.add(x, big), op.multiply(x, big), empty, payload])
    m = pb.IRModule.from_expr(pb.Function([x], body))
    text = pb.astext(m)
    assert "#[metadata]" in text and "meta[2]" in text and text.count("meta[0] =") == 1
    m2 = roundtrip_module(m)
    consts = [n for n in post_order(m2["main"].body) if isinstance(n, pb.Constant)]
    assert len(consts) == 3  # ``big`` is still one shared node
    got = {c.data.shape: c.data for c in consts}
    assert got[(10, 7)].tobytes() == big.data.tobytes()
    assert got[(0, 3)].shape == (0, 3)
    assert got[(1,)].view("uint32")[0] == 0x7FC00001


def test_shared_small_constant_stays_shared():
    x = f32("x", 2)
    one = pb.const(1.0)
    body = op.add(op.add(x, one), one)
    text = pb.astext(body)
    assert text.splitlines()[0] == "%0 = const(1.0, float32);"
    e = roundtrip_expr(body)
    assert e.args[1] is e.args[0].args[1]


def test_multiple_functions_with_global_calls():
    a = f32("a", 2)
    helper = pb.Function([a], op.tanh(a))
    x = f32("x", 2)
    gv = pb.GlobalVar("helper")
    main = pb.Function([x], op.add(pb.Call(gv, [x]), pb.Call(gv, [op.negative(x)])))
    m = pb.IRModule({"main": main, gv: helper})
    text = pb.astext(m)
    assert "\n\ndef @helper(%a: Tensor[(2,), float32]) {" in text and "@helper(%x)" in text
    m2 = roundtrip_module(m)
    calls = [n for n in post_order(m2["main"].body) if isinstance(n, pb.Call) and isinstance(n.op, pb.GlobalVar)]
    assert calls[0].op is calls[1].op is m2.get_global_var("helper")


def test_forward_reference_to_later_def():
    m = pb.parse("def @main(%x: Tensor[(2), float32]) { @f(%x) }\ndef @f(%y) { tanh(%y) }")
    assert m["main"].body.op is m.get_global_var("f")


def test_primitive_function_called_in_place():
    x = f32("x", 2, 3)
    p0, p1 = f32("p0", 2, 3), f32("p1", 2, 3)
    prim = pb.Function([p0, p1], op.tanh(op.add(p0, p1)), attrs={"Primitive": 1})
    body = pb.Call(prim, [x, op.negative(x)])
    m = pb.IRModule.from_expr(pb.Function([x], op.exp(body)))
    text = pb.astext(m)
    assert "  %1 = fn [Primitive=1] (%p0: Tensor[(2, 3), float32], %p1: Tensor[(2, 3), float32]) {" in text
    assert "    %2 = add(%p0, %p1);" in text and "%3 = %1(%x, %0);" in text
    m2 = roundtrip_module(m)
    call = m2["main"].body.args[0]
    assert isinstance(call.op, pb.Function) and call.op.is_primitive


def test_function_value_and_call_on_fn_variable():
    e = pb.parse_expr("%0 = fn (%a: float32) { negative(%a) }; %0(%x: Tensor[(), float32])")
    assert isinstance(e, pb.Call) and isinstance(e.op, pb.Function)
    assert pb.parse_expr("fn (%a) { %a }(const(1.0))").op.params[0].name_hint == "a"
    t = pb.parse_expr("fn (%a) { %a }")
    roundtrip_expr(pb.Tuple([t, t]))


def test_dag_sharing_survives():
    x = f32("x", 4)
    a = op.tanh(x)
    b = op.add(a, a)
    c = op.multiply(b, a)
    d = pb.Tuple([c, b, a])
    m = pb.IRModule.from_expr(pb.Function([x], d))
    assert pb.astext(m).count("tanh(") == 1
    m2 = roundtrip_module(m)
    assert len(post_order(m2["main"].body)) == len(post_order(d)) == 5


def test_spans_on_calls():
    e = pb.parse_expr("%0 = tanh(%x);\n  %1 = add(%0,\n %x);\n  sum(%1, axis=0)")
    assert e.span == "4:3"
    assert e.args[0].span == "2:8" and e.args[0].args[0].span == "1:6"
    e = pb.parse_expr("%0 = fn (%a) { %a };\n (%0)(%x)")
    assert e.span == "2:2"


def test_comments_and_hand_written_nesting():
    e = pb.parse_expr("// a comment\nadd(multiply(%x, %y), // inline\n %z)")
    assert e.op.name == "add" and e.args[0].op.name == "multiply"


def test_binding_text_and_namer():
    m = mlp()
    f = m["main"]
    tanh_node = f.body.args[0]
    assert binding_text(f, tanh_node) == "%1 = tanh(%0)"
    assert binding_text(f, f.body) == "sum(%1, axis=None, keepdims=False, exclude=False)"
    assert binding_text(f, f.params[0]) == "%x"
    lines = pb.astext(f).splitlines()
    assert lines[2].strip() == binding_text(f, tanh_node) + ";"
    assert Namer(f).line(tanh_node.args[0]) == "%0 = nn.dense(%x, %w)"
    assert binding_text(f, op.tanh(f.params[0])).startswith("<Call")


def test_expr_with_free_vars_annotated_at_first_use():
    x = f32("x", 2)
    e = op.add(op.tanh(x), x)
    text = pb.astext(e)
    assert text == "%0 = tanh(%x: Tensor[(2,), float32]);\nadd(%0, %x)"
    e2 = pb.parse_expr(text)
    assert e2.args[1].type_annotation == x.type_annotation and e2.args[1] is e2.args[0].args[0]


# ------------------------------------------------------------------ scale


@pytest.mark.slow
def test_million_node_chain():
    x = f32("x", 2)
    e = x
    neg = op.negative
    for _ in range(1_000_000):
        e = pb.Call(neg, [e])
    m = pb.IRModule.from_expr(pb.Function([x], e))
    text = pb.astext(m)
    assert text.count("\n") == 1_000_002
    m2 = pb.parse(text)
    body = m2["main"].body
    assert len(post_order(body)) == 1_000_001
    assert body.op is neg and body.span == "1000001:3"


@pytest.mark.slow
def test_deep_nested_parentheses_and_tuples():
    depth = 100_000
    e = pb.parse_expr("(" * depth + "%x" + ")" * depth)
    assert isinstance(e, pb.Var)
    e = pb.parse_expr("(" * depth + "%x" + ",)" * depth)
    assert len(post_order(e)) == depth + 1
    text = pb.astext(e)
    assert text.count("\n") == depth - 1
    e2 = pb.parse_expr(text)
    assert len(post_order(e2)) == depth + 1
    e3 = pb.parse_expr("tanh(" * depth + "%x" + ")" * depth)
    assert len(post_order(e3)) == depth + 1
    with pytest.raises(pb.ParseError):
        pb.parse_expr("(" * depth)


def test_deep_nested_types_and_ifs():
    depth = 20_000
    ty = "(" * depth + "Tensor[(2), float32]" + ",)" * depth
    e = pb.parse_expr(f"%x: {ty}")
    assert isinstance(e.type_annotation, pb.TupleType)
    assert pb.astext(e).count("(") == depth + 1
    if_depth = 2_000  # ScopeInfo is quadratic in If depth (the printed text is linear)
    text = "if (%c) { " * if_depth + "%x" + " } else { %y }" * if_depth
    e = pb.parse_expr(text)
    assert len(post_order(e)) == if_depth + 3
    assert pb.parse_expr(pb.astext(e)) is not None
    nested_fn = "fn (%a) { " * 1000 + "%a" + " }" * 1000
    assert isinstance(pb.parse_expr(nested_fn), pb.Function)


def _nested_ifs(depth: int, fn_every: int = 0) -> pb.IRModule:
    x, c = f32("x", 2), pb.var("c", shape=(), dtype="bool")
    h = x
    for i in range(depth):
        if fn_every and i % fn_every == 0:
            p = f32("p", 2)
            h = pb.Call(pb.Function([p], op.tanh(p), attrs={"Primitive": 1}), [h])
        h = pb.If(c, op.tanh(h), op.negative(x))
    return pb.IRModule.from_expr(pb.Function([x, c], h))


@pytest.mark.parametrize("fn_every", [0, 7])
def test_deep_nesting_prints_linear_text_that_round_trips(fn_every):
    from pullback.text.printer import MAX_INDENT_LEVELS

    sizes = {}
    for depth in (500, 1000, 2000):
        m = _nested_ifs(depth, fn_every)
        text = pb.astext(m)
        sizes[depth] = len(text)
        indents = {len(line) - len(line.lstrip(" ")) for line in text.splitlines()}
        assert max(indents) == 2 * MAX_INDENT_LEVELS  # deeper blocks stay at the cap
        assert indents == set(range(0, 2 * MAX_INDENT_LEVELS + 1, 2))
        roundtrip_module(m)
    # linear: twice the depth, (about) twice the text; quadratic would be four times
    assert sizes[2000] / sizes[1000] < 2.2 and sizes[1000] / sizes[500] < 2.2


def test_normal_nesting_keeps_two_spaces_per_level():
    lines = pb.astext(_nested_ifs(5)).splitlines()
    heads = [line for line in lines if line.rstrip().endswith("{") and "if (" in line]
    assert [len(h) - len(h.lstrip(" ")) for h in heads] == [2, 4, 6, 8, 10]


def test_deep_literals_rejected_cleanly():
    with pytest.raises(pb.ParseError, match="nested deeper"):
        pb.parse_expr("sum(%x, axis=" + "(" * 100_000 + "1" + ")" * 100_000 + ")")
    with pytest.raises(pb.ParseError):
        pb.parse_expr("const(" + "[" * 100_000 + "1" + "]" * 100_000 + ")")
