"""Python scalars are weak (as in JAX, NumPy 2, PyTorch): they take the dtype of the tensor they meet.

A float meeting an integer tensor is a TypeInferenceError (pullback does not
promote implicitly); an explicit ``pb.const(1.0)`` stays float32 as in Relay;
a value the dtype cannot represent is an error, never inf or a wrapped integer.
"""

import numpy as np
import pytest

import pullback as pb
from pullback import op

FLOATS = ("float16", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")


def scalar_dtypes(e: pb.Expr) -> list[str]:
    return [a.data.dtype.name for a in e.args if isinstance(a, pb.Constant)]


def run(e: pb.Expr, *inputs):
    return pb.build(pb.IRModule.from_expr(e))["main"](*inputs)  # parameters: free variables, first use first


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_python_ints_take_the_tensor_dtype(dtype):
    x = pb.var("x", shape=(3,), dtype=dtype)
    for e in (x + 1, 1 + x, x - 1, 2 * x, x * 2, op.maximum(x, 0), op.minimum(0, x)):
        assert scalar_dtypes(e) == [dtype]
        assert e.checked_type == x.type_annotation
    out = run(2 * x + 1, np.arange(3, dtype=dtype))
    assert out.dtype == dtype and out.tolist() == [1, 3, 5]


@pytest.mark.parametrize("dtype", FLOATS)
def test_python_floats_take_the_float_tensor_dtype(dtype):
    x = pb.var("x", shape=(3,), dtype=dtype)
    c = pb.var("c", shape=(3,), dtype="bool")
    for e in (x + 1.0, 1.0 + x, x - 0.5, 2.0 * x, x / 2.0, 1.0 / x, op.maximum(x, 0.0), op.where(c, x, 0.0),
              op.where(c, 1.0, x), op.power(x, 2.0), x + True):
        assert scalar_dtypes(e) == [dtype], e
        assert e.checked_type == x.type_annotation
    out = run(op.where(c, x * 0.5, 0.0), np.array([True, False, True]), np.array([2, 4, 6], dtype=dtype))
    assert out.dtype == dtype and out.tolist() == [1, 0, 3]


@pytest.mark.parametrize("dtype", INTS)
def test_a_python_float_meeting_an_integer_tensor_is_an_error(dtype):
    x = pb.var("x", shape=(3,), dtype=dtype)
    with pytest.raises(pb.TypeInferenceError, match=rf"Python float 1.5 meets a tensor of dtype {dtype}.*cast"):
        x + 1.5
    with pytest.raises(pb.TypeInferenceError, match="does not promote"):
        op.maximum(x, 0.0)


def test_bool_tensors_take_python_bools():
    b = pb.var("b", shape=(2,), dtype="bool")
    e = op.logical_and(b, True)
    assert scalar_dtypes(e) == ["bool"] and e.checked_type == b.type_annotation
    assert run(op.logical_or(False, b), np.array([True, False])).tolist() == [True, False]
    # a number meeting a bool tensor keeps Relay's default; pullback does not promote bool either
    with pytest.raises(pb.TypeInferenceError, match="dtypes differ"):
        _ = (b + 1).checked_type


def test_the_condition_of_where_does_not_give_its_dtype():
    c = pb.var("c", shape=(2,), dtype="bool")
    i = pb.var("i", shape=(2,), dtype="int16")
    assert scalar_dtypes(op.where(c, i, 0)) == ["int16"]
    assert scalar_dtypes(op.where(c, 1, 0)) == ["int32", "int32"]  # nothing but the condition: Relay's default


def test_the_dtype_is_resolved_from_the_lazily_inferred_type():
    x = pb.var("x", shape=(2, 3), dtype="float16")
    h = op.tanh(op.nn.relu(x))  # an untyped call: its dtype is only known by inference
    assert not h.has_type
    e = h * 0.5 + 1.0
    assert scalar_dtypes(e) == ["float16"] and e.checked_type == pb.TensorType((2, 3), "float16")
    s = op.sum(op.cast(x, "float64")) * 3
    assert scalar_dtypes(s) == ["float64"]


def test_unknown_type_falls_back_to_relay_defaults():
    a, x = pb.var("a", shape=(3,), dtype="float64"), pb.var("x", shape=(3,), dtype="float64")
    mod = pb.IRModule({"f": pb.Function([a], a), "main": pb.Function([x], x)})
    call = pb.Call(mod.get_global_var("f"), [x])  # typed only with its module
    assert scalar_dtypes(call + 1.0) == ["float32"]


def test_explicit_constants_and_numpy_scalars_are_strong():
    x = pb.var("x", shape=(2,), dtype="float16")
    for e in (x + pb.const(1.0), x + np.float32(1.0)):
        assert scalar_dtypes(e) == ["float32"]
        with pytest.raises(pb.TypeInferenceError, match="dtypes differ"):
            _ = e.checked_type
    assert pb.const(1.0).data.dtype == np.float32 and pb.const(1).data.dtype == np.int32


@pytest.mark.parametrize("dtype,value", [("float16", 1e10), ("float16", 70000), ("float32", 1e39), ("int8", 128),
                                         ("int8", -129), ("uint8", -1), ("uint8", 256), ("int16", 40000),
                                         ("int32", 2**31), ("int64", 2**63)])
def test_weak_scalars_out_of_range_are_errors(dtype, value):
    x = pb.var("x", shape=(2,), dtype=dtype)
    with pytest.raises(pb.PullbackError, match=f"not representable in {dtype}"):
        x + value


@pytest.mark.parametrize("value,dtype", [(1e10, "float16"), (65520.0, "float16"), (1e39, "float32"), (300, "int8"),
                                         (-1, "uint8"), (1.5, "int32"), (float("nan"), "int32"), (float("inf"), "int64"),
                                         (2, "bool"), (2**70, "int64"), (np.array([1.0, 1e10]), "float16"),
                                         (np.array([0, 300]), "uint8")])
def test_const_rejects_values_the_dtype_cannot_represent(value, dtype):
    with pytest.raises(pb.PullbackError, match=f"not representable in {dtype}"):
        pb.const(value, dtype)


def test_const_defaults_check_too():
    with pytest.raises(pb.PullbackError, match="not representable in float32"):
        pb.const(1e39)
    with pytest.raises(pb.PullbackError, match="not representable in int32"):
        pb.const(2**31)
    assert pb.const(2**31, "int64").data == 2**31


@pytest.mark.parametrize("value,dtype", [(65504.0, "float16"), (float("inf"), "float16"), (float("-inf"), "float32"),
                                         (float("nan"), "float64"), (127, "int8"), (255, "uint8"), (2.0, "int32"),
                                         (1, "bool"), (-2**63, "int64"), (3, "float16")])
def test_const_keeps_representable_values(value, dtype):
    c = pb.const(value, dtype)
    assert c.data.dtype == dtype
    np.testing.assert_equal(c.data, np.asarray(value).astype(dtype))
