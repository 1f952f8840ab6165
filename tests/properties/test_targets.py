"""The numpy, jax and torch targets agree on generated programs (and their gradients), on ordinary
inputs and on edge values (constants, zeros, ties, NaN: ``random_inputs(edges=...)``), where
agreeing means the same values or the same ExecutionError on every target."""

from __future__ import annotations

import importlib.util
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pullback as pb
from pullback.runtime import TARGETS
from pullback.runtime.values import to_output
from pullback.testing.programs import EDGES, assert_outputs_close, programs, random_inputs, random_program

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


def _outcome(exe, fn: str, inputs: list):
    """("ok", numpy values) or ("error", what failed: the operator and the kind of failure)."""
    try:
        return "ok", _as_numpy(exe[fn](*inputs))
    except pb.ExecutionError as e:
        m = re.match(r"@[\w.]+: ([\w.]+): .*?(integer division by zero|out of range)", str(e))
        assert m, f"not a run-time check failure: {e}"
        return "error", m.groups()


def assert_targets_agree_on_edges(mod: pb.IRModule, seed: int, targets: tuple) -> None:
    inputs = random_inputs(mod, seed, edges=EDGES)
    mod = pb.transform.FirstOrderGradient()(mod)
    exes = {t: pb.build(mod, target=t) for t in ("numpy",) + targets}
    for fn in ("main", "main_grad"):
        kind, want = _outcome(exes["numpy"], fn, inputs)
        for t in targets:
            got_kind, got = _outcome(exes[t], fn, inputs)
            assert got_kind == kind, f"{t} @{fn}: {got_kind} {got}, numpy: {kind} {want}"
            if kind == "error":
                assert got == want, f"{t} @{fn}: {got}, numpy: {want}"
            else:
                assert_outputs_close(got, want, f"{t} @{fn} (edge inputs)", rtol=1e-4, atol=1e-5)


def _targets_for(mod: pb.IRModule) -> tuple:
    grad_ops = pb.transform.FirstOrderGradient()(mod)
    return ("jax", "torch") if HAVE_TORCH and not missing_torch_kernels(grad_ops) else ("jax",)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None or "jax" not in TARGETS, reason="no jax target")
@SETTINGS
@given(mod=programs(**PROGRAM), seed=st.integers(0, 2**16))
def test_numpy_jax_and_torch_agree_on_edge_values(mod, seed):
    """Generated programs on constants, zeros, ties and NaN: the same values (NaN where NaN), or the
    same ExecutionError (integer division by zero) on every target."""
    assert_targets_agree_on_edges(mod, seed, _targets_for(mod))


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



# ------------------------------------------------------------------ the edge-value operators, drawn directly

EDGE_OPS = {  # name -> (builder(x, y), float inputs?, differentiable?)
    "max": (lambda x, y, ax, kd: pb.op.max(x, axis=ax, keepdims=kd), True, True),
    "min": (lambda x, y, ax, kd: pb.op.min(x, axis=ax, keepdims=kd), True, True),
    "std": (lambda x, y, ax, kd: pb.op.std(x, axis=ax, keepdims=kd), True, True),
    "variance": (lambda x, y, ax, kd: pb.op.variance(x, axis=ax, keepdims=kd, unbiased=True), True, True),
    "maximum": (lambda x, y, ax, kd: pb.op.maximum(x, y), True, True),
    "minimum": (lambda x, y, ax, kd: pb.op.minimum(x, y), True, True),
    "divide": (lambda x, y, ax, kd: pb.op.divide(x, y), False, False),
    "floor_divide": (lambda x, y, ax, kd: pb.op.floor_divide(x, y), False, False),
    "mod": (lambda x, y, ax, kd: pb.op.mod(x, y), False, False),
    "remainder": (lambda x, y, ax, kd: pb.op.remainder(x, y), False, False),
}


@st.composite
def edge_programs(draw):
    name = draw(st.sampled_from(sorted(EDGE_OPS)))
    build, floats, diff = EDGE_OPS[name]
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from(("float32", "float64"))) if floats else draw(st.sampled_from(("int32", "int8", "int64")))
    axis = draw(st.one_of(st.none(), st.integers(0, len(shape) - 1)))
    keepdims = draw(st.booleans())
    x, y = pb.var("x", shape=shape, dtype=dtype), pb.var("y", shape=shape, dtype=dtype)
    body = pb.op.tanh(build(x, y, axis, keepdims)) if floats else build(x, y, axis, keepdims)
    mod = pb.IRModule.from_expr(pb.Function([x, y], body))
    edges = draw(st.lists(st.sampled_from(EDGES), min_size=1, unique=True))
    return mod, diff, edges, draw(st.integers(0, 2**16))


@pytest.mark.skipif(importlib.util.find_spec("jax") is None or "jax" not in TARGETS, reason="no jax target")
@SETTINGS
@given(case=edge_programs())
def test_edge_operators_agree_on_edge_values(case):
    mod, diff, edges, seed = case
    inputs = random_inputs(mod, seed, edges=edges)
    if diff:
        mod = pb.transform.FirstOrderGradient()(mod)
    targets = ("jax", "torch") if HAVE_TORCH else ("jax",)
    exes = {t: pb.build(mod, target=t) for t in ("numpy",) + targets}
    for fn in ("main", "main_grad") if diff else ("main",):
        kind, want = _outcome(exes["numpy"], fn, inputs)
        for t in targets:
            got_kind, got = _outcome(exes[t], fn, inputs)
            assert got_kind == kind, f"{t} @{fn}: {got_kind} {got}, numpy: {kind} {want}"
            if kind == "error":
                assert got == want
            else:
                assert_outputs_close(got, want, f"{t} @{fn}", rtol=1e-4, atol=1e-5)
