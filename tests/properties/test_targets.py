"""The numpy, jax and torch targets agree on generated programs (and their gradients)."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pullback as pb
from pullback.runtime import TARGETS
from pullback.runtime.values import to_output
from pullback.testing.programs import assert_outputs_close, programs, random_inputs, random_program

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
PROGRAM = dict(max_nodes=10, dtypes=("float32", "float64", "int32"), allow_any=False, smooth=True)
HAVE_TORCH = importlib.util.find_spec("torch") is not None and "torch" in TARGETS


def missing_torch_kernels(mod: pb.IRModule) -> list[str]:
    """Operators of ``mod`` without a torch kernel yet (empty once every operator has one)."""
    from pullback.runtime.torch_target import TorchTarget

    return TorchTarget().missing_kernels(mod)


def _as_numpy(value):
    return to_output(value, lambda t: t.detach().cpu().numpy() if type(t).__module__.startswith("torch") else t)


def assert_targets_agree(mod: pb.IRModule, seed: int, targets: tuple) -> None:
    inputs = random_inputs(mod, seed)
    mod = pb.transform.FirstOrderGradient()(mod)
    exes = {t: pb.build(mod, target=t) for t in ("numpy",) + targets}
    for fn in ("main", "main_grad"):
        want = exes["numpy"][fn](*inputs)
        for t in targets:
            assert_outputs_close(_as_numpy(exes[t][fn](*inputs)), want, f"{t} @{fn}", rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None or "jax" not in TARGETS, reason="no jax target")
@SETTINGS
@given(mod=programs(**PROGRAM), seed=st.integers(0, 2**16))
def test_numpy_jax_and_torch_agree(mod, seed):
    """jax on every program; torch too where every operator (of the gradient too) has a torch kernel."""
    grad_ops = pb.transform.FirstOrderGradient()(mod)
    torch_ok = HAVE_TORCH and not missing_torch_kernels(grad_ops)
    assert_targets_agree(mod, seed, ("jax", "torch") if torch_ok else ("jax",))


def _torch_programs(count: int = 40) -> list:
    params = []
    for seed in range(count):
        mod = random_program(seed, **PROGRAM)
        missing = missing_torch_kernels(pb.transform.FirstOrderGradient()(mod)) if HAVE_TORCH else []
        marks = [pytest.mark.xfail(strict=True, raises=pb.ExecutionError,
                                   reason=f"no torch kernel yet for {', '.join(missing)}")] if missing else []
        params.append(pytest.param(seed, marks=marks, id=f"seed{seed}"))
    return params


@pytest.mark.skipif(not HAVE_TORCH, reason="no torch target")
@pytest.mark.parametrize("seed", _torch_programs())
def test_numpy_and_torch_agree(seed):
    """Fixed programs, each an expected failure while one of its operators lacks a torch kernel."""
    assert_targets_agree(random_program(seed, **PROGRAM), seed, ("torch",))

