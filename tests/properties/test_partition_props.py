"""PartitionForwardBackward keeps meaning on generated programs, for both policies.

On the vjp-mode gradient of a generated program (no If and no calls: the pass
rejects them), ``@main_fwd`` then ``@main_bwd`` gives the outputs and gradients
of ``@main_grad``, and min_cut saves no more bytes than save_all.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import pullback as pb
from pullback import transform as T
from pullback.analysis import check_well_formed, saved_bytes
from pullback.testing.programs import assert_outputs_close, programs, random_inputs

pytest.importorskip("networkx")  # min_cut's max-flow
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], deadline=None)


def _cotangent(value, rng):
    if isinstance(value, tuple):
        return tuple(_cotangent(v, rng) for v in value)
    value = np.asarray(value)
    if value.dtype.kind == "f":
        return rng.standard_normal(value.shape).astype(value.dtype)
    return np.zeros_like(value)


@SETTINGS
@given(mod=programs(max_nodes=10, dtypes=("float32", "float64"), allow_if=False, allow_calls=False, allow_any=False),
       seed=st.integers(0, 2**16))
def test_forward_then_backward_equals_gradient(mod, seed):
    note(pb.astext(mod))
    try:
        gmod = T.standard_cleanup()(T.FirstOrderGradient(mode="vjp")(mod))
    except pb.DiagnosticError:
        return  # nothing differentiable to partition (e.g. no float parameter)
    inputs = random_inputs(mod, seed)
    ct = _cotangent(pb.build(mod)["main"](*inputs), np.random.default_rng(seed))
    want_out, want_grads = pb.build(gmod)["main_grad"](*inputs, ct)
    sizes = {}
    for policy in ("save_all", "min_cut"):
        pm = T.PartitionForwardBackward(policy=policy)(gmod)
        T.InferType()(pm)
        check_well_formed(pm)
        exe = pb.build(pm, check_outputs=True)
        out, residuals = exe["main_fwd"](*inputs)
        assert_outputs_close(out, want_out, f"@main_fwd ({policy})")
        assert_outputs_close(exe["main_bwd"](*residuals, ct), want_grads, f"@main_bwd ({policy})")
        sizes[policy] = saved_bytes(pm)
    assert sizes["min_cut"] <= sizes["save_all"]
