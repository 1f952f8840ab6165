"""Round-trip holes (issue 15): byte order of constants, list-valued and NaN-valued attributes,
and ``const(...)`` literals checked exactly like ``ir.expr.const``.

``parse(astext(m))`` must be structurally equal to ``m`` (and hash the same) for every value a
user can put in: these tables cover every dtype's non-native byte order, every container kind an
attribute can hold, NaN in every attribute position, and generated literals of every dtype.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pullback as pb
from pullback import op
from pullback.ir.expr import FrozenAttrs
from pullback.ir.types import DTYPES, numpy_dtype

X = pb.var("x", shape=(2,))


def _round_trip(mod: pb.IRModule) -> pb.IRModule:
    back = pb.parse(pb.astext(mod))
    pb.assert_structural_equal(back, mod)
    assert pb.structural_hash(back) == pb.structural_hash(mod)
    return back


# ------------------------------------------------------------------ constants in native byte order

NON_NATIVE = [d for d in DTYPES if numpy_dtype(d).itemsize > 1]


@pytest.mark.parametrize("dtype", NON_NATIVE)
@pytest.mark.parametrize("shape", [(), (3,), (2, 70)])  # scalar, inline literal, metadata
def test_constant_of_non_native_byte_order(dtype, shape):
    data = (np.arange(math.prod(shape)).reshape(shape) % 7).astype(dtype)
    swapped = data.astype(np.dtype(dtype).newbyteorder(">" if np.little_endian else "<"))
    c = pb.Constant(swapped)
    assert c.data.dtype == np.dtype(dtype) and c.data.dtype.isnative and not c.data.flags.writeable
    np.testing.assert_array_equal(c.data, data)
    assert c.checked_type == pb.TensorType(shape, dtype)
    mod = pb.IRModule.from_expr(pb.Function([X], pb.Tuple([X, c])))
    back = _round_trip(mod)
    np.testing.assert_array_equal(pb.build(back)["main"](np.zeros(2, "float32"))[1], data)
    pb.assert_structural_equal(mod, pb.IRModule.from_expr(pb.Function([X], pb.Tuple([X, pb.Constant(data)]))))


# ------------------------------------------------------------------ function attributes

NAN = float("nan")
ATTRS = {
    "list": ([1, 2, 3], (1, 2, 3)),
    "nested-list": ([1, [2, [3.5, "a"]]], (1, (2, (3.5, "a")))),
    "tuple-of-lists": (([1], [2]), ((1,), (2,))),
    "nan": (NAN, None),
    "nan-in-tuple": ((1.0, NAN), None),
    "nan-in-list": ([NAN, [NAN]], (NAN, (NAN,))),
    "inf": (-math.inf, None),
    "string": ("a b\"c", None),
    "bool": (True, None),
    "empty-list": ([], ()),
}


@pytest.mark.parametrize("kind", sorted(ATTRS))
def test_function_attribute_round_trips(kind):
    value, frozen = ATTRS[kind]
    f = pb.Function([X], op.tanh(X), attrs={"k": value, "Other": 1})
    if frozen is not None:
        assert pb.structural_equal(pb.Function([X], op.tanh(X), attrs={"k": frozen, "Other": 1}), f)
        assert FrozenAttrs({"k": value}) == FrozenAttrs({"k": frozen})
        assert hash(FrozenAttrs({"k": value})) == hash(FrozenAttrs({"k": frozen}))
    hash(f.attrs)  # lists are frozen: always hashable
    _round_trip(pb.IRModule.from_expr(f))
    p = pb.var("p", shape=(2,))
    inner = pb.Function([p], op.negative(p), attrs={"Primitive": 1, "k": value})  # a group's attributes too
    _round_trip(pb.IRModule.from_expr(pb.Function([X], pb.Call(inner, [X]))))


def test_frozen_attrs_freeze_containers_and_do_not_alias_the_input():
    src = {"a": [1, [2]], "d": {"x": [1]}, "s": {3, 4}, "arr": np.arange(3)}
    f = FrozenAttrs(src)
    assert f["a"] == (1, (2,)) and f["d"] == {"x": (1,)} and f["s"] == frozenset({3, 4})
    assert not f["arr"].flags.writeable
    src["a"][1].append(5)
    src["arr"][0] = 9
    assert f["a"] == (1, (2,)) and f["arr"][0] == 0  # later changes to the input do not leak in
    hash(f)
    with pytest.raises(pb.PullbackError, match="attribute names are strings"):
        FrozenAttrs({1: 2})


@pytest.mark.parametrize("value", [NAN, (NAN, 1.0), ((NAN,),), np.float64("nan")])
def test_nan_attributes_equal_themselves_and_hash_alike(value):
    a = pb.Function([X], op.tanh(X), attrs={"k": value})
    b = pb.Function([X], op.tanh(X), attrs={"k": float("nan") if not isinstance(value, tuple) else value})
    assert pb.structural_equal(a, b) and pb.structural_hash(a) == pb.structural_hash(b)
    c = pb.Function([X], op.tanh(X), attrs={"k": 1.0})
    assert not pb.structural_equal(a, c)


def test_nan_in_operator_attributes_round_trips():
    mod = pb.IRModule.from_expr(pb.Function([X], op.clip(X, NAN, NAN)))
    _round_trip(mod)


# ------------------------------------------------------------------ const(...) literals: const's exactness

LITERALS = [
    ("2", "bool"), ("0.5", "bool"), ("-1", "bool"), ("1", "bool"), ("True", "bool"), ("[0, 1, 2]", "bool"),
    ("300", "int8"), ("-129", "int8"), ("127", "int8"), ("-1", "uint8"), ("256", "uint8"), ("255", "uint8"),
    ("70000", "int16"), ("2147483648", "int32"), ("-2147483648", "int32"), ("9223372036854775807", "int64"),
    ("[1, 300]", "int8"), ("[[1], [2, 3]]", "int32"), ("1e10", "float16"), ("65504.0", "float16"),
    ("-1e39", "float32"), ("nan", "float16"), ("inf", "float32"), ("1.5", "int32"), ("True", "int32"),
]


@pytest.mark.parametrize("literal,dtype", LITERALS)
def test_const_literal_agrees_with_const(literal, dtype):
    """The parser accepts exactly what ``pb.const`` accepts, with the same value; a value the dtype
    cannot hold is a ParseError at the literal's line:column."""
    text = f"def @main(%x: Tensor[(2,), float32]) {{\n  (%x, const({literal}, {dtype}))\n}}"
    value = eval(literal, {"nan": NAN, "inf": math.inf})  # noqa: S307 - test table literals
    try:
        want = pb.const(value, dtype).data
    except pb.PullbackError:
        want = None
    if want is None or _stricter_in_text(value, dtype):
        with pytest.raises(pb.ParseError) as ei:
            pb.parse(text)
        assert (ei.value.line, ei.value.column) == (2, 8), ei.value
        return
    got = pb.parse(text)["main"].body.fields[1].data
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def _stricter_in_text(value, dtype: str) -> bool:
    """What the text rejects although ``const`` converts it: True/False in a number constant, a
    float literal in an integer constant (write the integer)."""
    return (isinstance(value, bool) and dtype != "bool") or (isinstance(value, float) and dtype[0] in "iu")


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(DTYPES),
       value=st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans()))
@example(dtype="float32", value=-(2**63)).via("the int64 bounds of an integer literal")
@example(dtype="float32", value=2**63).via("the int64 bounds of an integer literal")
def test_generated_literals_agree_with_const(dtype, value):
    text = f"def @main(%x: Tensor[(2,), float32]) {{\n  (%x, const({value!r}, {dtype}))\n}}"
    try:
        want = pb.const(value, dtype).data
    except pb.PullbackError:
        want = None
    try:
        got = pb.parse(text)["main"].body.fields[1].data
    except pb.ParseError as e:
        assert (e.line, e.column) in ((2, 8), (2, 14)), e  # the constant, or its literal (int64 bound)
        got = None
    if want is None or _stricter_in_text(value, dtype) or (type(value) is int and not -(2**63) <= value < 2**63):
        assert got is None, (value, dtype, got)
        return
    if isinstance(value, float) and value != value:  # the text of a NaN has no sign
        assert got.dtype == want.dtype and np.isnan(got)
        return
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (value, dtype)
