"""scripts/torch_function_census.py: its cases import and match eager, its expected failures fail."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from census_scripts import load  # noqa: E402

census = load("torch_function_census")


def test_expected_failures_name_cases():
    assert set(census.EXPECTED) <= set(census.CASES)
    assert all(set(names) <= set(census.CASES) for names in census.EXPECTED_ON.values())


@pytest.mark.parametrize("name", ["cumprod", "pinv", "qr", "special_log_ndtr", "searchsorted", "median", "bce_logits"])
def test_a_converted_function_matches_eager(name):
    assert census.check(name, "numpy") == "OK"


NEW = ["logcumsumexp", "logcumsumexp_wide", "cummax", "cummin", "addmv", "addbmm", "view_copy", "permute_copy",
       "narrow", "diagonal_scatter", "fill_diagonal", "diagonal_copy_", "as_strided_write", "masked_select",
       "gumbel_softmax", "gumbel_softmax_hard", "uniform_", "samplers_", "median_nan", "nanmedian",
       "nanmedian_indices", "adaptive_max_pool2d", "adaptive_max_pool2d_indices", "adaptive_max_pool1d",
       "adaptive_max_pool3d", "complex", "angle", "ldexp", "polar", "grid_sample_3d", "grid_sample_3d_border",
       "grid_sample_3d_reflection", "grid_sample_3d_nearest", "put", "put_accumulate", "rrelu_eval",
       "index_reduce", "triangular_solve", "unique", "unique_inverse_counts",
       "masked_rows_written"]


@pytest.mark.parametrize("name", NEW)
def test_the_conversions_of_this_stop_match_eager(name):
    assert census.check(name, "numpy") == "OK"


@pytest.mark.parametrize("target", ["jax", "torch"])
@pytest.mark.parametrize("name", ["logcumsumexp_wide", "cummin", "fill_diagonal", "nanmedian",
                                  "adaptive_max_pool2d_indices", "samplers_", "polar", "grid_sample_3d"])
def test_on_the_other_targets(name, target):
    assert census.check(name, target) == "OK"


def test_data_dependent_lengths_run_on_torch_and_jax_says_why_not():
    """masked_select's and unique's lengths depend on the data: the torch target runs them, the jax target
    (jax.jit, static shapes) names the targets that do."""
    for name in ("masked_select", "unique_inverse_counts", "masked_rows_written"):
        assert census.check(name, "torch") == "OK"
        status = census.check(name, "jax")
        assert "the result's shape depends on the data" in status and "numpy or torch target" in status


def test_an_expected_failure_still_fails_with_a_named_operator():
    status = census.check("gammainc", "numpy")
    assert status.startswith("ERROR") and "not supported" in status and "aten.igamma" in status

