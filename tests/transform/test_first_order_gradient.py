"""FirstOrderGradient: Relay's first-order AD cases and what pullback adds (tuples, If, calls,
diagnostics, deep graphs, second order)."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.analysis import check_well_formed
from pullback.ir.expr import Call, Function, If, Tuple, TupleGetItem
from pullback.ir.traversal import count_calls, post_order
from pullback.ir.types import Any, TensorType, TupleType
from pullback.ops.registry import OpDef
from pullback.testing import check_grad, check_second_order
from pullback.transform import FirstOrderGradient, InferType, gradient

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _reseed():
    """Each test draws the same inputs whichever tests ran before it (pytest-xdist reorders them)."""
    global RNG
    RNG = np.random.default_rng(0)


T23 = TensorType((2, 3), "float32")


def randn(*shape):
    return RNG.standard_normal(shape).astype("float32")


def run(fn_or_mod, *args, func="main"):
    mod = fn_or_mod if isinstance(fn_or_mod, pb.IRModule) else pb.IRModule.from_expr(fn_or_mod)
    return pb.build(mod)[func](*args)


def typed_fn(params, body) -> Function:
    """An expected() Function with its return type set, as FirstOrderGradient sets it."""
    return Function(params, body, pb.analysis.infer_expr(body))


def assert_valid(fn: Function) -> None:
    mod = InferType()(pb.IRModule.from_expr(fn))
    check_well_formed(mod)
    assert isinstance(fn.ret_type, TupleType)


# ------------------------------------------------------------------ Relay's cases


def test_identity_structure():
    x = pb.var("x", shape=(2, 3))
    g = gradient(Function([x], x))
    xe = pb.var("x", shape=(2, 3))
    expected = typed_fn([xe], Tuple([xe, Tuple([op.ones((2, 3), "float32")])]))
    pb.assert_structural_equal(g, expected)
    assert_valid(g)


def test_add_fan_out_structure():
    x = pb.var("x", shape=(2, 3))
    g = gradient(Function([x], op.add(x, x)))
    xe = pb.var("x", shape=(2, 3))
    seed = op.ones((2, 3), "float32")
    dx = op.add(op.collapse_sum_like(seed, xe), op.collapse_sum_like(seed, xe))
    pb.assert_structural_equal(g, typed_fn([xe], Tuple([op.add(xe, xe), Tuple([dx])])))
    r, (gx,) = run(g, randn(2, 3))
    np.testing.assert_allclose(gx, np.full((2, 3), 2.0))


def test_multiply():
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
    xv, yv = randn(2, 3), randn(2, 3)
    r, (gx, gy) = run(gradient(Function([x, y], op.multiply(x, y))), xv, yv)
    np.testing.assert_allclose(r, xv * yv)
    np.testing.assert_allclose(gx, yv)
    np.testing.assert_allclose(gy, xv)


def test_tuple_result_seeds_every_field_with_ones():
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
    g = gradient(Function([x, y], Tuple([op.add(x, y), op.multiply(x, y)])))
    xv, yv = randn(2, 3), randn(2, 3)
    (a, b), (gx, gy) = run(g, xv, yv)
    np.testing.assert_allclose(gx, 1 + yv, rtol=1e-6)
    np.testing.assert_allclose(gy, 1 + xv, rtol=1e-6)
    assert_valid(g)


def test_tuple_argument_of_three_gets_tuple_gradient_of_ones():
    t = pb.Var("t", TupleType((T23, T23, T23)))
    body = op.add(op.add(TupleGetItem(t, 0), TupleGetItem(t, 1)), TupleGetItem(t, 2))
    g = gradient(Function([t], body))
    assert g.ret_type.fields[1] == TupleType((TupleType((T23, T23, T23)),))
    vals = (randn(2, 3), randn(2, 3), randn(2, 3))
    _, (dt,) = run(g, vals)
    assert len(dt) == 3
    for field in dt:
        np.testing.assert_array_equal(field, np.ones((2, 3), "float32"))


def test_no_duplication_dense():
    x, w = pb.var("x", shape=(2, 3)), pb.var("w", shape=(4, 3))
    g = gradient(Function([x, w], op.nn.dense(x, w)))
    assert count_calls(g, ["nn.dense"]) == 3
    check_grad(Function([x, w], op.nn.dense(x, w)), [randn(2, 3), randn(4, 3)])


def test_no_duplication_with_tuples():
    x, w = pb.var("x", shape=(2, 3)), pb.var("w", shape=(4, 3))
    y = op.nn.dense(x, w)
    t = Tuple([y, y])
    f = Function([x, w], op.add(TupleGetItem(t, 0), TupleGetItem(t, 1)))
    g = gradient(f)
    assert count_calls(g, ["nn.dense"]) == 3
    check_grad(f, [randn(2, 3), randn(4, 3)])


# ------------------------------------------------------------------ fan-out and sharing


def test_fan_out_is_one_sum_and_forward_nodes_are_shared():
    x = pb.var("x", shape=(2, 3))
    e, th, lg = op.exp(x), op.tanh(x), op.log(x)
    body = op.add(op.add(e, th), lg)
    g = gradient(Function([x], body))
    dx = g.body.fields[1].fields[0]
    # one sum of the three contributions: add(add(a, b), c)
    assert isinstance(dx, Call) and dx.op.name == "add"
    assert isinstance(dx.args[0], Call) and dx.args[0].op.name == "add"
    assert not (isinstance(dx.args[1], Call) and dx.args[1].op.name == "add")
    # 2 forward adds + 2 adds summing the fan-out, nothing else
    assert count_calls(g, ["add"]) == 4
    # the forward result is the original node: forward work is shared, not copied
    assert g.body.fields[0] is body
    assert count_calls(g, ["exp"]) == 1 and count_calls(g, ["tanh"]) == 1
    check_grad(Function([x], body), [np.abs(randn(2, 3)) + 0.5])


def test_tuple_get_item_of_params_and_intermediates():
    p = pb.Var("p", TupleType((T23, T23)))
    y = pb.var("y", shape=(2, 3))
    t = Tuple([op.exp(TupleGetItem(p, 0)), op.tanh(y)])
    body = op.add(op.multiply(TupleGetItem(t, 0), TupleGetItem(t, 1)), TupleGetItem(p, 1))
    check_grad(Function([p, y], body), [(randn(2, 3), randn(2, 3)), randn(2, 3)])


def test_nested_tuples():
    inner = TupleType((T23, TensorType((3,), "float32")))
    p = pb.Var("p", TupleType((inner, T23)))
    a, b = TupleGetItem(TupleGetItem(p, 0), 0), TupleGetItem(TupleGetItem(p, 0), 1)
    c = TupleGetItem(p, 1)
    nested = Tuple([Tuple([op.multiply(a, b), op.tanh(c)]), op.exp(b)])
    body = Tuple([TupleGetItem(TupleGetItem(nested, 0), 0), op.add(TupleGetItem(TupleGetItem(nested, 0), 1), c), nested])
    f = Function([p], body)
    g = gradient(f)
    assert g.ret_type.fields[1] == TupleType((p.type_annotation,))
    check_grad(f, [((randn(2, 3), randn(3)), randn(2, 3))])
    assert_valid(g)


def test_tuple_param_field_without_contribution_gets_explicit_zeros():
    p = pb.Var("p", TupleType((T23, T23)))
    g = gradient(Function([p], op.exp(TupleGetItem(p, 0))))
    dp = g.body.fields[1].fields[0]
    assert isinstance(dp, Tuple)
    assert isinstance(dp.fields[1], Call) and dp.fields[1].op.name == "zeros"
    _, (dpv,) = run(g, (randn(2, 3), randn(2, 3)))
    np.testing.assert_array_equal(dpv[1], np.zeros((2, 3)))


def test_tuple_valued_operator_gets_zeros_only_for_unused_fields():
    x = pb.var("x", shape=(6, 2))
    parts = op.split(x, 3, axis=0)
    f = Function([x], op.add(op.exp(TupleGetItem(parts, 0)), op.tanh(TupleGetItem(parts, 2))))
    g = gradient(f)
    splits = [n for n in post_order(g.body) if isinstance(n, Call) and n.op.name == "split"]
    assert len(splits) == 1  # the forward split is shared, not copied
    check_grad(f, [randn(6, 2)])


# ------------------------------------------------------------------ If


def _if_program():
    c = pb.var("c", shape=(), dtype="bool")
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
    shared = op.tanh(x)  # used by both branches and after the If
    branch = If(c, op.multiply(op.exp(x), shared), op.add(op.multiply(x, y), shared))
    return Function([c, x, y], op.multiply(branch, y))


@pytest.mark.parametrize("cond", [True, False])
def test_if_both_branches_match_finite_differences(cond):
    f = _if_program()
    check_grad(f, [np.array(cond), randn(2, 3), randn(2, 3)], wrt=["x", "y"])


def test_if_gradient_uses_an_if_on_the_same_condition():
    f = _if_program()
    g = gradient(f)
    ifs = [n for n in post_order(g.body) if isinstance(n, If)]
    assert len(ifs) == 2
    assert all(n.cond is f.params[0] for n in ifs)
    assert_valid(g)


@pytest.mark.parametrize("cond", [True, False])
def test_if_second_order(cond):
    check_second_order(_if_program(), [np.array(cond), randn(2, 3), randn(2, 3)], wrt=["x", "y"])


@pytest.mark.parametrize("c1,c2", [(True, True), (True, False), (False, True), (False, False)])
def test_nested_ifs(c1, c2):
    a, b = pb.var("a", shape=(), dtype="bool"), pb.var("b", shape=(), dtype="bool")
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    inner = If(b, op.multiply(x, y), op.exp(y))
    outer = If(a, op.tanh(op.add(inner, x)), op.multiply(inner, inner))
    f = Function([a, b, x, y], op.add(outer, op.tanh(x)))
    check_grad(f, [np.array(c1), np.array(c2), randn(3), randn(3)])


def test_if_with_tuple_result():
    c = pb.var("c", shape=(), dtype="bool")
    x = pb.var("x", shape=(3,))
    f = Function([c, x], TupleGetItem(If(c, Tuple([op.exp(x), x]), Tuple([x, op.tanh(x)])), 1))
    for cond in (True, False):
        check_grad(f, [np.array(cond), randn(3)])


# ------------------------------------------------------------------ calls and recursion


def _layer_module():
    x, w = pb.var("x", shape=(2, 3)), pb.var("w", shape=(3, 3))
    layer = Function([x, w], op.tanh(op.nn.dense(x, w)))
    mod = pb.IRModule({"layer": layer})
    gv = mod.get_global_var("layer")
    x0, w1, w2 = pb.var("x", shape=(2, 3)), pb.var("w1", shape=(3, 3)), pb.var("w2", shape=(3, 3))
    main = Function([x0, w1, w2], op.sum(Call(gv, [Call(gv, [x0, w1]), w2])))
    return mod.with_function("main", main)


def test_calls_to_global_functions_are_differentiated_through():
    mod = _layer_module()
    out = FirstOrderGradient()(mod)
    assert set(out) == {"layer", "main", "main_grad"}
    assert out["main"] is mod["main"]
    g = out["main_grad"]
    assert not any(isinstance(n, Call) and isinstance(n.op, pb.GlobalVar) for n in post_order(g.body))
    check_grad(mod, [randn(2, 3), randn(3, 3), randn(3, 3)])


def _call_chain(n: int) -> pb.IRModule:
    """``@f1 -> @f2 -> ... -> @fn``, each ``f_k(x) = f_{k+1}(0.5 x) + x`` (``f_n = tanh``)."""
    fns = {}
    for k in range(n, 0, -1):
        x = pb.var("x", shape=(3,))
        inner = op.tanh(x) if k == n else Call(pb.GlobalVar(f"f{k + 1}"), [op.multiply(x, pb.const(0.5))])
        fns[pb.GlobalVar(f"f{k}")] = Function([x], inner if k == n else op.add(inner, x))
    x = pb.var("x", shape=(3,))
    fns[pb.GlobalVar("main")] = Function([x], op.sum(Call(pb.GlobalVar("f1"), [x])))
    return pb.IRModule(fns)


def test_a_chain_of_calls_is_inlined_and_differentiated():
    mod = _call_chain(12)
    check_grad(mod, [randn(3)])
    g = FirstOrderGradient()(mod)["main_grad"]
    assert not any(isinstance(n, Call) and isinstance(n.op, pb.GlobalVar) for n in post_order(g.body))


def test_a_call_independent_of_the_callees_parameters_is_inlined_once():
    """``g(y) = tanh(y) + helper(c)`` called twice: ``helper(c)`` is the same in both copies of ``g``."""
    h, y, x = pb.var("h", shape=(3,)), pb.var("y", shape=(3,)), pb.var("x", shape=(3,))
    c = pb.const(np.linspace(-1.0, 1.0, 3).astype("float32"))
    helper, g = pb.GlobalVar("helper"), pb.GlobalVar("g")
    mod = pb.IRModule({helper: Function([h], op.exp(h)), g: Function([y], op.add(op.tanh(y), Call(helper, [c]))),
                       pb.GlobalVar("main"): Function([x], op.sum(op.multiply(Call(g, [x]), Call(g, [op.sin(x)]))))})
    grad = FirstOrderGradient()(mod)["main_grad"]
    assert count_calls(grad.body, ["exp"]) == 1 and count_calls(grad.body, ["tanh"]) == 2
    check_grad(mod, [randn(3)])


def test_two_calls_with_the_same_arguments_are_two_copies():
    """As if each call site were substituted: sharing between call sites is CSE's job, not the inliner's."""
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    mod = pb.IRModule({"f": Function([y], op.tanh(y))})
    gv = mod.get_global_var("f")
    mod = mod.with_function("main", Function([x], op.sum(op.add(Call(gv, [x]), Call(gv, [x])))))
    g = FirstOrderGradient()(mod)["main_grad"]
    assert count_calls(g.body, ["tanh"]) == 2
    check_grad(mod, [randn(3)])


def test_a_chain_of_five_thousand_calls_goes_through_ad():
    """Inlining is top-down: each body is walked once per call site (a chain of n calls is O(n) work; inlining
    every function bottom-up copied each callee's whole inlined body into its caller: O(n^2))."""
    n = 5_000
    mod = _call_chain(n)
    g = FirstOrderGradient()(mod)["main_grad"]
    assert count_calls(g.body, ["tanh"]) == 1 and count_calls(g.body, ["add"]) >= n - 1
    (out, (dx,)) = pb.build(pb.IRModule.from_expr(g))["main"](np.zeros(3, "float32"))
    np.testing.assert_allclose(dx, np.full(3, 2.0), rtol=1e-6)  # d/dx of f1 at 0: 1 + 0.5 (1 + 0.5 (...)) = 2


def test_recursion_is_a_diagnostic():
    x = pb.var("x", shape=(3,))
    f_gv = pb.GlobalVar("f")
    y = pb.var("y", shape=(3,))
    f = Function([y], op.tanh(Call(f_gv, [y])), ret_type=TensorType((3,), "float32"))
    mod = pb.IRModule({f_gv: f})
    mod = mod.with_function("main", Function([x], Call(f_gv, [x])))
    with pytest.raises(pb.DiagnosticError) as err:
        FirstOrderGradient()(mod)
    assert len(err.value.diagnostics) == 1
    assert "recursion" in err.value.diagnostics[0] and "@f -> @f" in err.value.diagnostics[0]


# ------------------------------------------------------------------ parameters and wrt


def test_unused_param_gets_zeros():
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(4,))
    g = gradient(Function([x, y], op.exp(x)))
    dy = g.body.fields[1].fields[1]
    pb.assert_structural_equal(dy, op.zeros((4,), "float32"))
    _, (gx, gy) = run(g, randn(2, 3), randn(4))
    np.testing.assert_array_equal(gy, np.zeros(4))


def test_unused_dynamic_param_gets_zeros_like():
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(Any, 3))
    g = gradient(Function([x, y], op.exp(x)))
    dy = g.body.fields[1].fields[1]
    assert isinstance(dy, Call) and dy.op.name == "zeros_like" and dy.args[0] is y
    _, (gx, gy) = run(g, randn(2, 3), randn(5, 3))
    np.testing.assert_array_equal(gy, np.zeros((5, 3)))


def test_int_params_are_excluded_and_an_error_in_wrt():
    x, n = pb.var("x", shape=(3,)), pb.var("n", shape=(3,), dtype="int32")
    f = Function([x, n], op.multiply(x, op.cast(n, "float32")))
    g = gradient(f)
    assert len(g.ret_type.fields[1].fields) == 1
    _, (gx,) = run(g, randn(3), np.array([1, 2, 3], "int32"))
    np.testing.assert_allclose(gx, [1, 2, 3])
    with pytest.raises(pb.DiagnosticError) as err:
        gradient(f, wrt=["x", "n"])
    assert "%n" in str(err.value) and "integer" in str(err.value)


def test_wrt_subset_and_order():
    x, w = pb.var("x", shape=(2, 3)), pb.var("w", shape=(4, 3))
    f = Function([x, w], op.nn.dense(x, w))
    g = gradient(f, wrt=["w", "x"])
    assert g.ret_type.fields[1] == TupleType((TensorType((4, 3), "float32"), T23))
    g_w = gradient(f, wrt=[w])
    assert g_w.ret_type.fields[1] == TupleType((TensorType((4, 3), "float32"),))
    assert count_calls(g_w, ["nn.dense"]) == 2  # dx is not built for an input not differentiated
    check_grad(f, [randn(2, 3), randn(4, 3)], wrt=["w"])
    with pytest.raises(pb.DiagnosticError, match="'z' is not a parameter"):
        gradient(f, wrt=["z"])


# ------------------------------------------------------------------ modes


def _mlp():
    x = pb.var("x", shape=(4, 5))
    w1, b1, w2 = pb.var("w1", shape=(8, 5)), pb.var("b1", shape=(8,)), pb.var("w2", shape=(3, 8))
    h = op.nn.relu(op.add(op.nn.dense(x, w1), b1))
    return Function([x, w1, b1, w2], op.tanh(op.nn.dense(h, w2)))


def test_vjp_mode_equals_torch():
    torch = pytest.importorskip("torch")
    f = _mlp()
    args = [randn(4, 5), randn(8, 5), randn(8), randn(3, 8)]
    ct = randn(4, 3)
    g = gradient(f, mode="vjp")
    assert [p.name_hint for p in g.params] == ["x", "w1", "b1", "w2", "ct"]
    r, grads = run(g, *args, ct)
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    out = torch.tanh(torch.relu(ts[0] @ ts[1].T + ts[2]) @ ts[3].T)
    expected = torch.autograd.grad(out, ts, torch.tensor(ct))
    np.testing.assert_allclose(r, out.detach().numpy(), rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_vjp_mode_with_tuple_result_has_one_tuple_cotangent():
    x = pb.var("x", shape=(3,))
    f = Function([x], Tuple([op.exp(x), op.tanh(x)]))
    g = gradient(f, mode="vjp")
    t3 = TensorType((3,), "float32")
    assert len(g.params) == 2 and g.params[1].type_annotation == TupleType((t3, t3))
    xv, c0, c1 = randn(3), randn(3), randn(3)
    _, (gx,) = run(g, xv, (c0, c1))
    np.testing.assert_allclose(gx, c0 * np.exp(xv) + c1 * (1 - np.tanh(xv) ** 2), rtol=1e-5)


def test_grad_mode_equals_finite_differences_of_sum_of_outputs():
    f = _mlp()
    args = [randn(4, 5).astype("float64") for _ in range(1)] + [randn(8, 5), randn(8), randn(3, 8)]
    from pullback.testing import to_float64

    f64 = to_float64(f)
    args = [np.asarray(a, "float64") for a in args]
    exe = pb.build(FirstOrderGradient()(pb.IRModule.from_expr(f64)))
    _, grads = exe["main_grad"](*args)
    eps = 1e-6
    for k in range(4):
        for idx in [(0,) * args[k].ndim, tuple(d - 1 for d in args[k].shape)]:
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[k][idx] += eps
            minus[k][idx] -= eps
            numeric = (exe["main"](*plus).sum() - exe["main"](*minus).sum()) / (2 * eps)
            np.testing.assert_allclose(grads[k][idx], numeric, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------ second order


def test_second_order_from_main_grad():
    x = pb.var("x", shape=(3,))
    mod = FirstOrderGradient()(pb.IRModule.from_expr(Function([x], op.sum(op.multiply(op.multiply(x, x), x)))))
    # d/dx sum(3 x^2) = 6 x
    x2 = pb.var("x", shape=(3,))
    dx = TupleGetItem(TupleGetItem(Call(mod.get_global_var("main_grad"), [x2]), 1), 0)
    mod = mod.with_function("g", Function([x2], op.sum(dx)))
    mod = FirstOrderGradient("g")(mod)
    xv = np.array([1.0, -2.0, 0.5], "float32")
    _, (ddx,) = pb.build(mod)["g_grad"](xv)
    np.testing.assert_allclose(ddx, 6 * xv, rtol=1e-6)


def test_second_order_hessian_vector_products():
    f = _mlp()
    args = [randn(4, 5), randn(8, 5), randn(8), randn(3, 8)]
    args[0] += 0.05  # keep relu inputs away from 0
    check_second_order(f, args)


# ------------------------------------------------------------------ diagnostics


def _id_infer(arg_types, attrs):
    return arg_types[0]


NOGRAD_A = OpDef("test.nograd_a", 1, _id_infer, lambda x, attrs=None: x)
NOGRAD_B = OpDef("test.nograd_b", 1, _id_infer, lambda x, attrs=None: x)


def test_every_problem_is_reported_at_once():
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    z = pb.var("z", shape=(3,))
    closure = Function([z], op.exp(z))
    a = Call(NOGRAD_A, [op.exp(x)])
    b = Call(NOGRAD_B, [op.tanh(a)])
    body = Tuple([op.add(b, y), closure])
    with pytest.raises(pb.DiagnosticError) as err:
        gradient(Function([x, y], body))
    diags = err.value.diagnostics
    assert len(diags) == 3
    text = str(err.value)
    assert "test.nograd_a" in text and "test.nograd_b" in text and "closure" in text
    assert all("in @main:" in d for d in diags)
    assert any("= test.nograd_b(" in d for d in diags)  # the printed binding


def test_no_gradient_needed_is_not_a_problem():
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    # greater is boolean: feeding where's condition needs no gradient
    f = Function([x, y], op.where(op.greater(x, y), x, op.multiply(y, y)))
    check_grad(f, [randn(3), randn(3) + 3.0])
    # an op without gradient on a parameter outside wrt needs none either
    g = gradient(Function([x, y], op.multiply(x, Call(NOGRAD_A, [y]))), wrt=["x"])
    assert len(g.ret_type.fields[1].fields) == 1


# ------------------------------------------------------------------ scale


@pytest.mark.slow
def test_million_node_chain():
    x = pb.var("x", shape=(2,))
    h = x
    for i in range(1_000_000):
        h = op.exp(h) if i % 100_000 == 0 else op.negative(h)
    f = Function([x], h)
    mod = FirstOrderGradient()(pb.IRModule.from_expr(f))
    g = mod["main_grad"]
    assert count_calls(g, ["negative"]) == 2 * count_calls(f, ["negative"])
    assert g.body.fields[0] is h


def test_output_passes_infer_type_and_well_formed():
    f = _mlp()
    mod = FirstOrderGradient(mode="vjp")(pb.IRModule.from_expr(f))
    mod = InferType()(mod)
    check_well_formed(mod)
    g = mod["main_grad"]
    assert g.checked_type.ret_type == g.ret_type


def _wrong_shape_grad(call, g):
    return [op.sum(g)]  # a scalar for a (3,) input


WRONG_RULE = OpDef("test.wrong_rule", 1, _id_infer, lambda x, attrs=None: x, grad=_wrong_shape_grad)


def test_a_gradient_rule_of_the_wrong_type_is_reported_with_the_op():
    x = pb.var("x", shape=(3,))
    with pytest.raises(pb.TypeInferenceError, match="gradient rule of test.wrong_rule") as err:
        gradient(Function([x], op.exp(Call(WRONG_RULE, [x]))))
    assert "in @main:" in str(err.value)


def test_bad_arguments():
    x = pb.var("x", shape=(3,))
    with pytest.raises(pb.PassError, match="mode"):
        FirstOrderGradient(mode="forward")
    with pytest.raises(pb.PullbackError, match="no function @nope"):
        FirstOrderGradient("nope")(pb.IRModule.from_expr(Function([x], x)))
    with pytest.raises(pb.PassError):
        gradient("not a function")


# ------------------------------------------------------------------ an existing function is never replaced


def _with_function(mod: pb.IRModule, name: str) -> pb.IRModule:
    """``mod`` plus a user function ``@name`` and a ``@caller`` that calls it."""
    y = pb.var("y", shape=(3,))
    mod = mod.with_function(name, Function([y], op.negative(y)))
    z = pb.var("z", shape=(3,))
    return mod.with_function("caller", Function([z], Call(mod.get_global_var(name), [z])))


def _small_module() -> pb.IRModule:
    x = pb.var("x", shape=(3,))
    return pb.IRModule.from_expr(Function([x], op.tanh(x)))


NAME_CLASHES = {  # how the gradient's name can meet an existing function: (module, pass arguments, name)
    "a second run on its own output": (lambda: FirstOrderGradient()(_small_module()), {}, "main_grad"),
    "a user function named main_grad": (lambda: _with_function(_small_module(), "main_grad"), {}, "main_grad"),
    "name= an unrelated function": (lambda: _with_function(_small_module(), "helper"), {"name": "helper"}, "helper"),
    "name= a callee of func": (_layer_module, {"name": "layer"}, "layer"),
    "name= a function calling func": (lambda: _with_function(_small_module(), "helper"), {"name": "caller"}, "caller"),
    "func's default name exists": (lambda: _with_function(_layer_module(), "layer_grad"), {"func": "layer"}, "layer_grad"),
}


@pytest.mark.parametrize("case", list(NAME_CLASHES))
def test_an_existing_function_is_never_replaced(case):
    build, kwargs, clash = NAME_CLASHES[case]
    mod = build()
    before = {k: mod[k] for k in mod}
    with pytest.raises(pb.PassError, match=f"already has a function @{clash}\\b") as err:
        FirstOrderGradient(**kwargs)(mod)
    assert "name=" in str(err.value)
    assert {k: mod[k] for k in mod} == before  # the input module is unchanged
    other = FirstOrderGradient(**{**kwargs, "name": "fresh_grad"})(mod)  # a free name works
    assert set(other) == set(mod) | {"fresh_grad"}
    assert all(other[k] is mod[k] for k in mod)


def test_the_gradient_cannot_replace_its_own_function():
    with pytest.raises(pb.PassError, match="cannot replace @main"):
        FirstOrderGradient(name="main")
    with pytest.raises(pb.PassError, match="name must be a function name"):
        FirstOrderGradient(name=3)


def test_existing_main_grad_keeps_its_callers_and_gradient_picks_a_free_name():
    mod = _with_function(_small_module(), "main_grad")
    xv = randn(3)
    np.testing.assert_allclose(run(mod, xv, func="caller"), -xv)  # @caller calls the user's @main_grad
    g = gradient(mod)  # returns a Function: it needs no name in the module
    _, (gx,) = run(g, xv)
    np.testing.assert_allclose(gx, 1 - np.tanh(xv) ** 2, rtol=1e-6)
    np.testing.assert_allclose(run(mod, xv, func="caller"), -xv)


# ------------------------------------------------------------------ If: only the taken branch runs


def _branch_scope_of(fn: Function, name: str) -> list:
    """The scopes (in the gradient program) of every call to ``name``."""
    from pullback.ir.scope import ScopeInfo

    info = ScopeInfo(fn.body)
    return [info.scope_of[id(n)] for n in post_order(fn.body) if isinstance(n, Call) and n.op_name == name]


def _cleaned_grad(f: Function) -> Function:
    mod = pb.transform.standard_cleanup()(FirstOrderGradient()(pb.IRModule.from_expr(f)))
    g = mod["main_grad"]
    assert_valid(g)
    return g


def test_if_branch_forward_work_stays_in_its_branch():
    c, x = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(3,))
    f = Function([c, x], If(c, op.exp(x), op.tanh(x)))
    g = _cleaned_grad(f)
    for name, branch in (("exp", 0), ("tanh", 1)):
        scopes = _branch_scope_of(g, name)
        assert len(scopes) == 1
        assert scopes[0].if_node is not None and scopes[0].branch == branch
    for cond in (True, False):
        check_grad(f, [np.array(cond), randn(3)])


def test_residuals_other_than_the_result_are_returned_by_the_forward_if():
    c, x, y = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
    e, s = op.exp(x), op.sin(y)
    f = Function([c, x, y], op.sum(If(c, op.multiply(e, s), op.multiply(op.tanh(x), y))))
    g = gradient(f)
    for name in ("exp", "sin", "tanh"):
        assert all(s.if_node is not None for s in _branch_scope_of(g, name)), name
    head = g.body.fields[0].args[0]  # sum(F.0): the forward If, widened to (result, residuals...)
    assert isinstance(head, TupleGetItem) and head.index == 0 and isinstance(head.tuple_value, If)
    assert len(head.tuple_value.checked_type.fields) > 1
    assert_valid(g)
    for cond in (True, False):
        check_grad(f, [np.array(cond), randn(2, 3), randn(2, 3)])


def test_guarded_log_is_not_evaluated_on_the_other_side():
    x = pb.var("x", shape=(3,))
    cond = op.greater(op.min(x), pb.const(0.0))
    f = Function([x], op.sum(If(cond, op.multiply(op.log(x), x), op.negative(x))))
    g = _cleaned_grad(f)
    assert all(s.if_node is not None for s in _branch_scope_of(g, "log"))
    exe = pb.build(pb.IRModule.from_expr(g))
    neg = -np.abs(randn(3)) - 0.5
    with np.errstate(invalid="raise", divide="raise"):  # log of a negative would raise
        r, (gx,) = exe["main"](neg)
    np.testing.assert_allclose(gx, -np.ones(3))
    pos = np.abs(randn(3)) + 0.5
    check_grad(f, [pos])
    check_grad(f, [neg])


_COUNT = {"n": 0}


def _counting_exp(x, attrs=None):
    _COUNT["n"] += 1
    return np.exp(x)


COUNTING_EXP = OpDef("test.counting_exp", 1, _id_infer, _counting_exp,
                     grad=lambda call, g: [op.multiply(g, call)])  # not registered


@pytest.mark.parametrize("nested", [False, True])
def test_untaken_branch_runs_nothing_in_the_gradient_program(nested):
    c, x = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(3,))
    taken = Call(COUNTING_EXP, [x])
    if nested:
        d = pb.var("d", shape=(), dtype="bool")
        then = If(d, op.tanh(taken), op.multiply(taken, x))
        f = Function([c, d, x], op.sum(If(c, then, op.negative(x))))
    else:
        f = Function([c, x], op.sum(If(c, op.tanh(taken), op.negative(x))))
    g = gradient(f)
    assert_valid(g)
    exe = pb.build(pb.IRModule.from_expr(g))
    flags = [np.array(False)] * (2 if nested else 1)
    _COUNT["n"] = 0
    exe["main"](*flags, randn(3))
    assert _COUNT["n"] == 0
    xv = randn(3)
    flags = [np.array(True)] * (2 if nested else 1)
    r, grads = exe["main"](*flags, xv)
    assert _COUNT["n"] == 1  # forward value computed once and reused by the backward
    ex = np.exp(xv)
    want = (1 - np.tanh(ex) ** 2) * ex
    np.testing.assert_allclose(grads[-1], want, rtol=1e-5)


def _nested_residual_program():
    a, b = pb.var("a", shape=(), dtype="bool"), pb.var("b", shape=(), dtype="bool")
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    inner = If(b, op.multiply(op.exp(x), y), op.tanh(op.multiply(x, y)))
    outer = If(a, op.multiply(op.tanh(op.add(inner, x)), inner), op.sigmoid(op.multiply(y, y)))
    return Function([a, b, x, y], op.sum(op.multiply(outer, op.tanh(x))))


@pytest.mark.parametrize("c1,c2", [(True, True), (True, False), (False, True), (False, False)])
def test_nested_ifs_with_residuals(c1, c2):
    f = _nested_residual_program()
    check_grad(f, [np.array(c1), np.array(c2), randn(3), randn(3)])


def test_nested_if_forward_work_stays_nested():
    f = _nested_residual_program()
    for g in (gradient(f), _cleaned_grad(f)):
        exps = _branch_scope_of(g, "exp")
        assert len(exps) == 1 and exps[0].depth == 2  # then of inner, inside then of outer
        sig = _branch_scope_of(g, "sigmoid")
        assert len(sig) == 1 and sig[0].if_node is not None and sig[0].branch == 1
        assert_valid(g)


@pytest.mark.parametrize("c1,c2", [(True, True), (False, True), (True, False)])
def test_nested_ifs_second_order(c1, c2):
    f = _nested_residual_program()
    check_second_order(f, [np.array(c1), np.array(c2), randn(3), randn(3)], wrt=["x", "y"])


def test_if_with_tuple_result_and_residuals():
    c, x = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(3,))
    e = op.exp(x)
    t = If(c, Tuple([op.multiply(e, e), op.tanh(e)]), Tuple([op.negative(x), op.sigmoid(x)]))
    f = Function([c, x], op.add(op.sum(TupleGetItem(t, 0)), op.sum(op.multiply(TupleGetItem(t, 1), x))))
    g = gradient(f)
    assert all(s.if_node is not None for s in _branch_scope_of(g, "exp"))
    assert_valid(g)
    for cond in (True, False):
        check_grad(f, [np.array(cond), randn(3)])
        check_second_order(f, [np.array(cond), randn(3)], wrt=["x"])


@pytest.mark.parametrize("c1,c2", [(True, True), (True, False), (False, True), (False, False)])
def test_if_results_feeding_later_computation_with_shared_values(c1, c2):
    a, b = pb.var("a", shape=(), dtype="bool"), pb.var("b", shape=(), dtype="bool")
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
    shared = op.tanh(x)  # used in both Ifs and after them
    r1 = If(a, op.multiply(op.exp(y), shared), op.sigmoid(op.add(x, y)))
    r2 = If(b, op.multiply(shared, shared), op.exp(op.multiply(r1, y)))
    f = Function([a, b, x, y], op.sum(op.multiply(op.multiply(r1, r2), shared)))
    g = gradient(f)
    assert all(s.if_node is not None for s in _branch_scope_of(g, "sigmoid"))
    assert_valid(g)
    # moderate inputs: exp(exp(y) * tanh(x) * y) reaches 1e5 at |y| ~ 2, where central differences
    # in float64 lose six digits to rounding
    check_grad(f, [np.array(c1), np.array(c2), 0.5 * randn(2, 3), 0.5 * randn(2, 3)])


def test_dynamic_shape_residual_stays_shared_and_correct():
    c = pb.var("c", shape=(), dtype="bool")
    x = pb.Var("x", TensorType((Any, 3), "float32"))
    f = Function([c, x], op.sum(If(c, op.exp(op.tanh(x)), op.negative(x))))
    g = gradient(f)
    assert_valid(g)
    exe = pb.build(pb.IRModule.from_expr(g))
    xv = randn(4, 3)
    for cond in (True, False):
        _, (gx,) = exe["main"](np.array(cond), xv)
        th = np.tanh(xv)
        want = np.exp(th) * (1 - th ** 2) if cond else -np.ones_like(xv)
        np.testing.assert_allclose(gx, want, rtol=1e-5)


def _if_chain(depth: int) -> Function:
    """Each If only in the then-branch of the next: nesting depth ``depth``, residuals at every level."""
    c, x = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(3,))
    h = x
    for _ in range(depth):
        h = If(c, op.add(h, op.multiply(op.exp(op.tanh(h)), pb.const(0.01))), op.sin(x))
    return Function([c, x], h)


def test_deeply_nested_ifs_keep_their_work_nested():
    depth = 120
    g = gradient(_if_chain(depth))
    assert_valid(g)
    assert max(s.depth for s in _branch_scope_of(g, "exp")) == depth
    exe = pb.build(pb.IRModule.from_expr(g))
    xv = randn(3).astype("float64").astype("float32")
    for cond in (True, False):
        _, (gx,) = exe["main"](np.array(cond), xv)
        if not cond:
            np.testing.assert_allclose(gx, np.cos(xv), rtol=1e-5)
            continue
        v, d = xv.astype("float64"), np.ones(3)
        for _ in range(depth):
            t = np.tanh(v)
            d = d * (1 + 0.01 * np.exp(t) * (1 - t ** 2))
            v = v + 0.01 * np.exp(t)
        np.testing.assert_allclose(gx, d, rtol=1e-4)


def test_nested_if_residuals_are_linear_in_depth():
    """Residuals of inner Ifs travel out as one bundle per level, never re-listed level by level:
    no tuple grows with the depth, and every level adds the same number of nodes."""

    def size(depth):
        nodes = post_order(gradient(_if_chain(depth)).body)
        return len(nodes), max(len(n.fields) for n in nodes if isinstance(n, Tuple))

    (n1, w1), (n2, w2), (n3, w3) = size(20), size(40), size(60)
    assert w1 == w2 == w3
    assert n3 - n2 == n2 - n1


# ------------------------------------------------------------------ symbolic zeros


def test_a_zero_gradient_adds_nothing():
    x = pb.var("x", shape=(3,))
    f = Function([x], op.add(op.exp(x), op.floor(x)))  # floor's rule returns zeros_like(g)
    g = gradient(f)
    assert count_calls(g, ["zeros", "zeros_like"]) == 0
    assert count_calls(g, ["add"]) == 1  # the forward add: dx is exp's term alone
    xv = np.array([0.3, -1.6, 2.2], "float32")
    _, (gx,) = run(g, xv)
    np.testing.assert_allclose(gx, np.exp(xv), rtol=1e-6)


def test_zeros_are_built_only_where_a_value_is_needed():
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(2,))
    g = gradient(Function([x, y], op.sum(op.floor(x))))
    dx, dy = g.body.fields[1].fields
    pb.assert_structural_equal(dx, op.zeros((3,), "float32"))  # only a zero reached x: a parameter needs a value
    pb.assert_structural_equal(dy, op.zeros((2,), "float32"))


def test_an_if_whose_branches_give_zero_gradients_has_no_gradient_if():
    c, x = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(3,))
    f = Function([c, x], op.add(If(c, op.floor(x), op.sign(x)), op.exp(x)))
    g = gradient(f)
    assert [n for n in post_order(g.body) if isinstance(n, If)] == [f.body.args[0]]  # the forward If alone
    xv = randn(3)
    for cond in (True, False):
        _, (gx,) = run(g, np.array(cond), xv)
        np.testing.assert_allclose(gx, np.exp(xv), rtol=1e-6)


def test_one_sided_if_contributions_get_zeros_on_the_other_side():
    c, x, y = pb.var("c", shape=(), dtype="bool"), pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    f = Function([c, x, y], op.sum(If(c, op.exp(x), op.tanh(y))))
    g = gradient(f)
    grad_if = g.body.fields[1].fields[0].tuple_value
    assert isinstance(grad_if, If)
    (then_dx, then_dy), (else_dx, else_dy) = grad_if.true_branch.fields, grad_if.false_branch.fields
    assert then_dy.op.name == "zeros" and else_dx.op.name == "zeros"
    assert then_dx.op.name != "zeros" and else_dy.op.name != "zeros"
    assert then_dy is else_dx  # one zeros node per type
    xv, yv = randn(3), randn(3)
    _, (gx, gy) = run(g, np.array(True), xv, yv)
    np.testing.assert_allclose(gx, np.exp(xv), rtol=1e-6)
    np.testing.assert_array_equal(gy, np.zeros(3))


# ------------------------------------------------------------------ nesting shapes (residual bundles)


def _nesting_shapes():
    """Programs of three bool conditions ``a, b, c`` and ``x, y``: ways Ifs nest and residuals cross levels."""
    a, b, c = (pb.var(n, shape=(), dtype="bool") for n in "abc")
    x, y = pb.var("x", shape=(3,)), pb.var("y", shape=(3,))
    ex, ty = op.exp(x), op.tanh(y)  # shared by every level

    def level(h, k):  # a branch body reading residuals: its own and one of the level above
        return op.add(op.multiply(op.tanh(h), op.exp(op.multiply(h, y))), op.multiply(k, h))

    then_chain = If(a, level(If(b, level(If(c, level(x, ex), ty), ty), op.sin(y)), ex), op.cos(x))
    else_chain = If(a, op.sin(y), level(If(b, op.cos(x), level(If(c, ty, level(y, ex)), ex)), ty))
    alternating = If(a, level(If(b, op.sin(x), level(If(c, level(x, ty), y), ex)), ty), op.negative(y))
    t1 = op.tanh(op.multiply(x, y))  # a value of the outer then-branch read two levels down
    crossing = If(a, level(If(b, level(If(c, level(t1, t1), t1), t1), op.sin(t1)), t1), ex)
    both_sides = If(a, level(If(b, level(x, ty), ex), ty), level(If(c, ty, level(y, ex)), ex))
    tup = If(a, Tuple([level(If(b, level(x, ex), ty), ty), ex]), Tuple([ty, level(If(c, x, ex), y)]))
    tuple_result = op.add(TupleGetItem(tup, 0), op.multiply(TupleGetItem(tup, 1), TupleGetItem(tup, 0)))
    shared_inner = If(b, level(x, ty), ex)  # used by both branches: evaluated outside them
    shared = If(a, level(shared_inner, ex), op.multiply(shared_inner, ty))
    bodies = {"then chain": then_chain, "else chain": else_chain, "alternating": alternating,
              "residual crossing levels": crossing, "both sides": both_sides, "tuple results": tuple_result,
              "inner If shared by both branches": shared}
    return {k: Function([a, b, c, x, y], op.sum(op.multiply(v, y))) for k, v in bodies.items()}


NESTING_SHAPES = _nesting_shapes()


@pytest.mark.parametrize("shape", list(NESTING_SHAPES))
def test_nesting_shapes_match_finite_differences(shape):
    f = NESTING_SHAPES[shape]
    g = gradient(f)
    assert_valid(g)
    xs = [randn(3) * 0.5, randn(3) * 0.5]
    for conds in np.ndindex(2, 2, 2):
        check_grad(f, [np.array(bool(k)) for k in conds] + xs, wrt=["x", "y"])
    # forward work of a branch stays in a branch: only ex/ty (shared) and the backward are unconditional
    root_exps = [s for s in _branch_scope_of(g, "exp") if s.if_node is None]
    assert len(root_exps) <= 1
