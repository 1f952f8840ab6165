"""Shape, indexing and creation operators: forward vs PyTorch, kernel dtypes, gradient rules, errors."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.analysis import infer_expr
from pullback.ir.errors import AttrError, ExecutionError, PullbackError, TypeInferenceError
from pullback.ops import get_op

from opgrad import Case, case, check_ad, check_rule, check_second, dtype_check, forward, rule_vjp, torch_check

RNG = np.random.default_rng(99)
X = RNG.standard_normal((2, 3, 4))
M = RNG.standard_normal((3, 4))


def torch():
    import torch as t

    return t


def multi(name, *attrs, torch=None, **kw):
    """A case for a variadic op: ``op.<name>([vars...], *attrs)``."""
    def build(*xs):
        return get_op(name)(list(xs), *attrs)

    return lambda *inputs: Case(name, list(inputs), build, torch, **kw)


IDX = np.array([[2, 0], [1, 2]], dtype="int32")
IDX_OOR = np.array([-1, 3, 5, 1], dtype="int64")
GIDX = np.array([[0, 2, 2], [1, 0, 1]], dtype="int64")  # gather along axis 1 of M[:2] (indices shape (2, 3))

CASES = [
    case("reshape", X, args=((6, -1),), torch=lambda x: x.reshape(6, -1)),
    case("reshape", X, args=((0, -1),), torch=lambda x: x.reshape(2, -1)),
    case("reshape", np.array(2.0), args=((1, 1),), torch=lambda x: x.reshape(1, 1)),
    case("reshape_like", M, RNG.standard_normal((2, 6)), wrt=[0], torch=lambda x, y: x.reshape(y.shape)),
    case("transpose", X, args=((1, 0, 2),), torch=lambda x: x.permute(1, 0, 2)),
    case("transpose", M, torch=lambda x: x.permute(1, 0)),
    case("expand_dims", M, args=(1,), torch=lambda x: x.unsqueeze(1)),
    case("expand_dims", M, args=(-1, 2), torch=lambda x: x[..., None, None]),
    case("squeeze", RNG.standard_normal((1, 3, 1)), torch=lambda x: x.squeeze()),
    case("squeeze", RNG.standard_normal((1, 3, 1)), args=((2,),), torch=lambda x: x.squeeze(2)),
    multi("concatenate", 1, torch=lambda a, b: torch().cat([a, b], 1))(M[:2], RNG.standard_normal((2, 2))),
    multi("concatenate", 0, torch=lambda a, b, c: torch().cat([a, b, c], 0))(M, M[:1], M),
    multi("stack", 0, torch=lambda a, b: torch().stack([a, b], 0))(M, M * 2),
    multi("stack", -1, torch=lambda a, b, c: torch().stack([a, b, c], -1))(M[0], M[1], M[2]),
    multi("stack", 0, torch=lambda a: torch().stack([a], 0))(np.array(3.0)),
    case("split", X, args=(2, 2), torch=lambda x: torch().tensor_split(x, 2, 2)),
    case("split", X, args=((1, 2), 1), torch=lambda x: torch().tensor_split(x, [1, 2], 1)),
    case("split", M, args=(1,), torch=lambda x: torch().tensor_split(x, 1, 0)),
    case("strided_slice", X, args=((0, 1), (2, 3), (1, 2)), torch=lambda x: x[0:2, 1:3:2]),
    case("strided_slice", X, args=((-3,), (100,), None, (2,)), torch=lambda x: x[:, :, -3:100]),
    case("strided_slice", X, args=((3, 2), (-100, 0), (-1, -2), (2, 1))),  # negative strides: no torch
    case("strided_set", X, RNG.standard_normal((2, 1, 2)), args=((1, 0), (2, 3), (1, 2), (1, 2))),
    case("take", M, IDX, torch=lambda x, i: torch().take(x, i.long())),
    case("take", M, IDX, attrs=dict(axis=1), torch=lambda x, i: x[:, i]),
    case("take", M, IDX_OOR, attrs=dict(axis=0, mode="clip"), torch=lambda x, i: x[i.clamp(0, 2)]),
    case("take", M, IDX_OOR, attrs=dict(axis=-1, mode="wrap"), torch=lambda x, i: x[:, i % 4]),
    case("index_add", M, np.array([2, 0, 2]), RNG.standard_normal((3, 3)), attrs=dict(axis=1),
         torch=lambda x, i, u: x.index_add(1, i, u)),
    case("index_add", M, IDX, RNG.standard_normal((2, 2))),
    case("gather", M, GIDX, args=(1,), torch=lambda x, i: torch().gather(x, 1, i)),
    case("gather", X, np.array([[[1, 0, 0, 1]]]), attrs=dict(axis=0), torch=lambda x, i: torch().gather(x, 0, i)),
    case("scatter_add", M, GIDX, RNG.standard_normal((2, 3)), attrs=dict(axis=1),
         torch=lambda x, i, u: torch().scatter_add(x, 1, i, u)),
    case("one_hot", np.array([0, 2, -1, 5]), np.array(2.5), np.array(-0.5), args=(3, -1, "float64"),
         torch=lambda i, on, off: torch().where(i[:, None] == torch().arange(3), on, off)),
    case("one_hot", np.array([[0, 2]]), np.array(1.0), np.array(0.0), args=(3, 0, "float64")),
    case("broadcast_to", M[:1], args=((2, 3, 4),), torch=lambda x: x.expand(2, 3, 4)),
    case("broadcast_to_like", np.array(1.0), M, wrt=[0], torch=lambda x, y: x.expand_as(y)),
    case("collapse_sum_to", X, args=((3, 1),), torch=lambda x: x.sum_to_size(3, 1)),
    case("collapse_sum_like", X, M, wrt=[0], torch=lambda x, y: x.sum_to_size(3, 4)),
    case("repeat", M, args=(2, 1), torch=lambda x: x.repeat_interleave(2, 1)),
    case("repeat", X, args=(3, 0), torch=lambda x: x.repeat_interleave(3, 0)),
    case("tile", M, args=((2, 1, 3),), torch=lambda x: x.tile((2, 1, 3))),
    case("tile", X, args=((2,),), torch=lambda x: x.tile((2,))),
    case("tile", np.zeros((2, 3, 0, 1)), args=((1, 1, 1, 1, 2, 1),), torch=lambda x: x.tile((1, 1, 1, 1, 2, 1)),
         id="tile-empty", fd=False),  # an empty input: an empty gradient (reshape's 0 would copy a dim)
    case("flip", X, args=((0, 2),), torch=lambda x: x.flip((0, 2))),
    case("flip", M, torch=lambda x: x.flip(0)),
    case("cast", M, args=("float64",), torch=lambda x: x.to(torch().float64)),
    case("cast_like", M, M[:1], wrt=[0], torch=lambda x, y: x.type_as(y)),
    case("full", np.array(1.5), args=((2, 3), "float64"), torch=lambda f: f.expand(2, 3)),
    case("full_like", M, np.array(-2.0), wrt=[1], torch=lambda x, f: f.expand_as(x)),
    case("zeros_like", M, wrt=[], torch=lambda x: torch().zeros_like(x)),
    case("ones_like", M, wrt=[], torch=lambda x: torch().ones_like(x)),
]

NONDIFF = [
    case("cast", M * 3, args=("int32",), wrt=[], torch=lambda x: x.to(torch().int32)),
    case("zeros", args=((2, 3), "int64"), torch=lambda: torch().zeros(2, 3)),
    case("ones", args=((0, 2),), torch=lambda: torch().ones(0, 2)),
    case("arange", args=(5,), torch=lambda: torch().arange(5)),
    case("arange", attrs=dict(start=1, stop=-2, step=-0.5, dtype="float64"), torch=lambda: torch().arange(1, -2, -0.5)),
    case("take", np.arange(6).reshape(2, 3), np.array([1, 0]), attrs=dict(axis=1), torch=lambda x, i: x[:, i]),
    case("flip", np.array([True, False]), torch=lambda x: x.flip(0)),
]
ALL = CASES + NONDIFF


@pytest.mark.parametrize("c", [c for c in ALL if c.torch is not None], ids=repr)
def test_forward_and_vjp_match_torch(c):
    pytest.importorskip("torch")
    torch_check(c)


@pytest.mark.parametrize("c", CASES, ids=repr)
def test_gradient_rule_matches_finite_differences(c):
    check_rule(c)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("c", ALL, ids=repr)
def test_kernel_returns_inferred_dtype(c, dtype):
    dtype_check(c, dtype)


def test_strided_slice_negative_strides_match_numpy():
    got, e = forward(case("strided_slice", X, args=((3, 2), (-100, 0), (-1, -2), (2, 1))))
    np.testing.assert_array_equal(got, X[:, 2:0:-2, 3::-1])
    assert e.checked_type.shape == (2, 1, 4)


def test_split_gradient_takes_a_tuple_of_cotangents():
    c = case("split", M, args=((1,),))
    (g,) = rule_vjp(c, [np.ones((1, 4)), np.full((2, 4), 2.0)])
    np.testing.assert_array_equal(g, np.array([[1.0] * 4, [2.0] * 4, [2.0] * 4]))


def test_indices_get_no_gradient():
    for c, k in [(case("take", M, IDX), 1), (case("gather", M, GIDX, args=(1,)), 1),
                 (case("one_hot", IDX, np.array(1.0), np.array(0.0), args=(3, -1, "float64")), 0)]:
        _, out = forward(c)
        assert rule_vjp(c, np.ones(out.checked_type.shape))[k] is None


def test_any_dims():
    A = pullback.Any
    x = pullback.var("x", shape=(A, 4))
    y = pullback.var("y", shape=(3, 4))
    cases = [(op.strided_slice(x, (1,), (3,), None, (1,)), (A, 2)), (op.strided_slice(x, (0,), (2,)), (A, 4)),
             (op.concatenate([x, y], 0), (A, 4)), (op.concatenate([x, y], 1), (3, 8)), (op.split(x, 2), None),
             (op.squeeze(pullback.var("z", shape=(1, A)), axis=0), (A,)), (op.take(y, pullback.var("i", shape=(A,), dtype="int32")), (A,)),
             (op.tile(x, (2, 1)), (A, 4)), (op.repeat(x, 2, 1), (A, 8)), (op.stack([x, y], 1), (3, 2, 4))]
    for e, want in cases:
        t = infer_expr(e)
        if want is not None:
            assert t.shape == want, (e.op.name, t)
    assert [f.shape for f in infer_expr(op.split(x, (1, 3), 1)).fields] == [(A, 1), (A, 2), (A, 1)]
    e = op.squeeze(pullback.var("z", shape=(1, A)), axis=0)
    (g,) = e.op.grad(e, pullback.var("g", shape=(A,)))
    infer_expr(e)
    assert infer_expr(g).shape == (1, A)


def test_static_dims_required_by_some_gradients_are_reported():
    x = pullback.var("x", shape=(pullback.Any, 4))
    e = op.concatenate([x, x], 0)
    infer_expr(e)
    with pytest.raises(PullbackError, match="concatenate: the gradient needs static sizes.*all parts but one"):
        e.op.grad(e, pullback.var("g", shape=(pullback.Any, 4)))


@pytest.mark.parametrize("sizes", [(2, None, 0), (None, 0, 2, 0), (0, None), (1, None, 2)])
def test_concatenate_gradient_with_one_part_of_run_time_size(sizes):
    """The other parts' cotangents are slices from either end (empty parts at the end too), the run-time part's
    what lies between: each part gets its rows of the cotangent."""
    A = pullback.Any
    xs = [pullback.var(f"x{i}", shape=(A if d is None else d, 3)) for i, d in enumerate(sizes)]
    e = op.concatenate(xs, 0)
    infer_expr(e)
    g = pullback.var("g", shape=(A, 3))
    fn = pullback.Function([g, *xs], pullback.Tuple(e.op.grad(e, g)))
    n = 4  # the run-time part's rows
    rows = [n if d is None else d for d in sizes]
    cot = RNG.standard_normal((sum(rows), 3)).astype("float32")
    got = pullback.build(pullback.IRModule.from_expr(fn))["main"](cot, *[np.zeros((r, 3), "float32") for r in rows])
    for part, want in zip(got, np.split(cot, np.cumsum(rows)[:-1])):
        np.testing.assert_array_equal(part, want)


def test_out_of_range_indices_raise_execution_errors():
    with pytest.raises(ExecutionError, match="gather"):
        forward(case("gather", M, GIDX + 5, args=(1,)))
    with pytest.raises(ExecutionError, match="take"):
        forward(case("take", M, IDX_OOR * 5, attrs=dict(mode="fast")))


def test_attr_errors_name_op_and_attribute():
    x = pullback.var("x", shape=(2, 3))
    bad = [
        (lambda: op.strided_slice(x, (0,), (1, 2)), "strided_slice.*end"),
        (lambda: op.strided_slice(x, (0,), (1,), (0,)), "strided_slice.*strides"),
        (lambda: op.split(x, 0), "split.*indices_or_sections"),
        (lambda: op.split(x, (2, 1)), "split.*ascending"),
        (lambda: op.repeat(x, -1, 0), "repeat.*repeats"),
        (lambda: op.tile(x, (-2,)), "tile.*reps"),
        (lambda: op.one_hot(x, x, x, 3, -1, "complex"), "one_hot.*dtype"),
        (lambda: op.one_hot(x, x, x, -3), "one_hot.*depth"),
        (lambda: op.take(x, x, mode="nearest"), "take.*mode"),
        (lambda: op.arange(0, 5, 0), "arange.*step"),
        (lambda: op.zeros((2, -1)), "zeros.*shape"),
        (lambda: op.squeeze(x, "a"), "squeeze.*axis"),
    ]
    for make, pattern in bad:
        with pytest.raises(AttrError, match=pattern):
            make()


def test_type_errors_name_op():
    x = pullback.var("x", shape=(2, 3))
    i = pullback.var("i", shape=(2, 3), dtype="int32")
    bad = [
        (op.squeeze(x, 0), "squeeze.*size 2"), (op.concatenate([x, pullback.var("y", shape=(3, 3))], 1), "concatenate"),
        (op.concatenate([x, x], 2), "concatenate.*axis 2"), (op.split(x, 4, 1), "split.*3"),
        (op.split(x, (5,), 0), "split.*beyond"), (op.take(x, x), "take.*integer"), (op.gather(x, 2, i), "gather.*axis 2"),
        (op.strided_slice(x, (0,), (1,), None, (3,)), "strided_slice.*axis 3"), (op.flip(x, 2), "flip.*axis 2"),
        (op.stack([x, pullback.var("y", shape=(3, 2))], 0), "stack"), (op.repeat(x, 2, -3), "repeat.*axis"),
        (op.scatter_add(x, i, pullback.var("u", shape=(2, 2))), "scatter_add.*updates"),
        (op.one_hot(i, pullback.const(1.0), pullback.const(0.0), 3, 5), "one_hot.*axis 5"),
        (op.strided_set(x, pullback.var("v", shape=(2, 2)), (0,), (1,)), "strided_set"),
    ]
    for e, pattern in bad:
        with pytest.raises(TypeInferenceError, match=pattern):
            infer_expr(e)


def test_gather_accepts_relay_and_keyword_argument_orders():
    x = pullback.var("x", shape=(3, 4))
    i = pullback.var("i", shape=(3, 2), dtype="int32")
    a, b = op.gather(x, 1, i), op.gather(x, i, axis=1)
    assert a.attrs == b.attrs and a.args[1] is i and b.args[1] is i


def test_arange_values():
    got, _ = forward(case("arange", attrs=dict(start=2, stop=11, step=3, dtype="int32")))
    np.testing.assert_array_equal(got, [2, 5, 8])


@pytest.mark.parametrize("c", [c for c in CASES if c.fd], ids=repr)
def test_ad_pass_gradient(c):
    check_ad(c)


@pytest.mark.parametrize("c", [c for c in CASES if c.op in ("strided_slice", "strided_set", "take", "index_add", "gather",
                                                            "scatter_add", "split", "concatenate", "tile", "repeat")],
                         ids=repr)
def test_second_order_through_adjoint_pairs(c):
    """Gradient of a product with the op's output: exercises the adjoint op's own rule."""
    sq = Case(c.op, c.inputs, lambda *xs: op.multiply(_first(c.build(*xs)), _first(c.build(*xs))), wrt=c.wrt)
    check_second(sq)


def _first(e):
    return e[0] if e.op.name == "split" else e


@pytest.mark.parametrize("idx", [[3, 0, -4, 2], [1, 0, 1, -3], [4, 0, 2, -1]], ids=["distinct", "repeated", "repeated-once-normalised"])
def test_index_add_on_numpy_adds_each_update_once(idx):
    """``index_add``'s NumPy kernel (a plain ``+=`` where the positions are distinct, negative ones normalised
    first; ``np.add.at`` where they repeat) adds every update at its position, as a loop does."""
    rng = np.random.default_rng(6)
    x, u = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 4, 3))
    want = x.copy()
    for j, p in enumerate(idx):
        want[:, p] += u[:, j]
    got = get_op("index_add").impl("numpy")(x, np.array(idx), u, get_op("index_add").attrs_type(axis=1, mode="fast"))
    np.testing.assert_allclose(got, want, rtol=1e-15)
    assert not np.shares_memory(got, x)


@pytest.mark.parametrize("target", ["numpy", "numpy+aten", "torch", "jax"])
@pytest.mark.parametrize("itype", ["int8", "int16", "uint8", "int32", "int64"])
def test_take_and_index_add_with_narrow_integer_positions(itype, target):
    """Positions of every integer dtype, on every target: ``take`` reads and ``index_add`` adds at them as a
    NumPy loop does, with negative ``fast`` positions counted from the end of an axis longer than int8 holds
    (``-1 + 200`` in int8 overflowed) and a uint8 index read as positions (ATen takes it for a mask, and its
    ``index_add`` takes int32 and int64 only: int8 failed on the torch target)."""
    if target == "jax":
        pytest.importorskip("jax")
    elif target != "numpy":
        pytest.importorskip("torch")
    signed = itype != "uint8"
    n, axis = 200, 1
    pos = np.array([-1, 3, -128, 3] if signed else [199, 3, 72, 3])
    idx = pos.astype(itype)
    rng = np.random.default_rng(3)
    x, u = rng.standard_normal((2, n)).astype("float32"), rng.standard_normal((2, len(idx))).astype("float32")
    want_take, want_add = x[:, pos % n], x.astype("float64")
    for j, p in enumerate(pos % n):
        want_add[:, p] += u[:, j]
    xv, iv, uv = pullback.var("x", shape=x.shape), pullback.var("i", shape=idx.shape, dtype=itype), pullback.var("u", shape=u.shape)
    f = pullback.Function([xv, iv, uv], pullback.Tuple([op.take(xv, iv, axis=axis, mode="fast"),
                                                        op.index_add(xv, iv, uv, axis=axis, mode="fast")]))
    mod = pullback.IRModule.from_expr(f)
    args = (x, idx, u)
    if target == "torch":
        args = tuple(torch().from_numpy(a) for a in args)
    kw = {"aten": True} if target == "numpy+aten" else {"target": target.split("+")[0]}
    got_take, got_add = (np.asarray(v) for v in pullback.build(mod, **kw)["main"](*args))
    np.testing.assert_array_equal(got_take, want_take)
    np.testing.assert_allclose(got_add, want_add, rtol=1e-6, atol=1e-6)
