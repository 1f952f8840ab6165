"""Data parallelism through XLA: a training-step gradient on 4 (host) devices equals the 1-device one.

Runs in a subprocess because XLA_FLAGS must be set before jax is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax")

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import jax
    import pullback as pb
    from pullback import transform
    from pullback.testing import models

    assert len(jax.devices()) == 4, jax.devices()
    mod, make_inputs = models.mlp(batch=8, sizes=(6, 8, 5))
    grad = transform.Sequential([transform.FirstOrderGradient(), transform.ConcretizeLike(),
                                 transform.standard_cleanup(), transform.FuseOps()])(mod)
    inputs = make_inputs(0)
    one = pb.build(grad, target="jax")["main_grad"](*inputs)
    exe = pb.build(grad, target="jax", devices=4, batch_axis={"x": 0})
    four = exe["main_grad"](*inputs)
    assert len(exe.devices) == 4
    # the compiled program really is partitioned over the 4 devices
    text = exe["main_grad"]._jitted.lower(*inputs).as_text()
    assert "num_partitions = 4" in text, text[:2000]
    assert '{"batch"}' in text or "devices=[4" in text, text[:2000]  # x is split along "batch"
    ref = pb.build(grad)["main_grad"](*inputs)
    for a, b, c in zip(pb.runtime.values.leaves(one), pb.runtime.values.leaves(four), pb.runtime.values.leaves(ref)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, c, rtol=1e-5, atol=1e-6)
    # a list of devices works too; a batch that does not split evenly is an error
    exe2 = pb.build(grad, target="jax", devices=jax.devices()[:2], batch_axis={"x": 0})
    two = exe2["main_grad"](*inputs)
    for a, b in zip(pb.runtime.values.leaves(one), pb.runtime.values.leaves(two)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    try:
        pb.build(grad, target="jax", devices=3, batch_axis={"x": 0})["main_grad"](*inputs)
    except pb.ExecutionError as e:
        assert "not divisible" in str(e), e
    else:
        raise AssertionError("a batch of 8 on 3 devices should be refused")
    try:
        pb.build(grad, target="jax", devices=4, batch_axis={"nope": 0})["main_grad"]
    except pb.ExecutionError as e:
        assert "%nope" in str(e), e
    else:
        raise AssertionError("an unknown batch_axis name should be refused")
    print("OK")
    """
)


def test_four_devices_equal_one():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("OK")
