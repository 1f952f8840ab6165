"""scripts/torch_module_census.py: every torch.nn layer of its table trains like eager (output, input and
parameter gradients, float64, training mode), and its expected failures still fail."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from census_scripts import load  # noqa: E402

census = load("torch_module_census")


def test_expected_failures_name_cases():
    assert set(census.EXPECTED) <= set(census.CASES)


@pytest.mark.parametrize("name", [n for n in census.CASES if n not in census.EXPECTED])
def test_every_layer_trains_like_eager(name):
    assert census.check(name, "numpy") == "OK"


@pytest.mark.parametrize("target", ["jax", "torch"])
@pytest.mark.parametrize("name", ["GaussianNLLLoss_clamped_full", "GRUCell", "MultiheadAttention",
                                  "Upsample_bicubic", "LPPool2d", "PixelUnshuffle", "Dropout3d"])
def test_on_the_other_targets(name, target):
    assert census.check(name, target) == "OK"


@pytest.mark.parametrize("name", list(census.EXPECTED))
def test_an_expected_failure_still_fails(name):
    assert census.check(name, "numpy").startswith("ERROR")
