"""Helpers shared by the clean-up pass tests."""

from __future__ import annotations

import numpy as np

import pullback as pb
from pullback.analysis import check_well_formed, infer_module
from pullback.ir.types import TensorType


def mod_of(params, body) -> pb.IRModule:
    return pb.IRModule.from_expr(pb.Function(params, body))


def random_inputs(fn: pb.Function, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for p in fn.params:
        t: TensorType = p.type_annotation
        if t.dtype == "bool":
            out.append(rng.random(t.shape) < 0.5)
        elif t.dtype.startswith("float"):
            out.append(rng.standard_normal(t.shape).astype(t.dtype))
        else:
            out.append(rng.integers(-5, 6, t.shape).astype(t.dtype))
    return out


def _flat(v) -> list:
    if isinstance(v, (tuple, list)):
        out = []
        for x in v:
            out.extend(_flat(x))
        return out
    return [np.asarray(v)]


def assert_same_results(before: pb.IRModule, after: pb.IRModule, func: str = "main", seed: int = 0) -> None:
    """Both modules give the same outputs (bitwise up to float rounding) on random inputs."""
    args = random_inputs(before[func], seed)
    a = _flat(pb.build(before)[func](*args))
    b = _flat(pb.build(after)[func](*args))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def assert_valid(mod: pb.IRModule) -> None:
    infer_module(mod)
    check_well_formed(mod)


def chain(x, n: int, op):
    e = x
    for _ in range(n):
        e = op(e)
    return e
