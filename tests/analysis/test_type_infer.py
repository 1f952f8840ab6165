"""Type inference: results, Any dims, errors that name op, types and function."""

import subprocess
import sys
import time

import pytest

import pullback as pb
from pullback import op
from pullback.analysis import infer_expr, infer_module


def T(*shape, dtype="float32"):
    return pb.TensorType(shape, dtype)


def test_mlp_types():
    x = pb.var("x", shape=(8, 3))
    w = pb.var("w", shape=(4, 3))
    h = op.tanh(op.nn.dense(x, w))
    f = pb.Function([x, w], op.sum(h))
    infer_module(pb.IRModule.from_expr(f))
    assert h.checked_type == T(8, 4)
    assert f.body.checked_type == T()
    assert f.checked_type == pb.FuncType((T(8, 3), T(4, 3)), T())


def test_broadcast_with_any_dims():
    a = pb.var("a", pb.TensorType((pb.Any, 1, 3), "float32"))
    b = pb.var("b", shape=(4, 1))
    assert infer_expr(a + b) == pb.TensorType((pb.Any, 4, 3), "float32")


def test_broadcast_error_names_op_shapes_and_function():
    x = pb.var("x", shape=(2, 3))
    y = pb.var("y", shape=(4,))
    m = pb.IRModule.from_expr(pb.Function([x, y], op.exp(x + y)))
    with pytest.raises(pb.TypeInferenceError) as e:
        infer_module(m)
    msg = str(e.value)
    assert "add" in msg and "(2, 3)" in msg and "(4,)" in msg and "@main" in msg


def test_dtype_mismatch_is_reported():
    x = pb.var("x", shape=(2,))
    y = pb.var("y", shape=(2,), dtype="float64")
    with pytest.raises(pb.TypeInferenceError, match="dtypes differ"):
        infer_expr(x * y)


def test_tuples_and_tuple_get_item():
    x = pb.var("x", shape=(2,))
    t = pb.Tuple([x, pb.Tuple([op.exp(x), pb.const(1, "int32")])])
    assert infer_expr(t[1][1]) == T(dtype="int32")
    with pytest.raises(pb.TypeInferenceError, match="out of range"):
        infer_expr(pb.TupleGetItem(t, 5))
    with pytest.raises(pb.TypeInferenceError, match="non-tuple"):
        infer_expr(x[0])


def test_if_types():
    c = pb.var("c", shape=(), dtype="bool")
    a = pb.var("a", pb.TensorType((2, 3), "float32"))
    b = pb.var("b", pb.TensorType((pb.Any, 3), "float32"))
    assert infer_expr(pb.If(c, a, b)) == pb.TensorType((pb.Any, 3), "float32")
    with pytest.raises(pb.TypeInferenceError, match="bool scalar"):
        infer_expr(pb.If(a, a, a))
    with pytest.raises(pb.TypeInferenceError, match="different types"):
        infer_expr(pb.If(c, a, pb.var("d", shape=(2,))))


def test_global_calls_and_callee_order():
    a = pb.var("a", shape=(3,))
    f = pb.Function([a], op.exp(a))
    x = pb.var("x", shape=(3,))
    mod = pb.IRModule({"main": pb.Function([x], x), "f": f})
    gv = mod.get_global_var("f")
    main = pb.Function([x], pb.Call(gv, [x]) + x)
    mod = mod.with_function("main", main)
    infer_module(mod)
    assert main.body.checked_type == T(3)
    bad = pb.Function([pb.var("y", shape=(4,))], pb.Call(gv, [pb.var("z", shape=(4,))]))
    with pytest.raises(pb.TypeInferenceError, match="argument 0"):
        infer_module(mod.with_function("main", bad))


def test_unknown_global_and_missing_annotation():
    x = pb.var("x", shape=(3,))
    with pytest.raises(pb.TypeInferenceError, match="unknown global function @g"):
        infer_module(pb.IRModule.from_expr(pb.Function([x], pb.Call(pb.GlobalVar("g"), [x]))))
    v = pb.Var("v")
    with pytest.raises(pb.TypeInferenceError, match="%v has no type annotation"):
        infer_expr(op.exp(v))


def test_declared_return_type_checked():
    x = pb.var("x", shape=(3,))
    with pytest.raises(pb.TypeInferenceError, match="declared return type"):
        infer_expr(pb.Function([x], x, ret_type=T(4)))


def test_like_family_types():
    x = pb.var("x", shape=(2, 3, 4))
    like = pb.var("l", shape=(6, 2, 2))
    assert infer_expr(op.reshape_like(x, like)) == T(6, 2, 2)
    assert infer_expr(op.reshape_like(x, like, lhs_begin=2, rhs_begin=1)) == T(2, 3, 2, 2)
    s = pb.var("s", shape=(3,))
    assert infer_expr(op.collapse_sum_like(x, pb.var("k", shape=(4,)))) == T(4)
    assert infer_expr(op.broadcast_to_like(s, pb.var("b", shape=(3, 3, 3)))) == T(3, 3, 3)
    i = pb.var("i", shape=(3, 4, 5), dtype="int32")
    assert infer_expr(op.full_like(i, pb.const(1.0))) == T(3, 4, 5, dtype="int32")
    assert infer_expr(op.cast_like(x, i)) == T(2, 3, 4, dtype="int32")
    with pytest.raises(pb.TypeInferenceError, match="cannot collapse"):
        infer_expr(op.collapse_sum_like(s, x))


def test_reshape_special_values():
    x = pb.var("x", shape=(2, 3, 4))
    assert infer_expr(op.reshape(x, (0, -1))) == T(2, 12)
    assert infer_expr(op.reshape(x, (-1,))) == T(24)
    with pytest.raises(pb.TypeInferenceError, match="cannot reshape"):
        infer_expr(op.reshape(x, (5, -1)))
    y = pb.var("y", pb.TensorType((pb.Any, 3), "float32"))
    assert infer_expr(op.reshape(y, (-1, 3))) == pb.TensorType((pb.Any, 3), "float32")


def test_infer_100k_nodes_is_fast_enough():
    """Reported figure (no assert on time): 100,000 nodes through inference."""
    x = pb.var("x", shape=(4,))
    e = x
    for _ in range(50_000):
        e = op.tanh(e) + x
    t0 = time.perf_counter()
    infer_expr(e)
    print(f"\nInferType on 100,000 nodes: {time.perf_counter() - t0:.2f} s")
    assert e.checked_type == T(4)


@pytest.mark.slow
def test_million_node_chain_infers():
    x = pb.var("x", shape=(2,))
    e = x
    for _ in range(1_000_000):
        e = op.negative(e)
    assert infer_expr(e) == T(2)


def test_import_pullback_needs_numpy_only():
    code = "import sys, pullback; bad = [m for m in ('torch', 'jax', 'networkx', 'graphviz', 'numba') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
