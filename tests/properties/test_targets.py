"""The numpy and jax targets agree on generated programs (and their gradients)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pullback as pb
from pullback.runtime import TARGETS
from pullback.testing.programs import assert_outputs_close, programs, random_inputs

pytest.importorskip("jax")
pytestmark = pytest.mark.skipif("jax" not in TARGETS, reason="the jax target is not registered")

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)


@SETTINGS
@given(mod=programs(max_nodes=10, dtypes=("float32", "float64", "int32"), allow_any=False, smooth=True),
       seed=st.integers(0, 2**16))
def test_numpy_and_jax_agree(mod, seed):
    import jax

    jax.config.update("jax_enable_x64", True)
    inputs = random_inputs(mod, seed)
    mod = pb.transform.FirstOrderGradient()(mod)
    for fn in ("main", "main_grad"):
        want = pb.build(mod)[fn](*inputs)
        got = pb.build(mod, target="jax")[fn](*inputs)
        assert_outputs_close(got, want, f"jax @{fn}", rtol=1e-4, atol=1e-5)
