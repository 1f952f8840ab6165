"""The NumPy executor: results, scopes, frames, input checks, liveness, profiling."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Call, Function, GlobalVar, If, IRModule, TensorType, Tuple, TupleGetItem, TupleType, const, op, var
from pullback.ops.registry import OpDef

F32 = "float32"


def run(f_or_mod, *args, func="main"):
    return pb.build(f_or_mod, check_outputs=True)[func](*args)


def rand(*shape, dtype=F32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def same_type(arg_types, attrs):
    return arg_types[0]


class Counter:
    """A test-only operator (not registered) that counts its kernel calls."""

    def __init__(self, name="counted", fail=False):
        self.calls = 0

        def compute(x, attrs=None):
            self.calls += 1
            if fail:
                raise RuntimeError("this branch must not run")
            return np.negative(x)

        self.op = OpDef(name, 1, same_type, compute)

    def __call__(self, x):
        return Call(self.op, [x])


# ---------------------------------------------------------------- results


def test_mlp_forward_matches_numpy():
    x, w1, w2 = var("x", shape=(5, 3)), var("w1", shape=(8, 3)), var("w2", shape=(2, 8))
    h = op.nn.relu(op.nn.dense(x, w1))
    out = op.sum(op.tanh(op.nn.dense(h, w2)), axis=1)
    xs, a, b = rand(5, 3, seed=1), rand(8, 3, seed=2), rand(2, 8, seed=3)
    got = run(Function([x, w1, w2], out), xs, a, b)
    want = np.tanh(np.maximum(xs @ a.T, 0) @ b.T).sum(axis=1)
    assert got.dtype == np.float32 and got.shape == (5,)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_scalar_result_is_an_array():
    x = var("x", shape=(3,))
    got = run(Function([x], op.sum(x)), np.ones(3, F32))
    assert isinstance(got, np.ndarray) and got.shape == () and got == 3


def test_nested_tuples_in_and_out():
    a, b = TensorType((2,), F32), TensorType((3,), F32)
    p = var("p", TupleType((TupleType((a, b)), a)))
    inner = TupleGetItem(p, 0)
    x, y, z = TupleGetItem(inner, 0), TupleGetItem(inner, 1), TupleGetItem(p, 1)
    body = Tuple([op.add(x, z), Tuple([op.negative(y), x])])
    xs, ys, zs = rand(2, seed=1), rand(3, seed=2), rand(2, seed=3)
    got = run(Function([p], body), ((xs, ys), zs))
    assert isinstance(got, tuple) and isinstance(got[1], tuple)
    np.testing.assert_array_equal(got[0], xs + zs)
    np.testing.assert_array_equal(got[1][0], -ys)
    np.testing.assert_array_equal(got[1][1], xs)
    # lists are accepted for tuple parameters
    np.testing.assert_array_equal(run(Function([p], body), [[xs, ys], zs])[0], xs + zs)


def test_builds_untyped_module_and_lists_functions():
    x = var("x", shape=(2,))
    mod = IRModule.from_expr(Function([x], op.exp(x)))
    exe = pb.build(mod)
    assert exe.functions == ["main"]
    np.testing.assert_allclose(exe["main"](np.zeros(2, F32)), np.ones(2, F32))


def test_unknown_target_lists_targets():
    x = var("x", shape=(2,))
    with pytest.raises(pb.PullbackError, match="'tpu'.*numpy"):
        pb.build(Function([x], x), target="tpu")


def test_unknown_function():
    x = var("x", shape=(2,))
    with pytest.raises(pb.ExecutionError, match="@nope.*@main"):
        pb.build(Function([x], x))["nope"]


# ---------------------------------------------------------------- If scopes


def test_if_runs_only_the_taken_branch():
    then_c, else_c = Counter("then_op"), Counter("else_op")
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(3,))
    shared = op.exp(x)  # used by both branches: computed once, outside
    f = Function([c, x], If(c, then_c(then_c(shared)), op.add(else_c(shared), shared)))
    exe = pb.build(f, check_outputs=True)
    xs = rand(3)
    np.testing.assert_allclose(exe["main"](True, xs), np.exp(xs), rtol=1e-6)
    assert (then_c.calls, else_c.calls) == (2, 0)
    np.testing.assert_allclose(exe["main"](False, xs), 0 * xs, atol=1e-6)
    assert (then_c.calls, else_c.calls) == (2, 1)


def test_untaken_branch_kernel_is_never_called():
    bomb = Counter("bomb", fail=True)
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(2,))
    f = Function([c, x], If(c, op.negative(x), bomb(op.exp(x))))
    exe = pb.build(f, check_outputs=True)
    np.testing.assert_array_equal(exe["main"](np.array(True), np.ones(2, F32)), -np.ones(2, F32))
    with pytest.raises(pb.ExecutionError, match="bomb"):
        exe["main"](False, np.ones(2, F32))


def test_nested_ifs_and_branch_results_defined_outside():
    c1, c2, x = var("c1", shape=(), dtype="bool"), var("c2", shape=(), dtype="bool"), var("x", shape=(2,))
    e = op.exp(x)
    inner = If(c2, e, op.negative(e))
    f = Function([c1, c2, x], If(c1, inner, x))
    exe = pb.build(f, check_outputs=True)
    xs = rand(2)
    np.testing.assert_allclose(exe["main"](True, True, xs), np.exp(xs), rtol=1e-6)
    np.testing.assert_allclose(exe["main"](True, False, xs), -np.exp(xs), rtol=1e-6)
    np.testing.assert_array_equal(exe["main"](False, True, xs), xs)


def test_value_used_in_nested_branch_and_after_the_if():
    c1, c2, x = var("c1", shape=(), dtype="bool"), var("c2", shape=(), dtype="bool"), var("x", shape=(2,))
    v = op.exp(x)
    f = Function([c1, c2, x], op.add(If(c1, If(c2, op.negative(v), x), x), v))
    exe = pb.build(f, check_outputs=True)
    xs = rand(2)
    for a in (True, False):
        for b in (True, False):
            want = (-np.exp(xs) if b else xs) if a else xs
            np.testing.assert_allclose(exe["main"](a, b, xs), want + np.exp(xs), rtol=1e-6)


def test_deeply_nested_ifs():
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(2,))
    body = x
    for _ in range(500):
        body = If(c, op.negative(body), body)
    exe = pb.build(Function([c, x], body))
    xs = rand(2)
    np.testing.assert_array_equal(exe["main"](True, xs), xs)  # 500 negations
    np.testing.assert_array_equal(exe["main"](False, xs), xs)


# ---------------------------------------------------------------- calls


def test_calls_between_global_functions():
    a, b = var("a", shape=(3,)), var("b", shape=(3,))
    sq = GlobalVar("sq")
    y = var("y", shape=(3,))
    mod = IRModule({sq: Function([y], op.multiply(y, y))})
    mod = mod.with_function("main", Function([a, b], op.add(Call(sq, [a]), Call(sq, [op.subtract(a, b)]))))
    exe = pb.build(mod, check_outputs=True)
    xs, ys = rand(3, seed=1), rand(3, seed=2)
    np.testing.assert_allclose(exe["main"](xs, ys), xs * xs + (xs - ys) ** 2, rtol=1e-6)
    np.testing.assert_allclose(exe["sq"](xs), xs * xs, rtol=1e-6)
    assert sorted(exe.functions) == ["main", "sq"]


def _count_module():
    n, acc = var("n", shape=(), dtype="int32"), var("acc", shape=())
    gv = GlobalVar("count")
    step = Call(gv, [op.subtract(n, const(1, "int32")), op.add(acc, const(1.0))])
    f = Function([n, acc], If(op.greater(n, const(0, "int32")), step, acc), ret_type=TensorType((), F32))
    x = var("x", shape=(), dtype="int32")
    return IRModule({gv: f}).with_function("main", Function([x], Call(gv, [x, const(0.0)])))


def test_recursion_through_if_depth_10000():
    exe = pb.build(_count_module(), check_outputs=True)
    assert exe["main"](np.int32(10_000)) == 10_000
    assert exe["count"](np.int32(3), np.float32(0.5)) == 3.5


def test_primitive_function_call():
    a, b = var("a", shape=(2, 2)), var("b", shape=(2, 2))
    fused = Function([a, b], op.tanh(op.add(a, b)), attrs={"Primitive": 1})
    x = var("x", shape=(2, 2))
    y = Call(fused, [x, x])
    f = Function([x], Call(fused, [y, x]))
    xs = rand(2, 2)
    np.testing.assert_allclose(run(f, xs), np.tanh(np.tanh(xs + xs) + xs), rtol=1e-6)


# ---------------------------------------------------------------- inputs


def _two_inputs():
    x, n = var("x", shape=(pb.Any, 3)), var("n", shape=(), dtype="int32")
    return pb.build(Function([x, n], op.add(x, x)), check_outputs=True)["main"]


def test_wrong_number_of_inputs():
    with pytest.raises(pb.ExecutionError, match=r"@main takes 2 inputs \(%x, %n\), got 1"):
        _two_inputs()(np.zeros((1, 3), F32))


@pytest.mark.parametrize(
    "value, pattern",
    [
        (np.zeros((2, 4), F32), r"%x expects Tensor\[\(\?, 3\), float32\], got Tensor\[\(2, 4\), float32\]"),
        (np.zeros(3, F32), r"%x expects .* got Tensor\[\(3,\), float32\]"),
        (np.zeros((2, 3), "float64"), r"%x expects .*float32.* got Tensor\[\(2, 3\), float64\]"),
        ([[1, 2, 3]], r"%x expects .*float32.* got Tensor\[\(1, 3\), int"),
        ("abc", r"%x expects"),
    ],
)
def test_bad_input_names_the_parameter(value, pattern):
    with pytest.raises(pb.ExecutionError, match=pattern):
        _two_inputs()(value, 1)


def test_any_dims_and_python_data():
    main = _two_inputs()
    assert main(np.ones((5, 3), F32), np.int32(2)).shape == (5, 3)
    np.testing.assert_array_equal(main([[1.0, 2.0, 3.0]], 2), np.array([[2, 4, 6]], F32))
    with pytest.raises(pb.ExecutionError, match="%n expects Tensor\\[\\(\\), int32\\], got .*float"):
        main(np.ones((1, 3), F32), 2.5)


def test_bad_tuple_input():
    p = var("p", TupleType((TensorType((2,), F32), TensorType((2,), F32))))
    main = pb.build(Function([p], TupleGetItem(p, 0)))["main"]
    with pytest.raises(pb.ExecutionError, match=r"%p expects \(Tensor.*got a tuple of 1"):
        main((np.zeros(2, F32),))
    with pytest.raises(pb.ExecutionError, match=r"%p\.1 expects Tensor\[\(2,\), float32\]"):
        main((np.zeros(2, F32), np.zeros(3, F32)))


def test_inputs_are_never_modified():
    inplace = OpDef("inplace_negative", 1, same_type, lambda x, attrs=None: np.negative(x, out=x))
    x = var("x", shape=(3,))
    xs = rand(3)
    before = xs.copy()
    with pytest.raises(pb.ExecutionError, match="inplace_negative.*read-only"):
        run(Function([x], Call(inplace, [x])), xs)
    np.testing.assert_array_equal(xs, before)
    out = run(Function([x], op.negative(x)), xs)
    out[:] = 7  # results are fresh arrays
    np.testing.assert_array_equal(xs, before)


def test_reshape_result_may_view_input_but_is_read_only():
    x = var("x", shape=(2, 3))
    xs = rand(2, 3)
    before = xs.copy()
    out = run(Function([x], op.reshape(x, (6,))), xs)
    np.testing.assert_array_equal(out, before.reshape(6))
    if np.shares_memory(out, xs):
        with pytest.raises(ValueError):
            out[0] = 1.0
    np.testing.assert_array_equal(xs, before)


# ---------------------------------------------------------------- errors


def test_kernel_error_names_op_and_shapes():
    bad = OpDef("exploding", 2, same_type, lambda a, b, attrs=None: np.dot(a, b))
    x, y = var("x", shape=(2, 3)), var("y", shape=(2, 3))
    with pytest.raises(pb.ExecutionError, match=r"kernel of exploding failed on inputs \(Tensor\[\(2, 3\), float32\], Tensor\[\(2, 3\), float32\]\)"):
        pb.build(Function([x, y], Call(bad, [x, y])))["main"](rand(2, 3), rand(2, 3))


def test_check_outputs_catches_a_wrong_kernel():
    wrong = OpDef("wrong_dtype", 1, same_type, lambda x, attrs=None: x.astype("float64"))
    x = var("x", shape=(2,))
    f = Function([x], op.negative(Call(wrong, [x])))
    with pytest.raises(pb.ExecutionError, match=r"wrong_dtype returned Tensor\[\(2,\), float64\].*Tensor\[\(2,\), float32\]"):
        pb.build(f, check_outputs=True)["main"](rand(2))
    assert pb.build(f)["main"](rand(2)).dtype == np.float64  # unchecked: runs as is


def test_closure_is_rejected():
    x, y = var("x", shape=(2,)), var("y", shape=(2,))
    inner = Function([y], op.add(x, y))  # captures %x
    f = Function([x], Call(inner, [x]))
    with pytest.raises(pb.ExecutionError, match="%x is not a parameter"):
        pb.build(IRModule.from_expr(f))["main"](rand(2))


# ---------------------------------------------------------------- liveness and profile

N = 1000  # floats per intermediate
NB = N * 4


def test_chain_frees_intermediates():
    x = var("x", shape=(N,))
    e = x
    for _ in range(200):
        e = op.negative(e)
    prof = pb.build(Function([x], e), check_outputs=True, reuse=False).profile(rand(N))
    assert prof.peak_bytes == 2 * NB  # one operand and one result, not 200
    np.testing.assert_array_equal(prof.outputs, rand(N))
    reused = pb.build(Function([x], e), check_outputs=True).profile(rand(N))
    assert reused.peak_bytes == NB  # with buffer reuse (the default), every step writes into one buffer
    np.testing.assert_array_equal(reused.outputs, rand(N))


def test_value_freed_inside_the_branch_of_its_last_use():
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(N,))
    a = op.negative(x)  # used in both branches, so computed outside
    then = op.negative(op.negative(op.negative(a)))
    f = Function([c, x], If(c, then, op.exp(a)))
    exe = pb.build(f, check_outputs=True)
    assert exe.profile(True, rand(N)).peak_bytes == 2 * NB  # a dies after its first use in the branch
    assert exe.profile(False, rand(N)).peak_bytes == 2 * NB


def test_value_unused_by_taken_branch_freed_at_branch_start():
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(N,))
    a = op.negative(x)
    b = op.negative(a)
    f = Function([c, x], If(c, op.negative(op.negative(b)), op.add(a, b)))
    exe = pb.build(f, check_outputs=True)
    assert exe.profile(True, rand(N)).peak_bytes == 2 * NB  # a freed when the then branch starts
    np.testing.assert_allclose(exe["main"](False, rand(N)), 0 * rand(N), atol=0)


def test_fan_out_keeps_value_until_last_use():
    x = var("x", shape=(N,))
    a = op.exp(x)
    b = op.negative(a)
    c = op.negative(b)
    f = Function([x], op.add(c, a))  # a is live across b and c
    prof = pb.build(f, check_outputs=True, reuse=False).profile(rand(N))
    assert prof.peak_bytes == 3 * NB
    np.testing.assert_allclose(prof.outputs, 2 * np.exp(rand(N)), rtol=1e-6)
    reused = pb.build(f, check_outputs=True).profile(rand(N))  # c takes b's buffer, the sum c's; a is kept
    assert reused.peak_bytes == 2 * NB
    np.testing.assert_allclose(reused.outputs, 2 * np.exp(rand(N)), rtol=1e-6)


def test_profile_rows_and_render():
    x, w = var("x", shape=(4, 8)), var("w", shape=(8, 8))
    e = x
    for _ in range(3):
        e = op.tanh(op.nn.dense(e, w))
    prof = pb.build(Function([x, w], op.sum(e)), check_outputs=True).profile(rand(4, 8), rand(8, 8))
    calls = {r.op: r.calls for r in prof.rows}
    assert calls == {"nn.dense": 3, "tanh": 3, "sum": 1}
    assert [r.seconds for r in prof.rows] == sorted((r.seconds for r in prof.rows), reverse=True)
    assert abs(sum(r.share for r in prof.rows) - 1.0) < 1e-9
    text = prof.render()
    for name in ("nn.dense", "tanh", "sum", "peak"):
        assert name in text
    assert prof.peak_bytes >= 2 * 4 * 8 * 4


def test_profile_counts_kernels_inside_called_functions():
    exe = pb.build(_count_module())
    prof = exe.profile(np.int32(50))
    assert {r.op: r.calls for r in prof.rows} == {"greater": 51, "subtract": 50, "add": 50}
    assert prof.outputs == 50


@pytest.mark.slow
def test_million_node_chain():
    x = var("x", shape=(2,))
    e = x
    for _ in range(1_000_000):
        e = op.negative(e)
    exe = pb.build(Function([x], e))
    xs = np.array([1.0, -2.0], F32)
    np.testing.assert_array_equal(exe["main"](xs), xs)
