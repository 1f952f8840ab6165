"""Hostile numbers and unused bindings: every input is a program or a ParseError with line:column.

Integers are bounded where they appear (dims, tuple and metadata indices: int64 and
non-negative; literals: the 64-bit range), however many digits they have (Python
refuses to convert more than 4300); a type's element count and a metadata array's
size are bounded too; a finite float literal never overflows silently. A binding
nothing uses is not part of the program, so the parser type-checks it: an ill-typed
one is a ParseError at the binding.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pullback as pb
from pullback.analysis import program_stats
from pullback.testing.programs import random_program
from pullback.text.parser import INT64_MAX

MAIN = "def @main(%x: Tensor[(2, 3), float32]) {\n"
BIG = "9" * 5000  # over Python's 4300-digit conversion limit


def _meta(line: str) -> str:
    return MAIN + "  meta[0]\n}\n#[metadata]\n" + line + "\n"


@pytest.mark.parametrize(
    "text,line,col,words",
    [
        (f"def @main(%x: Tensor[({BIG},), float32]) {{ %x }}", 1, 23, ["dimension", "5000 characters", "out of range"]),
        ("def @main(%x: Tensor[(100000000000000000000000,), float32]) { %x }", 1, 23, ["dimension", "out of range"]),
        (f"def @main(%x: Tensor[({2**63},), float32]) {{ %x }}", 1, 23, ["dimension", str(2**63)]),
        (f"def @main(%x: Tensor[({2**62}, {2**62}), float32]) {{ %x }}", 1, 15, ["elements", "more than"]),
        (MAIN + f"  add(%x, const({BIG}, int64))\n}}", 2, 17, ["integer literal", "out of range"]),
        (MAIN + f"  add(%x, const(-{BIG}, int64))\n}}", 2, 17, ["integer literal", "out of range"]),
        (MAIN + f"  add(%x, const({2**70}, int64))\n}}", 2, 17, ["integer literal", str(2**70)]),
        (MAIN + f"  add(%x, const({BIG}.5, float32))\n}}", 2, 17, ["overflows float64"]),
        (MAIN + "  add(%x, const(1e999, float32))\n}", 2, 17, ["1e999", "overflows float64"]),
        (MAIN + "  add(%x, const(1e10, float16))\n}", 2, 11, ["overflows float16", "65504"]),
        (MAIN + "  add(%x, const([1.0, -1e39], float32))\n}", 2, 11, ["-1e+39", "overflows float32"]),
        (MAIN + f"  sum(%x, axis={BIG})\n}}", 2, 16, ["integer literal", "out of range"]),
        (MAIN + f"  meta[{BIG}]\n}}", 2, 8, ["metadata index", "out of range"]),
        (MAIN + f"  %0 = (%x, %x);\n  %0.{BIG}\n}}", 3, 6, ["tuple index", "out of range"]),
        (MAIN + f"  %0 = (%x, %x);\n  %0.{2**63}\n}}", 3, 6, ["tuple index", "out of range"]),
        (_meta(f"meta[{BIG}] = float32 (1,) AAAAAA=="), 5, 1, ["metadata index", "out of range"]),
        (_meta(f"meta[0] = float32 ({BIG},) AAAAAA=="), 5, 1, ["dimension", "out of range"]),
        (_meta("meta[0] = float32 (0, 100000000000000000000000) "), 5, 1, ["dimension", "out of range"]),
        (_meta("meta[0] = float32 (" + ", ".join(["1"] * 100) + ") AAAAAA=="), 5, 1, ["100 dimensions", "at most 64"]),
        (_meta(f"meta[0] = float32 (0, {2**62}, {2**62}) "), 5, 1, ["too large"]),
        (_meta(f"meta[0] = float64 ({2**61}, 0) "), 5, 1, ["too large"]),
    ],
)
def test_hostile_numbers(text, line, col, words):
    with pytest.raises(pb.ParseError) as ei:
        pb.parse(text)
    err = ei.value
    assert (err.line, err.column) == (line, col), err
    assert all(w in err.message for w in words), err.message
    assert len(str(err)) < 400  # a 5000-digit number is not echoed back


@pytest.mark.parametrize(
    "text",
    [
        f"def @main(%x: Tensor[({INT64_MAX},), float32]) {{ %x }}",
        "def @main(%x: Tensor[(0, 0), float32]) { %x }",
        MAIN + f"  (%x, const({INT64_MAX}, int64))\n}}",
        MAIN + f"  (%x, const({-(2**63)}, int64))\n}}",
        MAIN + "  (%x, const(inf, float16))\n}",
        MAIN + "  (%x, const(-inf, float32))\n}",
        MAIN + "  (%x, const(65504.0, float16))\n}",
        MAIN + "  (%x, const(" + "0" * 5000 + "1, int64))\n}",
        _meta("meta[0] = int8 (0, 4611686018427387904) "),
        _meta("meta[0] = float32 (0, 1152921504606846975) "),
        _meta("meta[0] = int8 (" + ", ".join(["1"] * 64) + ") AA=="),
    ],
)
def test_limits_themselves_parse(text):
    m = pb.parse(text)
    program_stats(m)


# ------------------------------------------------------------------ the class, by property

_INTS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(0, 6000).map(lambda n: "9" * n or "0"),
    st.integers(0, 6000).map(lambda n: "1" + "0" * n),
)
_SLOTS = [
    "def @main(%x: Tensor[(@N@, 3), float32]) { %x }",
    "def @main(%x: Tensor[(2, @N@, @N@), float32]) { %x }",
    MAIN + "  add(%x, const(@N@, int64))\n}",
    MAIN + "  add(%x, const([@N@, 1], uint8))\n}",
    MAIN + "  add(%x, const(@N@.5, float32))\n}",
    MAIN + "  add(%x, const(@N@e@N@, float16))\n}",
    MAIN + "  sum(%x, axis=@N@)\n}",
    MAIN + "  reshape(%x, newshape=(@N@, -1))\n}",
    MAIN + "  %0 = (%x, %x);\n  %0.@N@\n}",
    MAIN + "  meta[@N@]\n}\n#[metadata]\nmeta[0] = float32 (1,) AAAAAA==\n",
    MAIN + "  meta[0]\n}\n#[metadata]\nmeta[@N@] = float32 (1,) AAAAAA==\n",
    MAIN + "  meta[0]\n}\n#[metadata]\nmeta[0] = float32 (0, @N@, @N@) \n",
    MAIN + "  meta[0]\n}\n#[metadata]\nmeta[0] = int8 (@N@) AA==\n",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slot=st.sampled_from(_SLOTS), n=_INTS)
def test_any_integer_anywhere_parses_or_parse_error(slot, n):
    text = slot.replace("@N@", n)
    try:
        m = pb.parse(text)
    except pb.ParseError as e:
        assert e.line >= 1 and e.column >= 1
        return
    for fn in m.items():
        for p in fn[1].params:
            assert all(0 <= d <= INT64_MAX for d in p.type_annotation.shape)
    try:  # what parses is something the rest of pullback handles with its own errors
        pb.transform.InferType()(m)
        program_stats(m)
    except pb.PullbackError:
        pass


# ------------------------------------------------------------------ unused bindings

_BINDING = re.compile(r"^( *)(%\w+) = [^\n]*;$", re.M)


@pytest.mark.parametrize(
    "body,line,col,words",
    [
        ("  %0 = add(%x, const([1.0, 2.0], float32));\n  %x", 2, 3, ["%0 is never used", "add", "broadcast", "at 2:8"]),
        ("  %0 = tanh(%x);\n  %1 = (%0, %0);\n  %2 = %1.3;\n  %0", 4, 3, ["%2", "index 3", "out of range", "at 4:10"]),
        ("  %0 = if (const(True)) { tanh(%x) } else { const(1.0) };\n  %x", 2, 3, ["%0", "If branches", "at 2:8"]),
        ("  %0 = add(%x, const([1.0, 2.0], float32));\n  %1 = tanh(%0);\n  %x", 3, 3, ["%1 is never used", "at 2:8"]),
        ("  %0 = add(%x, const([1.0, 2.0], float32));\n  %1 = %0;\n  %x", 2, 3, ["%0 is never used"]),
        ("  %0 = nn.dense(%x, %x);\n  %1 = sum(%x, axis=7);\n  %x", 3, 3, ["%1", "axis 7"]),
        ("  %0 = if (const(True)) {\n    %1 = sum(%x, axis=7);\n    %x\n  } else { %x };\n  %0", 3, 5, ["%1", "axis 7"]),
        ("  %f = fn (%y: Tensor[(3,), float32]) { negative(%y) };\n  %0 = %f(%x);\n  %x", 3, 3, ["%0", "argument 0"]),
    ],
)
def test_ill_typed_unused_binding_is_an_error(body, line, col, words):
    with pytest.raises(pb.ParseError) as ei:
        pb.parse(MAIN + body + "\n}")
    err = ei.value
    assert (err.line, err.column) == (line, col), err
    assert all(w in err.message for w in words), err.message


@pytest.mark.parametrize("n", [2, 3, 7])
def test_every_ill_typed_unused_binding_is_listed(n):
    # n independent ill-typed unused bindings, well-typed ones between them: the first at its place, all named
    lines = []
    for i in range(n):
        lines += [f"  %g{i} = tanh(%x);", f"  %b{i} = sum(%x, axis={5 + i});"]
    with pytest.raises(pb.ParseError) as ei:
        pb.parse(MAIN + "\n".join(lines) + "\n  %x\n}")
    err = ei.value
    assert (err.line, err.column) == (3, 3) and "%b0 is never used" in err.message and "axis 5" in err.message
    verb = "bindings that do not" if n > 2 else "binding that does not"
    others = ", ".join(f"%b{i} at {3 + 2 * i}:3" for i in range(1, n))
    assert err.message.endswith(f"(and {n - 1} more unused {verb} type-check: {others})"), err.message


def test_ill_typed_unused_binding_calling_a_global():
    text = MAIN + "  %0 = @g(%x);\n  %x\n}\ndef @g(%y: Tensor[(3,), float32]) {\n  %y\n}"
    with pytest.raises(pb.ParseError, match=r"2:3: %0 is never used .*@g: argument 0"):
        pb.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        # nothing to check against: untyped parameters, untyped free variables, an untyped callee
        "def @main(%x) {\n  %0 = add(%x, const([1.0, 2.0], float32));\n  %x\n}",
        MAIN + "  %0 = @g(%x);\n  %x\n}\ndef @g(%y) {\n  %y\n}",
        # well-typed unused bindings are fine (and dropped)
        MAIN + "  %0 = tanh(%x);\n  %1 = (%0, %x);\n  %x\n}",
    ],
)
def test_unused_bindings_that_cannot_or_need_not_fail(text):
    pb.parse(text)


def test_unused_binding_in_parse_expr():
    assert isinstance(pb.parse_expr("%0 = add(%a, %b); %a"), pb.Var)  # untyped free variables
    with pytest.raises(pb.ParseError, match="1:1: %0 is never used"):
        pb.parse_expr("%0 = add(%a: Tensor[(2,), float32], %b: Tensor[(3,), float32]); %a")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), data=st.data())
def test_unused_binding_inserted_anywhere(seed, data):
    """In a printed generated program, after any binding: an ill-typed unused binding is a
    ParseError at its line and column; a well-typed one leaves the program unchanged."""
    mod = random_program(seed, max_nodes=8)
    text = pb.astext(mod)
    sites = list(_BINDING.finditer(text))
    if not sites:
        return
    m = data.draw(st.sampled_from(sites))
    indent, name = m.group(1), m.group(2)
    line = text.count("\n", 0, m.end()) + 2
    bad = f"\n{indent}%dead = nn.dense({name}, const(1.0, float32));"
    with pytest.raises(pb.ParseError) as ei:
        pb.parse(text[: m.end()] + bad + text[m.end():])
    assert (ei.value.line, ei.value.column) == (line, len(indent) + 1), ei.value
    assert "%dead is never used" in ei.value.message and "nn.dense" in ei.value.message
    good = f"\n{indent}%dead = ({name}, {name});"
    pb.assert_structural_equal(pb.parse(text[: m.end()] + good + text[m.end():]), mod)


def test_many_unused_bindings_stay_linear():
    body = "".join(f"  %{i} = tanh(%x);\n" for i in range(20000))
    pb.parse(MAIN + body + "  %x\n}")
    with pytest.raises(pb.ParseError, match="20002:3: %bad is never used"):
        pb.parse(MAIN + body + "  %bad = add(%x, const([1.0, 2.0], float32));\n  %x\n}")
