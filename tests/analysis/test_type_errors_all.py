"""Type errors: every independent problem reported, each with its line:column (issue 15).

The parser gives every node it creates a span (``"line:column"``), so a type
error in parsed text can say where it is: TupleGetItem and If included. Type
inference reports *every* independent error in one ``TypeCheckError`` (a
``DiagnosticError``): at least one per function, none for values that only
depend on an ill-typed one, none for calls to a function that does not
type-check. A generated table of modules with errors planted at known places
checks the count and the places.
"""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pullback as pb
from pullback.analysis import infer_module
from pullback.ir.traversal import post_order
from pullback.testing.programs import random_program

MAIN = "def @main(%x: Tensor[(2, 3), float32], %c: bool) {\n"


def _type_error(text: str) -> pb.PullbackError:
    mod = pb.parse(text)
    with pytest.raises(pb.PullbackError) as ei:
        infer_module(mod)
    return ei.value


# ------------------------------------------------------------------ spans (parser side)


def _all_nodes(mod: pb.IRModule) -> list:
    out = []
    for name, fn in mod.items():
        out.append(mod.get_global_var(name))
        for n in post_order(fn, into_functions=True):
            out.append(n)
            if isinstance(n, pb.Call) and isinstance(n.op, pb.GlobalVar):
                out.append(n.op)
    return out


HAND_WRITTEN = """def @main(%x: Tensor[(2, 3), float32], %c: bool) {
  %0 = (%x, const(1.5, float32));
  %1 = %0.1;
  %2 = if (%c) { tanh(%x) } else { add(%x, %1) };
  %3 = fn [Primitive=1] (%p: Tensor[(2, 3), float32]) { negative(%p) };
  %4 = %3(%2);
  %5 = @g(%4);
  (%5, (), meta[0], meta[0])
}

def @g(%y: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {
  %y
}
#[metadata]
meta[0] = float32 (17,) """ + base64.b64encode(bytes(68)).decode() + "\n"


def test_every_parsed_node_has_a_span():
    mod = pb.parse(HAND_WRITTEN)
    kinds = set()
    for n in _all_nodes(mod):
        assert n.span is not None and re.fullmatch(r"\d+:\d+", n.span), (type(n).__name__, n)
        kinds.add(type(n).__name__)
    assert kinds == {"Var", "Constant", "Call", "Tuple", "TupleGetItem", "If", "Function", "GlobalVar"}
    fn = mod["main"]
    tgi = next(n for n in post_order(fn.body) if isinstance(n, pb.TupleGetItem))
    iff = next(n for n in post_order(fn.body) if isinstance(n, pb.If))
    assert (tgi.span, iff.span, fn.params[1].span) == ("3:10", "4:8", "1:40")


def test_every_parsed_node_has_a_span_in_parse_expr():
    e = pb.parse_expr("%0 = (%a: Tensor[(2,), float32], const(1.0));\nif (%b: bool) { %0.0 } else { %a }")
    nodes = post_order(e)
    assert all(n.span is not None for n in nodes)
    assert {type(n).__name__ for n in nodes} >= {"Var", "Constant", "Tuple", "TupleGetItem", "If"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_every_node_of_a_printed_program_has_a_span_after_parsing(seed):
    mod = pb.parse(pb.astext(random_program(seed, max_nodes=12)))
    assert all(n.span is not None for n in _all_nodes(mod))


def _check_spans_point_at_their_text(text: str, mod: pb.IRModule) -> None:
    lines = text.split("\n")
    for n in _all_nodes(mod):
        line, col = map(int, n.span.split(":"))
        at = lines[line - 1][col - 1:]
        if isinstance(n, pb.Call):
            want = n.op.name if isinstance(n.op, pb.ops.OpDef) else "%" if isinstance(n.op, pb.Function) else "@"
        elif isinstance(n, pb.TupleGetItem):
            want = "."
        elif isinstance(n, pb.If):
            want = "if"
        elif isinstance(n, pb.Tuple):
            want = "("
        elif isinstance(n, pb.Var):
            want = "%"
        elif isinstance(n, pb.GlobalVar):
            want = "@"
        elif isinstance(n, pb.Function):
            want = "fn" if at.startswith("fn") else "@"
        else:
            want = "const" if at.startswith("const") else "meta"
        assert at.startswith(want), (type(n).__name__, n.span, lines[line - 1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_spans_point_at_their_text(seed):
    text = pb.astext(random_program(seed, max_nodes=12))
    _check_spans_point_at_their_text(text, pb.parse(text))


def test_spans_after_fast_lines_are_on_the_right_line():
    # attr-less lines are read by a fast path; the line after it (sum, with attributes) was counted twice
    text = MAIN + "  %0 = tanh(%x);\n  %1 = tanh(%0);\n  %2 = sum(%1);\n  %3 = sum(%x, axis=1);\n  (%2, %3)\n}"
    mod = pb.parse(text)
    _check_spans_point_at_their_text(text, mod)
    assert [n.span for n in post_order(mod["main"].body) if isinstance(n, pb.Call)] == ["2:8", "3:8", "4:8", "5:8"]


def test_tuple_index_out_of_range_has_line_and_column():
    e = _type_error(MAIN + "  %0 = (%x, %x);\n  %1 = %0.2;\n  tanh(%1)\n}")
    assert "index 2" in str(e) and str(e).endswith("in @main at 3:10")


def test_if_branch_mismatch_has_line_and_column():
    e = _type_error(MAIN + "  %0 = if (%c) { %x } else { sum(%x) };\n  %0\n}")
    assert "If branches" in str(e) and str(e).endswith("in @main at 2:8")


def test_if_condition_has_line_and_column():
    e = _type_error(MAIN + "  if (%x) { %x } else { %x }\n}")
    assert "condition" in str(e) and str(e).endswith("in @main at 2:3")


# ------------------------------------------------------------------ every independent error


def _problems(text: str) -> list[str]:
    e = _type_error(text)
    problems = getattr(e, "diagnostics", None)
    assert isinstance(problems, list), f"one error only, not a diagnostic listing every problem: {e}"
    return problems


def _located(problems: list[str], where: list[str]) -> None:
    """One problem per place in ``where`` (in any order), each naming its function and line:column."""
    assert len(problems) == len(where), problems
    for w in where:
        assert sum(w in p for p in problems) == 1, (w, problems)


def test_one_error_per_function_each_with_its_location():
    text = (MAIN + "  %0 = (%x, %x);\n  %0.2\n}\n"
            "def @f(%y: Tensor[(2, 3), float32]) {\n  sum(%y, axis=4)\n}\n"
            "def @g(%z: Tensor[(4,), float32], %c: bool) {\n  if (%c) { %z } else { const(1.0) }\n}\n")
    _located(_problems(text), ["@main at 3:5", "@f at 6:3", "@g at 9:3"])


def test_independent_errors_in_one_function():
    text = (MAIN + "  %0 = add(%x, const([1.0, 2.0], float32));\n"
            "  %1 = sum(%x, axis=7);\n  %2 = (%x, %x);\n  %3 = %2.5;\n"
            "  %4 = if (%c) { %x } else { %c };\n  (%0, %1, %3, %4)\n}")
    _located(_problems(text), ["@main at 2:8", "@main at 3:8", "@main at 5:10", "@main at 6:8"])


def test_values_that_depend_on_an_error_are_not_reported_again():
    text = (MAIN + "  %0 = add(%x, const([1.0, 2.0], float32));\n  %1 = tanh(%0);\n  %2 = sum(%1);\n"
            "  %3 = sum(%x, axis=9);\n  (%2, %3)\n}")
    _located(_problems(text), ["@main at 2:8", "@main at 5:8"])


def test_a_call_to_an_ill_typed_function_is_reported_once():
    text = (MAIN + "  @f(%x)\n}\n"
            "def @f(%y: Tensor[(2, 3), float32]) {\n  sum(%y, axis=4)\n}\n")
    _located(_problems(text), ["@f at 5:3"])


# ------------------------------------------------------------------ planted errors, every place reported

# kind -> (lines before, the ill-typed expression, the text its span points at); {k} makes names unique
PLANTS = {
    "axis": ([], "sum(%x, axis=9)", "sum"),
    "broadcast": ([], "add(%x, const([1.0, 2.0], float32))", "add"),
    "dtype": ([], "add(%x, %c)", "add"),
    "reshape": ([], "reshape(%x, newshape=(4, 4))", "reshape"),
    "tuple-index": (["%t{k} = (%x, %x);"], "%t{k}.4", "."),
    "get-of-tensor": ([], "%x.0", "."),
    "if-branches": ([], "if (%c) { %x } else { %c }", "if"),
    "if-cond": ([], "if (%x) { %x } else { %x }", "if"),
    "dense-rank": ([], "nn.dense(%x, %c)", "nn.dense"),
}
GOOD = ["tanh(%x)", "sum(%x, axis=1)", "(%x, %c)", "if (%c) { %x } else { negative(%x) }"]


def _function(name: str, plan: list, callees: list, k0: int) -> tuple[list[str], list[tuple[int, int]]]:
    """Lines of ``def @name``: per entry of ``plan`` (a PLANTS kind or an index into GOOD) a binding
    and a user of it; calls to ``callees``. Returns the lines and the planted errors' (line index, column)."""
    lines = [f"def @{name}(%x: Tensor[(2, 3), float32], %c: bool) {{"]
    planted = []
    results = []
    for i, item in enumerate(plan):
        k = k0 + i
        if isinstance(item, str):
            before, expr, points = PLANTS[item]
            lines += ["  " + b.replace("{k}", str(k)) for b in before]
            expr = expr.replace("{k}", str(k))
            line = f"  %e{k} = {expr};"
            col = line.index(expr) + (expr.index(points) if points == "." else 0) + 1
            planted.append((len(lines), col))
            lines.append(line)
            lines.append(f"  %u{k} = (%e{k}, %x);")  # depends on the error: not reported again
            results.append(f"%u{k}")
        else:
            lines.append(f"  %e{k} = {GOOD[item]};")
            results.append(f"%e{k}")
    for j, callee in enumerate(callees):
        lines.append(f"  %call{k0}_{j} = @{callee}(%x, %c);")
        results.append(f"%call{k0}_{j}")
    lines.append("  (" + ", ".join(results + ["%x"]) + ")")
    lines.append("}")
    return lines, planted


@st.composite
def planted_modules(draw):
    n = draw(st.integers(1, 4))
    kinds = st.one_of(st.sampled_from(sorted(PLANTS)), st.integers(0, len(GOOD) - 1))
    plans = [draw(st.lists(kinds, max_size=4)) for _ in range(n)]
    names = ["main"] + [f"f{i}" for i in range(1, n)]
    lines, where = [], []
    for i, (name, plan) in enumerate(zip(names, plans)):
        callees = [c for c in names[i + 1:] if draw(st.booleans())]  # calls go down: no recursion
        body, planted = _function(name, plan, callees, 100 * i)
        where += [f"@{name} at {len(lines) + li + 1}:{col}" for li, col in planted]
        lines += body
    return "\n".join(lines) + "\n", where


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planted_modules())
def test_every_planted_error_is_reported_once_at_its_place(case):
    text, where = case
    mod = pb.parse(text)
    if not where:
        infer_module(mod)  # no planted error: the module types
        return
    problems = _problems(text)
    _located(problems, where)
    assert all(p.count(" at ") >= 1 for p in problems)


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_each_error_kind_alone_and_twice(kind):
    for plan in ([kind], [kind, 0, kind]):
        lines, planted = _function("main", plan, [], 0)
        text = "\n".join(lines)
        e = _type_error(text)
        assert isinstance(e, pb.TypeCheckError) and isinstance(e, pb.TypeInferenceError)
        _located(e.diagnostics, [f"@main at {li + 1}:{col}" for li, col in planted])
        if len(plan) == 1:
            assert str(e) == e.diagnostics[0]  # one problem: the message is that problem, one line


def test_a_call_to_an_annotated_ill_typed_function_is_still_checked():
    # @f does not type-check, but its signature is declared: the call with a wrong argument is an error of its own
    text = (MAIN + "  @f(%c)\n}\n"
            "def @f(%y: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {\n  sum(%y, axis=4)\n}\n")
    _located(_problems(text), ["@f at 5:3", "@main at 2:3"])


def test_infer_expr_reports_every_problem():
    from pullback.analysis import infer_expr

    x = pb.var("x", shape=(2, 3))
    e = pb.Tuple([pb.op.sum(x, axis=5), pb.op.tanh(pb.op.sum(x, axis=7)), pb.TupleGetItem(pb.Tuple([x]), 2)])
    with pytest.raises(pb.TypeCheckError) as ei:
        infer_expr(e)
    assert len(ei.value.diagnostics) == 3
    assert e._checked_type is None and e.fields[0].args[0]._checked_type is not None  # the well-typed part is typed
