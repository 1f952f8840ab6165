"""What every target shares (the evaluator skeleton): input checks and conversions, If, calls,
recursion and its depth limit, profiles. Table-driven over the targets, with test-only operators
(``xp_ops``) whose one kernel runs on every namespace."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import pullback as pb
from pullback import Call, Function, GlobalVar, If, IRModule, TensorType, Tuple, TupleGetItem, TupleType, const, var
from xp_ops import add, counting, greater, mul, neg, sub

F32 = "float32"
TARGETS = [pytest.param(t, marks=pytest.mark.skipif(importlib.util.find_spec(t) is None, reason=f"{t} not installed"))
           for t in ("numpy", "jax", "torch")]
CONCRETE = [t for t in TARGETS if t.values[0] != "jax"]  # If jumps on a concrete condition; recursion runs


def as_numpy(value):
    """A result leaf (NumPy array or torch tensor) as a NumPy array."""
    return value.detach().cpu().numpy() if type(value).__module__.startswith("torch") else np.asarray(value)


def check_type(target: str, value) -> None:
    if target == "torch":
        import torch

        assert isinstance(value, torch.Tensor), type(value)
    else:
        assert isinstance(value, np.ndarray), type(value)


# ---------------------------------------------------------------- inputs

A = np.arange(6, dtype=F32).reshape(2, 3) - 2.5


def _program():
    x, s = var("x", shape=(2, 3)), var("s", shape=())
    return IRModule.from_expr(Function([x, s], Tuple([mul(x, x), neg(s)])))


def _torch(fn):
    def make():
        import torch

        return fn(torch)

    return make


def _jax(fn):
    def make():
        import jax.numpy as jnp

        return fn(jnp)

    return make


def _read_only():
    a = A.copy()
    a.flags.writeable = False
    return a


# kind -> (make x, make s); every kind means A and 1.5
ACCEPTED = {
    "native": (lambda: A.copy(), lambda: np.float32(1.5)),
    "big-endian": (lambda: A.astype(">f4"), lambda: np.array(1.5, ">f4")),
    "non-contiguous": (lambda: np.repeat(A, 2, axis=1)[:, ::2], lambda: np.full(3, 1.5, F32)[1]),
    "negative-strides": (lambda: A[::-1, ::-1].copy()[::-1, ::-1], lambda: np.array(1.5, F32)),
    "fortran-order": (lambda: np.asfortranarray(A), lambda: np.array(1.5, F32)),
    "read-only": (_read_only, lambda: np.array(1.5, F32)),
    "python": (lambda: A.tolist(), lambda: 1.5),
    "torch": (_torch(lambda t: t.from_numpy(A.copy())), _torch(lambda t: t.tensor(1.5))),
    "torch-requires-grad": (_torch(lambda t: t.tensor(A, requires_grad=True)), _torch(lambda t: t.tensor(1.5))),
    "torch-non-contiguous": (_torch(lambda t: t.from_numpy(A.T.copy()).T), _torch(lambda t: t.tensor([1.5])[0])),
    "jax": (_jax(lambda jnp: jnp.asarray(A)), _jax(lambda jnp: jnp.asarray(1.5, F32))),
}


def _need(kind: str) -> None:
    for lib in ("torch", "jax"):
        if kind.startswith(lib):
            pytest.importorskip(lib)


@pytest.mark.parametrize("kind", sorted(ACCEPTED))
@pytest.mark.parametrize("target", TARGETS)
def test_input_kinds_are_converted(target, kind):
    _need(kind)
    make_x, make_s = ACCEPTED[kind]
    x, s = make_x(), make_s()
    before = [as_numpy(v).copy() if not isinstance(v, (list, float)) else v for v in (x, s)]
    exe = pb.build(_program(), target=target, check_outputs=True)
    for _ in range(2):  # a warm (cached, compiled) call converts like a cold one
        sq, m = exe["main"](x, s)
        check_type(target, sq)
        assert as_numpy(sq).dtype == np.float32 and as_numpy(m).shape == ()
        np.testing.assert_array_equal(as_numpy(sq), A * A)
        np.testing.assert_array_equal(as_numpy(m), np.float32(-1.5))
    for v, b in zip((x, s), before):  # the inputs are left as they were
        if isinstance(v, (list, float)):
            assert v == b
        else:
            np.testing.assert_array_equal(as_numpy(v), b)


@pytest.mark.parametrize("target", TARGETS)
def test_big_endian_float64_and_int_inputs(target):
    x, n = var("x", shape=(3,), dtype="float64"), var("n", shape=(3,), dtype="int32")
    exe = pb.build(Function([x, n], Tuple([add(x, x), sub(n, n), neg(n)])), target=target)
    xs = np.array([1e-300, 2.0, -3.25])
    for _ in range(2):
        d, z, m = exe["main"](xs.astype(">f8"), np.array([1, -2, 70000], ">i4"))
        np.testing.assert_array_equal(as_numpy(d), 2 * xs)
        assert as_numpy(d).dtype == np.float64 and as_numpy(z).dtype == np.int32
        np.testing.assert_array_equal(as_numpy(m), [-1, 2, -70000])


def _torch_tensor(dtype: str, shape=(2, 3)):
    def make():
        import torch

        return torch.zeros(shape, dtype=getattr(torch, dtype))

    return make


EXPECTS_X = "@main: parameter %x expects Tensor[(2, 3), float32], got "
# kind -> (make x, the message's end); s is always valid
REJECTED = {
    "shape": (lambda: np.zeros((3, 2), F32), "Tensor[(3, 2), float32]"),
    "rank": (lambda: np.zeros(6, F32), "Tensor[(6,), float32]"),
    "dtype": (lambda: np.zeros((2, 3)), "Tensor[(2, 3), float64]"),
    "big-endian-dtype": (lambda: np.zeros((2, 3), ">f8"), "Tensor[(2, 3), float64]"),
    "int-list": (lambda: [[1, 2, 3], [4, 5, 6]], "Tensor[(2, 3), int64]"),
    "ragged-list": (lambda: [[1.0], [1.0, 2.0]], "a list of 2"),
    "string": (lambda: "abc", "an array of shape () and dtype str96"),
    "none": (lambda: None, "an array of shape () and dtype object"),
    "torch-dtype": (_torch_tensor("float64"), "Tensor[(2, 3), float64]"),
    "torch-shape": (_torch_tensor("float32", (2, 2)), "Tensor[(2, 2), float32]"),
    "torch-bfloat16": (_torch_tensor("bfloat16"), "Tensor[(2, 3), bfloat16]"),
    "torch-float8": (_torch_tensor("float8_e4m3fn"), "an array of shape (2, 3) and dtype float8_e4m3fn"),
    "jax-dtype": (_jax(lambda jnp: jnp.zeros((2, 3), "int32")), "Tensor[(2, 3), int32]"),
}


@pytest.mark.parametrize("kind", sorted(REJECTED))
@pytest.mark.parametrize("target", TARGETS)
def test_bad_inputs_have_one_message(target, kind):
    _need(kind)
    make_x, got = REJECTED[kind]
    main = pb.build(_program(), target=target)["main"]
    with pytest.raises(pb.ExecutionError) as e:
        main(make_x(), np.float32(1.0))
    assert str(e.value) == EXPECTS_X + got


@pytest.mark.parametrize("target", TARGETS)
def test_bad_counts_and_tuples_have_one_message(target):
    p = var("p", TupleType((TensorType((2,), F32), TensorType((2,), F32))))
    main = pb.build(Function([p], neg(TupleGetItem(p, 1))), target=target)["main"]
    cases = [((np.zeros(2, F32),), "@main takes 1 input (%p), got 2", (np.zeros(2, F32), np.zeros(2, F32))),
             (((np.zeros(2, F32),),), r"@main: parameter %p expects (Tensor[(2,), float32], Tensor[(2,), float32]), "
                                      "got a tuple of 1", None),
             (((np.zeros(2, F32), np.zeros(3, F32)),), "@main: parameter %p.1 expects Tensor[(2,), float32], "
                                                       "got Tensor[(3,), float32]", None)]
    for args, message, extra in cases:
        with pytest.raises(pb.ExecutionError) as e:
            main(*args, *([extra] if extra is not None else []))
        assert str(e.value) == message
    np.testing.assert_array_equal(as_numpy(main([np.ones(2, F32), [1.0, 2.0]])), [-1.0, -2.0])


# ---------------------------------------------------------------- If, calls, groups


def _calls_module():
    y = var("y", shape=(3,))
    helper = GlobalVar("helper")
    a, b = var("a", shape=(3,)), var("b", shape=(3,))
    group = Function([a, b], mul(add(a, b), a), attrs={"Primitive": 1})
    mod = IRModule({helper: Function([y], Call(group, [neg(y), y]))})
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(3,))
    shared = neg(x)
    body = If(c, If(c, Call(helper, [shared]), x), add(shared, const(np.ones(3, F32))))
    return mod.with_function("main", Function([c, x], Tuple([body, mul(shared, shared)])))


@pytest.mark.parametrize("target", TARGETS)
def test_if_calls_groups_and_constants(target):
    exe = pb.build(_calls_module(), target=target, check_outputs=True)
    xs = np.array([1.0, -2.0, 0.5], F32)
    for cond, want in ((True, (-xs + xs) * -xs), (False, 1 - xs)):
        got, sq = exe["main"](np.array(cond), xs)
        check_type(target, got)
        np.testing.assert_allclose(as_numpy(got), want, rtol=1e-6)
        np.testing.assert_array_equal(as_numpy(sq), xs * xs)
    np.testing.assert_allclose(as_numpy(exe["helper"](xs)), (-xs + xs) * -xs)


@pytest.mark.parametrize("target", CONCRETE)
def test_only_the_taken_branch_runs(target):
    then_calls, else_calls = [], []
    then_op, else_op = counting(then_calls), counting(else_calls)
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(3,))
    f = Function([c, x], If(c, Call(then_op, [Call(then_op, [x])]), Call(else_op, [x])))
    exe = pb.build(f, target=target)
    exe["main"](True, np.ones(3, F32))
    assert (len(then_calls), len(else_calls)) == (2, 0)
    exe["main"](False, np.ones(3, F32))
    assert (len(then_calls), len(else_calls)) == (2, 1)


# ---------------------------------------------------------------- recursion and its depth limit


def _count_module():
    n, acc = var("n", shape=(), dtype="int32"), var("acc", shape=())
    gv = GlobalVar("count")
    step = Call(gv, [sub(n, const(1, "int32")), add(acc, const(1.0))])
    f = Function([n, acc], If(greater(n, const(0, "int32")), step, acc), ret_type=TensorType((), F32))
    return IRModule({gv: f})


def _endless_module():
    x = var("x", shape=(2,))
    gv = GlobalVar("endless")
    return IRModule({gv: Function([x], Call(gv, [neg(x)]), ret_type=TensorType((2,), F32))})


@pytest.mark.parametrize("target", CONCRETE)
def test_recursion_10000_deep_within_the_default_limit(target):
    exe = pb.build(_count_module(), target=target)
    assert float(as_numpy(exe["count"](np.int32(10_000), np.float32(0.0)))) == 10_000


@pytest.mark.parametrize("target", CONCRETE)
def test_recursion_without_base_case_stops(target):
    with pytest.raises(pb.ExecutionError, match=r"@endless: calls nested more than max_call_depth=100000 deep"):
        pb.build(_endless_module(), target=target)["endless"](np.ones(2, F32))


@pytest.mark.parametrize("target", CONCRETE)
def test_max_call_depth_is_configurable(target):
    exe = pb.build(_count_module(), target=target, max_call_depth=50)
    assert float(as_numpy(exe["count"](np.int32(49), np.float32(0.0)))) == 49  # 50 nested calls
    with pytest.raises(pb.ExecutionError, match=r"@count: calls nested more than max_call_depth=50 deep"):
        exe["count"](np.int32(50), np.float32(0.0))
    assert float(as_numpy(exe["count"](np.int32(3), np.float32(0.5)))) == 3.5  # usable after the error


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "many"])
def test_max_call_depth_must_be_a_positive_int(bad):
    with pytest.raises(pb.ExecutionError, match="max_call_depth must be a positive int"):
        pb.build(_count_module(), max_call_depth=bad)


# ---------------------------------------------------------------- profiles

N = 1000


@pytest.mark.parametrize("target", CONCRETE)
def test_profile_frees_a_chain(target):
    x = var("x", shape=(N,))
    e = x
    for _ in range(100):
        e = neg(e)
    xs = np.random.default_rng(0).standard_normal(N).astype(F32)
    prof = pb.build(Function([x], e), target=target).profile(xs)
    assert prof.peak_bytes == 2 * N * 4  # one operand and one result, not 100
    assert [(r.op, r.calls) for r in prof.rows] == [("xp.negative", 100)]
    np.testing.assert_array_equal(as_numpy(prof.outputs), xs)


# ---------------------------------------------------------------- lifetime


@pytest.mark.parametrize("target", TARGETS)
def test_a_dropped_executable_frees_its_program_at_once(target):
    """No reference cycle keeps a built program (and the constants it holds: a model's weights) alive
    until the cyclic GC runs: refcounting frees it as soon as the executable and its entries are dropped."""
    import gc
    import weakref

    mod = _calls_module()  # module functions, a primitive group, Ifs and a constant
    exe = pb.build(mod, target=target)
    for name in ("main", "helper"):  # compiled, entered and cached
        exe[name](*((np.array(True), np.ones(3, F32)) if name == "main" else (np.ones(3, F32),)))
    f = exe["helper"]
    main = mod["main"]
    alive = weakref.ref(exe), weakref.ref(main), weakref.ref(main.body.fields[1])  # a node of the body's root scope
    del main
    del mod
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del exe
        assert alive[0]() is not None, "an entry keeps its executable"
        np.testing.assert_array_equal(as_numpy(f(np.ones(3, F32))), np.zeros(3, F32))
        del f
        assert [r() for r in alive] == [None, None, None]
        plan = pb.build(_calls_module(), target=target)["main"].plan  # not compiled yet; it calls @helper
        with pytest.raises(pb.ExecutionError, match="this plan's executable was freed"):
            plan.ensure()
    finally:
        if was_enabled:
            gc.enable()
