"""Run an operator's kernel on every array namespace (numpy, jax.numpy, array-api-compat torch) and compare."""

from __future__ import annotations

import numpy as np

from opgrad import Case, at_precision, vars_for
from pullback.analysis import infer_expr


def _to(target: str, x: np.ndarray):
    if target == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(x))
    if target == "jax":
        import jax.numpy as jnp

        return jnp.asarray(x)
    return x


def _back(v):
    if isinstance(v, (tuple, list)):
        return [_back(x) for x in v]
    return v.numpy() if hasattr(v, "numpy") and not isinstance(v, np.ndarray) else np.asarray(v)


def _x64(target: str):
    """JAX with 64-bit integers for the call (int64 results stay int64), as the jax target builds them."""
    import contextlib

    if target != "jax":
        return contextlib.nullcontext()
    import jax

    return jax.enable_x64(True)


def check_namespaces(c: Case, targets=("jax", "torch")) -> None:
    """The op's ``impl(target)`` on float32 inputs equals its numpy result, in values and dtype."""
    import pytest

    inputs = [at_precision(x, "float32") for x in c.inputs]
    call = c.build(*vars_for(inputs))
    infer_expr(call)
    want = _back(call.op.impl("numpy")(*inputs, call.attrs))
    for target in targets:
        pytest.importorskip("jax" if target == "jax" else "torch")
        with _x64(target):
            got = _back(call.op.impl(target)(*[_to(target, x) for x in inputs], call.attrs))
        for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
            assert g.dtype == w.dtype, (target, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6, err_msg=f"{c.id} on {target}")
