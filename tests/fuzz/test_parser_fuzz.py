"""Fuzzed parser: any text either parses or raises ``pullback.ParseError``.

Inputs are printed generated programs mutated at token/byte level, random
bytes, and constructs nested up to 100,000 deep (the mutators live in
``scripts/fuzz.py``, which ``make fuzz`` runs for a set time). Never another
exception, never a RecursionError. CI runs the hypothesis ``ci`` profile
(bounded examples); ``--hypothesis-profile long`` or ``scripts/fuzz.py`` run long.
"""

from __future__ import annotations

import importlib.util
import pathlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pullback as pb

_SPEC = importlib.util.spec_from_file_location("pullback_fuzz_script", pathlib.Path(__file__).parents[2] / "scripts" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fuzz)

pytestmark = pytest.mark.fuzz
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
CORPUS = fuzz.seeds(random.Random(0), 20)


def parses_or_parse_error(text: str) -> None:
    try:
        pb.parse(text)
    except pb.ParseError as e:
        assert e.line >= 1 and e.column >= 1, f"ParseError without a position: {e}"


@SETTINGS
@given(rnd=st.randoms(use_true_random=False))
def test_mutated_programs(rnd):
    parses_or_parse_error(fuzz.mutate(rnd, rnd.choice(CORPUS)))


@SETTINGS
@given(rnd=st.randoms(use_true_random=False))
def test_huge_numbers(rnd):
    parses_or_parse_error(fuzz.huge_numbers(rnd, rnd.choice(CORPUS)))


@SETTINGS
@given(rnd=st.randoms(use_true_random=False))
def test_unused_bindings(rnd):
    text = fuzz.unused_binding(rnd, rnd.choice(CORPUS))
    parses_or_parse_error(text if rnd.random() < 0.5 else fuzz.mutate(rnd, text))


@SETTINGS
@given(text=st.text(max_size=300))
def test_arbitrary_text(text):
    parses_or_parse_error(text)


@SETTINGS
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(data):
    parses_or_parse_error(data.decode("latin-1"))


@pytest.mark.parametrize("left,mid,right", fuzz.NEST)
@pytest.mark.parametrize("balanced", [True, False])
def test_deep_nesting(left, mid, right, balanced):
    n = 100_000
    body = left * n + mid + right * (n if balanced else n - 1)
    parses_or_parse_error(f"def @main(%x: Tensor[(2,), float32], %c: bool) {{ {body} }}")


def test_deeply_nested_tuple_type():
    n = 100_000
    ty = "(" * n + "Tensor[(2,), float32]" + ",)" * n
    parses_or_parse_error(f"def @main(%x: {ty}) {{ %x }}")


def test_unbalanced_opening_reports_position():
    with pytest.raises(pb.ParseError) as info:
        pb.parse("def @main(%x: Tensor[(2,), float32]) { " + "(" * 100_000 + " }")
    assert info.value.line == 1 and info.value.column > 100_000
