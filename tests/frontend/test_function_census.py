"""scripts/torch_function_census.py: its cases import and match eager, its expected failures fail."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")

_PATH = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "torch_function_census.py"
_spec = importlib.util.spec_from_file_location("torch_function_census", _PATH)
census = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(census)


def test_expected_failures_name_cases():
    assert set(census.EXPECTED) <= set(census.CASES)


@pytest.mark.parametrize("name", ["cumprod", "pinv", "qr", "special_log_ndtr", "searchsorted", "median", "bce_logits"])
def test_a_converted_function_matches_eager(name):
    assert census.check(name, "numpy") == "OK"


@pytest.mark.parametrize("name", ["put", "logcumsumexp"])
def test_an_expected_failure_still_fails_with_a_named_operator(name):
    status = census.check(name, "numpy")
    assert status.startswith("ERROR") and "not supported" in status
