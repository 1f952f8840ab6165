"""Structural equality / hashing: alpha-equivalence, sharing, constants, modules, deep chains."""

import random

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback.ir.structural import first_mismatch
from pullback.ir.traversal import transform
from pullback.ir.types import TensorType, TupleType

T23 = TensorType((2, 3), "float32")


def fresh_copy(e):
    """A copy of ``e`` with new Var/Constant objects and the same sharing."""

    def fn(old, new):
        if isinstance(old, pb.Var):
            return pb.Var(old.name_hint + "_copy", old.type_annotation)
        if isinstance(old, pb.Constant):
            return pb.Constant(old.data)
        return None

    return transform(e, fn, into_functions=True)


def test_alpha_equivalence_of_params():
    x, y = pb.var("x", shape=(2, 3)), pb.var("y", shape=(2, 3))
    f1 = pb.Function([x, y], op.add(x, op.tanh(y)))
    a, b = pb.var("a", shape=(2, 3)), pb.var("b", shape=(2, 3))
    f2 = pb.Function([a, b], op.add(a, op.tanh(b)))
    assert pb.structural_equal(f1, f2)
    assert pb.structural_hash(f1) == pb.structural_hash(f2)
    # swapping the params is not alpha-equivalent
    f3 = pb.Function([b, a], op.add(a, op.tanh(b)))
    assert not pb.structural_equal(f1, f3)


def test_inner_function_params_map_too():
    def build(n):
        x = pb.var("x" + n, shape=(2, 3))
        p = pb.var("p" + n, shape=(2, 3))
        prim = pb.Function([p], op.exp(p), attrs={"Primitive": 1})
        return pb.Function([x], pb.Call(prim, [x]))

    assert pb.structural_equal(build("1"), build("2"))
    assert pb.structural_hash(build("1")) == pb.structural_hash(build("2"))


def test_free_vars_identity_or_mapped():
    x, x2 = pb.var("x", shape=(3,)), pb.var("x", shape=(3,))
    assert pb.structural_equal(op.exp(x), op.exp(x))
    assert not pb.structural_equal(op.exp(x), op.exp(x2))
    assert pb.structural_equal(op.exp(x), op.exp(x2), map_free_vars=True)
    assert pb.structural_hash(op.exp(x)) == pb.structural_hash(op.exp(x2))
    # mapping is a bijection: x+x vs x+y is not equal even when mapping
    y = pb.var("y", shape=(3,))
    assert not pb.structural_equal(op.add(x, x), op.add(x2, y), map_free_vars=True)
    assert not pb.structural_equal(op.add(x2, y), op.add(x, x), map_free_vars=True)


def test_sharing_vs_copies():
    x = pb.var("x", shape=(2, 3))
    two = pb.const(2.0)
    shared = op.multiply(x, two)
    f_shared = pb.Function([x], op.add(shared, shared))
    f_copies = pb.Function([x], op.add(op.multiply(x, two), op.multiply(x, two)))
    assert not pb.structural_equal(f_shared, f_copies)
    assert not pb.structural_equal(f_copies, f_shared)
    assert pb.structural_hash(f_shared) != pb.structural_hash(f_copies)
    assert pb.structural_equal(f_shared, fresh_copy(f_shared))
    assert pb.structural_equal(f_copies, fresh_copy(f_copies))
    m = first_mismatch(f_shared, f_copies)
    assert "sharing" in m.reason and "argument 1 of add" in m.path


def test_shared_constant_vs_two_constants():
    x = pb.var("x", shape=(3,))
    c = pb.const(1.0)
    assert not pb.structural_equal(pb.Function([x], op.add(op.add(x, c), c)),
                                   pb.Function([x], op.add(op.add(x, c), pb.const(1.0))))


def test_calls_ops_attrs_globals():
    x = pb.var("x", shape=(2, 3))
    assert not pb.structural_equal(op.exp(x), op.tanh(x))
    assert pb.structural_equal(op.sum(x, axis=1), op.sum(x, axis=(1,)))
    assert not pb.structural_equal(op.sum(x, axis=1), op.sum(x, axis=0))
    assert not pb.structural_equal(op.sum(x, axis=1), op.sum(x, axis=1, keepdims=True))
    g1, g2, g3 = pb.GlobalVar("f"), pb.GlobalVar("f"), pb.GlobalVar("g")
    assert pb.structural_equal(pb.Call(g1, [x]), pb.Call(g2, [x]))
    assert pb.structural_hash(pb.Call(g1, [x])) == pb.structural_hash(pb.Call(g2, [x]))
    assert not pb.structural_equal(pb.Call(g1, [x]), pb.Call(g3, [x]))
    # globals are outside the bijection: one object on the left, two on the right is fine
    assert pb.structural_equal(pb.Tuple([pb.Call(g1, [x]), pb.Call(g1, [x])]),
                               pb.Tuple([pb.Call(g1, [x]), pb.Call(g2, [x])]))


def test_constants_dtype_shape_bytes_nan():
    assert pb.structural_equal(pb.const(np.array([1.0, np.nan], "float32")), pb.const(np.array([1.0, np.nan], "float32")))
    assert not pb.structural_equal(pb.const(np.float32(1.0)), pb.const(np.float64(1.0)))
    assert not pb.structural_equal(pb.const(np.zeros((2, 1), "float32")), pb.const(np.zeros((1, 2), "float32")))
    assert not pb.structural_equal(pb.const(np.float32(1.0)), pb.const(np.float32(2.0)))
    a, b = pb.const(np.array([np.nan], "float32")), pb.const(np.array([np.nan], "float32"))
    assert pb.structural_hash(a) == pb.structural_hash(b)


def test_annotations_ret_type_and_function_attrs():
    x = pb.var("x", shape=(2, 3))
    y = pb.var("y", shape=(2, 3), dtype="float64")
    assert not pb.structural_equal(pb.Function([x], x), pb.Function([y], y))
    assert not pb.structural_equal(pb.Function([x], x, ret_type=T23), pb.Function([x], x))
    assert not pb.structural_equal(pb.Function([x], x, attrs={"Primitive": 1}), pb.Function([x], x))
    assert pb.structural_equal(pb.Function([x], x, attrs={"Primitive": 1}), pb.Function([x], x, attrs={"Primitive": 1}))


def test_tuples_getitem_if():
    x = pb.var("x", TupleType((T23, T23)))
    c = pb.var("c", shape=(), dtype="bool")
    e1 = pb.If(c, x[0], x[1])
    assert pb.structural_equal(e1, pb.If(c, x[0], x[1]))
    assert not pb.structural_equal(e1, pb.If(c, x[1], x[0]))
    assert not pb.structural_equal(pb.Tuple([x[0]]), pb.Tuple([x[0], x[1]]))


def test_modules_and_types():
    def mod(n):
        x = pb.var("x" + n, shape=(2, 3))
        main = pb.Function([x], pb.Call(pb.GlobalVar("f"), [x]))
        y = pb.var("y" + n, shape=(2, 3))
        return pb.IRModule({"main": main, "f": pb.Function([y], op.tanh(y))})

    assert pb.structural_equal(mod("a"), mod("b"))
    assert pb.structural_hash(mod("a")) == pb.structural_hash(mod("b"))
    other = mod("c").without_function("f")
    assert not pb.structural_equal(mod("a"), other)
    assert pb.structural_equal(T23, TensorType((2, 3)))
    assert not pb.structural_equal(T23, TensorType((3, 2)))
    assert pb.structural_hash(TupleType((T23,))) == pb.structural_hash(TupleType((TensorType((2, 3)),)))
    assert not pb.structural_equal(T23, mod("a"))


def test_assert_structural_equal_message():
    x = pb.var("x", shape=(2, 3))
    f1 = pb.Function([x], op.multiply(op.add(x, op.exp(x)), x))
    y = pb.var("y", shape=(2, 3))
    f2 = pb.Function([y], op.multiply(op.add(y, op.tanh(y)), y))
    pb.assert_structural_equal(f1, fresh_copy(f1))
    with pytest.raises(AssertionError) as info:
        pb.assert_structural_equal(pb.IRModule.from_expr(f1), pb.IRModule.from_expr(f2))
    msg = str(info.value)
    assert "in @main" in msg
    assert "argument 1 of add" in msg and "argument 0 of multiply" in msg
    assert "exp" in msg and "tanh" in msg


def random_program(seed: int, names: str = "") -> pb.Function:
    rng = random.Random(seed)
    params = [pb.var(f"p{i}{names}", shape=(2, 3)) for i in range(rng.randint(1, 3))]
    pool = list(params)
    unary = [op.exp, op.tanh, op.negative]
    binary = [op.add, op.multiply, op.subtract]
    for _ in range(rng.randint(1, 6)):
        r = rng.random()
        if r < 0.35:
            pool.append(rng.choice(unary)(rng.choice(pool)))
        elif r < 0.85:
            pool.append(rng.choice(binary)(rng.choice(pool), rng.choice(pool)))
        else:
            pool.append(op.add(rng.choice(pool), pb.const(rng.choice([0.0, 1.0]))))
    body = pool[-1] if rng.random() < 0.7 else pb.Tuple([pool[-1], rng.choice(pool)])
    return pb.Function(params, body)


def test_random_programs_hash_consistency():
    progs = [random_program(s) for s in range(300)]
    copies = [random_program(s, names="_other") for s in range(300)]
    hashes = [pb.structural_hash(p) for p in progs]
    for p, c, h in zip(progs, copies, hashes):
        assert pb.structural_equal(p, c)
        assert h == pb.structural_hash(c)
        assert pb.structural_equal(p, fresh_copy(p))
    # equal implies equal hashes; unequal programs should (practically) never collide
    collisions = 0
    for i in range(len(progs)):
        for j in range(i + 1, len(progs)):
            eq = pb.structural_equal(progs[i], progs[j])
            if eq:
                assert hashes[i] == hashes[j]
            elif hashes[i] == hashes[j]:
                collisions += 1
    assert collisions == 0


@pytest.mark.slow
def test_million_node_chain():
    n = 1_000_000

    def chain(name, first):
        x = pb.var(name, shape=(2,))
        e = first(x)
        for _ in range(n):
            e = op.negative(e)
        return pb.Function([x], e)

    a, b = chain("x", op.exp), chain("y", op.exp)
    assert pb.structural_equal(a, b)
    assert pb.structural_hash(a) == pb.structural_hash(b)
    del b
    c = chain("z", op.tanh)  # differs only at the bottom of the chain
    assert not pb.structural_equal(a, c)
    assert pb.structural_hash(a) != pb.structural_hash(c)
