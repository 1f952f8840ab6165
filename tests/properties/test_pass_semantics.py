"""Every pass keeps meaning on generated programs.

For each pass that exists in ``pullback.transform`` (table below, built from
the names present; the table must not be empty): on a generated program and on
its gradient module (``FirstOrderGradient`` output, where AD leaves ``*_like``
operators, zeros and tuples for the clean-up passes), the result passes
InferType and ``check_well_formed``, and every function runs on the executor
with results equal to the original's.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import pullback as pb
from pullback import transform as T
from pullback.analysis import check_well_formed
from pullback.testing.programs import assert_outputs_close, programs, random_inputs

# pass name -> factory(entry functions): the functions that are run stay entry points
CANDIDATES = {
    "InferType": lambda entry: T.InferType(),
    "ConcretizeLike": lambda entry: T.ConcretizeLike(),
    "EliminateIdentity": lambda entry: T.EliminateIdentity(),
    "SimplifyExpr": lambda entry: T.SimplifyExpr(),
    "DeadCodeElimination": lambda entry: T.DeadCodeElimination(entry=entry),
    "EliminateCommonSubexpr": lambda entry: T.EliminateCommonSubexpr(),
    "FoldConstant": lambda entry: T.FoldConstant(),
    "RemoveUnusedParameters": lambda entry: T.RemoveUnusedParameters(entry=entry),
    "standard_cleanup": lambda entry: T.standard_cleanup(entry=entry),
    "FuseOps": lambda entry: T.FuseOps(),
}
PASSES = {name: f for name, f in CANDIDATES.items() if hasattr(T, name)}
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)


def test_pass_table_is_not_empty():
    assert PASSES, "no pass of the table exists in pullback.transform"
    assert hasattr(T, "FirstOrderGradient")


def gradient_module(mod):
    """``mod`` with ``@main_grad``, or None where AD rejects the program for a documented
    limitation (gradient rules needing static sizes)."""
    try:
        return T.FirstOrderGradient()(mod)
    except pb.PullbackError as e:
        if "needs static" in str(e):
            return None
        raise


def check_pass_preserves(name: str, mod, seed: int) -> None:
    inputs = random_inputs(mod, seed)
    gmod = gradient_module(mod)
    for m, fn in ((mod, "main"), (gmod, "main_grad")):
        if m is None:
            continue
        want = pb.build(m, check_outputs=True)[fn](*inputs)  # kernels agree with the inferred types
        before = pb.structural_hash(m)
        out = PASSES[name](tuple(m))(m)
        assert pb.structural_hash(m) == before, f"{name} modified its input module"
        T.InferType()(out)
        check_well_formed(out)
        assert_outputs_close(pb.build(out, check_outputs=True)[fn](*inputs), want, f"@{fn} after {name}")


@pytest.mark.parametrize("name", sorted(PASSES))
@SETTINGS
@given(mod=programs(max_nodes=10, dtypes=("float32", "float64", "int32")), seed=st.integers(0, 2**16))
def test_pass_preserves_results(name, mod, seed):
    note(pb.astext(mod))
    check_pass_preserves(name, mod, seed)
