"""Malformed text: every input either parses or raises ParseError at the right place."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pullback as pb
from pullback import op

MAIN = "def @main(%x: Tensor[(2, 3), float32]) {\n"


@pytest.mark.parametrize(
    "text,line,col,message",
    [
        ("add(%x, %y", 1, 11, "expected ',' or ')' but found end of input"),
        ("add(%x; %y)", 1, 7, "expected ',' or ')' but found ';'"),
        ("nn.foo(%x)", 1, 1, "unknown operator 'nn.foo'"),
        ("%0 = tanh(%x);\n  nn.foo(%0)", 2, 3, "unknown operator 'nn.foo'"),
        ("tanh(%x, %y)", 1, 1, "operator tanh expects 1 argument, got 2"),
        ("nn.attention(%x, %y)", 1, 1, "operator nn.attention expects 3 or 4 arguments, got 2"),
        ("%0 = tanh(%x);\n%1 = reshape(%0);\n%1", 2, 6, "reshape"),
        ("reshape(%x, newshape=(1, -1, -1))", 1, 1, "at most one -1"),
        ("sum(%x, axes=1)", 1, 1, "has no attribute 'axes'"),
        ("sum(%x, axis=1, axis=2)", 1, 17, "given twice"),
        ("sum(axis=1, %x)", 1, 13, "arguments go before attributes"),
        ("%0 = tanh(%x)\n%0", 2, 1, "expected ';' but found '%0'"),
        ("%0 = tanh(%x);\n%0 = tanh(%0);\n%0", 2, 1, "%0 is already defined"),
        ("tanh %x", 1, 6, "expected '(' after operator 'tanh'"),
        ("foo", 1, 1, "expected an expression but found 'foo'"),
        ("", 1, 1, "expected an expression but found end of input"),
        ("tanh(%x) tanh(%x)", 1, 10, "expected end of input"),
        ("tanh(%x) #", 1, 10, "unexpected character '#'"),
        ("%x.a", 1, 4, "expected a tuple index"),
        ("meta[3]", 1, 1, "meta[3] is not in the #[metadata] section"),
        ("%x: Tensor[(2, -3), float32]", 1, 16, "expected a dimension"),
        ("%x: Tensor[(2, 3), float31]", 1, 20, "expected a dtype"),
        ("%x: Tensor[(2, 3)]", 1, 18, "expected ','"),
        ("%x: Tonsor", 1, 5, "expected a type"),
        ("%x: float32; %x", 1, 12, "expected end of input"),
        ("add(%x: float32, %x: float32)", 1, 18, "already defined"),
        ("if (%c) { %x }", 1, 15, "expected 'else' but found end of input"),
        ("if %c { %x } else { %y }", 1, 4, "expected '(' but found '%c'"),
        ("if (%c) { } else { %y }", 1, 11, "expected an expression but found '}'"),
        ("fn (%a, %a) { %a }", 1, 9, "duplicate parameter %a"),
        ("fn (%a) { %a }(%x, axis=1)", 1, 1, "only operator calls take attributes"),
        ("%x(%y)", 1, 1, "cannot call a Var"),
        ("fn [Primitive=1, Primitive=2] (%a) { %a }", 1, 18, "given twice"),
        ('const(1.5, int32)', 1, 1, "float value in an int32 constant"),
        ("const(1, float99)", 1, 10, "expected a dtype"),
        ("sum(%x, axis=(1, 2)", 1, 20, "expected ',' or ')' but found end of input"),
        ('cast(%x, dtype="float32)', 1, 16, "unexpected character"),
    ],
)
def test_expr_errors(text, line, col, message):
    with pytest.raises(pb.ParseError) as ei:
        pb.parse_expr(text)
    err = ei.value
    assert message in err.message
    assert (err.line, err.column) == (line, col), err


@pytest.mark.parametrize(
    "text,line,col,message",
    [
        (MAIN + "  tanh(%y)\n}", 2, 8, "undefined variable %y"),
        (MAIN + "  @g(%x)\n}", 2, 3, "undefined global @g"),
        (MAIN + "  tanh(%x)\n}\n" + MAIN + "  %x\n}", 4, 5, "@main is defined twice"),
        (MAIN + "  tanh(%x)\n", 3, 1, "expected '}' but found end of input"),
        (MAIN + "  tanh(%x)\n}\nfoo", 4, 1, "expected 'def' but found 'foo'"),
        ("def main() { %x }", 1, 5, "expected a function name '@name'"),
        (MAIN + "  %z: float32\n}", 2, 3, "undefined variable %z"),
        (MAIN + "  %x: float32\n}", 2, 3, "only the first use of a free variable"),
        ("def @f(%x) -> { %x }", 1, 15, "expected a type but found '{'"),
        (MAIN + "  meta[0]\n}\n#[metadata]\nmeta[0] = float32 (2,) AAAA\n", 5, 1, "do not fit"),
        (MAIN + "  meta[0]\n}\n#[metadata]\nmeta[0] = float32 (1,) A$==\n", 5, 1, "expected 'meta[i]"),
        (MAIN + "  meta[0]\n}\n#[metadata]\nmeta[0] = float32 (1,) AAA\n", 5, 1, "bad base64"),
        (MAIN + "  meta[0]\n}\n#[metadata]\nmeta[0] = float99 (1,) AAAAAA==\n", 5, 1, "unknown dtype"),
    ],
)
def test_module_errors(text, line, col, message):
    with pytest.raises(pb.ParseError) as ei:
        pb.parse(text)
    err = ei.value
    assert message in err.message
    assert (err.line, err.column) == (line, col), err


def test_error_names_source():
    with pytest.raises(pb.ParseError, match=r"^model\.pb:1:1: "):
        pb.parse("oops", source_name="model.pb")


def _sample_text() -> str:
    x, c = pb.var("x", shape=(2, 3)), pb.var("c", shape=(), dtype="bool")
    a = op.tanh(x)
    p = pb.var("p", shape=(2, 3))
    prim = pb.Function([p], op.negative(p), attrs={"Primitive": 1})
    body = pb.Tuple([pb.If(c, op.add(a, pb.const(1.5)), op.reshape(a, (-1,))), op.sum(a, axis=(0,)), pb.Call(prim, [a])])
    return pb.astext(pb.IRModule.from_expr(pb.Function([x, c], pb.TupleGetItem(body, 1))))


SAMPLE = _sample_text()
ALPHABET = list("%@(){}[],;=:.?->\"#/\n 0123456789") + ["fn", "if", "else", "def", "meta", "const", "Tensor", "tanh", "%x", "1.5"]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_mutations_parse_or_parse_error(data):
    text = SAMPLE
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 8)))
        text = text[:i] + data.draw(st.sampled_from(ALPHABET + [""])) + text[j:]
    for fn in (pb.parse, pb.parse_expr):
        try:
            fn(text)
        except pb.ParseError as e:
            assert e.line >= 1 and e.column >= 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=40))
def test_fuzz_random_tokens(tokens):
    text = " ".join(tokens)
    for fn in (pb.parse, pb.parse_expr):
        try:
            fn(text)
        except pb.ParseError:
            pass


def test_sample_parses():
    assert pb.astext(pb.parse(SAMPLE)) == SAMPLE
