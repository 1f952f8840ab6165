"""PartitionForwardBackward keeps meaning on generated programs, for both policies.

On the vjp-mode gradient of a generated program (with and without If; no calls:
the pass rejects them), ``@main_fwd`` then ``@main_bwd`` gives the outputs and
gradients of ``@main_grad``; the partition is valid (well-formed functions, the
residuals are what the backward reads, no op of class ``Recompute.NEVER`` is
computed twice, ``save_all`` computes nothing twice but constants) and min_cut
adds no more residual bytes than save_all, whatever its cost table.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import pullback as pb
from pullback import transform as T
from pullback.analysis import check_well_formed, recomputed_calls, saved_bytes
from pullback.ops import FusionKind, Recompute
from pullback.testing.programs import assert_outputs_close, programs, random_inputs

pytest.importorskip("networkx")  # min_cut's max-flow
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)
PARTITIONS = [dict(policy="save_all"), dict(policy="min_cut"), dict(policy="min_cut", target="torch"),
              dict(policy="min_cut", recompute_ns_per_byte=float("inf")), dict(policy="min_cut", recompute_ns_per_byte=0)]


def _cotangent(value, rng):
    if isinstance(value, tuple):
        return tuple(_cotangent(v, rng) for v in value)
    value = np.asarray(value)
    if value.dtype.kind == "f":
        return rng.standard_normal(value.shape).astype(value.dtype)
    return np.zeros_like(value)


def check_partition(gmod, inputs, ct, want_out, want_grads) -> dict:
    """Run every partition of ``gmod`` and check it; the residual bytes (parameters left out) by partition."""
    sizes = {}
    for opts in PARTITIONS:
        label = ", ".join(f"{k}={v}" for k, v in opts.items())
        pm = T.PartitionForwardBackward(**opts)(gmod)
        T.InferType()(pm)
        check_well_formed(pm)
        fwd, bwd = pm["main_fwd"], pm["main_bwd"]
        assert [p.checked_type for p in bwd.params[:-1]] == list(fwd.ret_type.fields[1].fields), label
        twice = recomputed_calls(pm)
        never = {op for op in twice if pb.ops.get_op(op).recompute is Recompute.NEVER}
        assert not never, f"{label}: recomputes {never}"
        if opts["policy"] == "save_all":  # only copies of parameters' data (slices, concatenations of weights)
            moves = {op for op in twice if pb.ops.get_op(op).pattern != FusionKind.INJECTIVE
                     or pb.ops.get_op(op).recompute > Recompute.CHEAP}
            assert not moves, f"save_all recomputes {dict(twice)}"
        exe = pb.build(pm, check_outputs=True)
        out, residuals = exe["main_fwd"](*inputs)
        assert_outputs_close(out, want_out, f"@main_fwd ({label})")
        assert_outputs_close(exe["main_bwd"](*residuals, ct), want_grads, f"@main_bwd ({label})")
        sizes[label] = saved_bytes(pm, inputs=False)
    return sizes


def _check_program(mod, seed):
    note(pb.astext(mod))
    try:
        gmod = T.standard_cleanup()(T.FirstOrderGradient(mode="vjp")(mod))
    except pb.DiagnosticError:
        return  # nothing differentiable to partition (e.g. no float parameter)
    inputs = random_inputs(mod, seed)
    ct = _cotangent(pb.build(mod)["main"](*inputs), np.random.default_rng(seed))
    want_out, want_grads = pb.build(gmod)["main_grad"](*inputs, ct)
    sizes = check_partition(gmod, inputs, ct, want_out, want_grads)
    assert max(sizes.values()) <= sizes["policy=save_all"], sizes


@SETTINGS
@given(mod=programs(max_nodes=10, dtypes=("float32", "float64"), allow_if=False, allow_calls=False, allow_any=False),
       seed=st.integers(0, 2**16))
def test_forward_then_backward_equals_gradient(mod, seed):
    _check_program(mod, seed)


@SETTINGS
@given(mod=programs(max_nodes=12, dtypes=("float32", "float64"), allow_if=True, allow_calls=False, allow_any=False),
       seed=st.integers(0, 2**16))
def test_forward_then_backward_equals_gradient_with_if(mod, seed):
    _check_program(mod, seed)
