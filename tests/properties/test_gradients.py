"""FirstOrderGradient matches central finite differences (float64) on generated programs.

Programs are generated with ``smooth=True``: every operator's operand keeps a
margin from kinks and discontinuities, and If/where conditions depend only on
integer or bool inputs, so finite differences are meaningful. Static shapes
only: ``check_grad`` cannot make cotangents for ``Any`` result dims (see
test_regressions.py).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pullback.testing import check_grad
from pullback.testing.programs import programs, random_inputs

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)


@SETTINGS
@given(mod=programs(max_nodes=14, dtypes=("float32", "float64", "int32"), smooth=True, allow_any=False),
       seed=st.integers(0, 2**16))
def test_gradient_matches_finite_differences(mod, seed):
    err = check_grad(mod, random_inputs(mod, seed), seed=seed)
    assert err < 1e-3


@SETTINGS
@given(mod=programs(max_nodes=8, dtypes=("float64",), smooth=True, allow_any=False, allow_calls=False),
       seed=st.integers(0, 2**16))
def test_gradient_of_float64_programs_without_calls(mod, seed):
    check_grad(mod, random_inputs(mod, seed), seed=seed)
