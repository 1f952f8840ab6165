"""Plans of deeply nested Ifs (issue 15): linear in the nesting depth, right on every path.

A value is followed branch by branch for ``plan.PRECISE_DEPTH`` levels below its home scope;
a use deeper than that keeps it alive until the branch at that level ends. These tests check
that the plan (instructions and the frees they carry) grows linearly with the depth, that
every path computes the right value whatever the cap (random programs with the cap at 0 and 1,
hand-built chains deeper than the cap) and that values are still freed.
"""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Call, Function, If, op, var
from pullback.runtime import plan as plan_mod
from pullback.runtime.plan import CALL1, CALL2, CALLN, END, FN, GET, IF, TUPLE
from pullback.testing.programs import random_inputs, random_program

N = 1000  # floats per value in the memory tests
NB = 4 * N


def _chain(depth: int, n: int = 3):
    """``depth`` nested Ifs on one condition; level k reads a value ``v_k`` made at the root (so it is
    followed down k scopes) and the else branch of every level reads ``x`` only."""
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(n,))
    vs = [op.multiply(x, pb.const(float(k + 1))) for k in range(depth)]
    h = op.negative(x)
    for k in reversed(range(depth)):
        h = If(c, op.add(h, vs[k]), op.sin(x))
    return Function([c, x], op.add(h, op.sum(op.concatenate(vs[:1] + vs[-1:], axis=0)))), vs


FREES_AT = {CALL1: 5, CALL2: 6, CALLN: 5, FN: 4, TUPLE: 3, GET: 4}  # see runtime/plan.py's layouts


def _frees(code: list) -> int:
    total = 0
    for ins in code:
        if ins[0] in FREES_AT:
            total += len(ins[FREES_AT[ins[0]]])
        elif ins[0] == IF:
            total += len(ins[3]) + len(ins[4])
        elif ins[0] == END:
            total += len(ins[3])
    return total


def _plan(f):
    exe = pb.build(f)
    return exe["main"].plan.ensure()


def test_plan_size_and_frees_grow_linearly_with_depth():
    sizes = []
    for depth in (200, 400, 800):
        p = _plan(_chain(depth)[0])
        sizes.append((len(p.code), _frees(p.code)))
    for (c1, f1), (c2, f2) in zip(sizes, sizes[1:]):
        assert c2 <= 2.1 * c1 and f2 <= 2.1 * f1, sizes  # doubling the depth at most doubles them


@pytest.mark.parametrize("cap", [0, 1, 3, plan_mod.PRECISE_DEPTH])
@pytest.mark.parametrize("depth", [5, 40])
def test_every_exit_level_gives_the_right_value(monkeypatch, cap, depth):
    monkeypatch.setattr(plan_mod, "PRECISE_DEPTH", cap)
    f, _ = _chain(depth)
    exe = pb.build(f, check_outputs=True)
    xs = np.array([0.5, -1.0, 2.0], "float32")
    ref = pb.build(f, fuse=False)
    want_true = -xs + sum((k + 1) * xs for k in range(depth)) + (xs.sum() + depth * xs.sum())
    np.testing.assert_allclose(exe["main"](True, xs), want_true, rtol=1e-5)
    np.testing.assert_allclose(exe["main"](False, xs), np.sin(xs) + (xs.sum() + depth * xs.sum()), rtol=1e-5)
    np.testing.assert_allclose(ref["main"](True, xs), want_true, rtol=1e-5)


def _levels(depth: int):
    """Conditions per level: exit (else) at a chosen level, so every exit depth is exercised."""
    c = [var(f"c{k}", shape=(), dtype="bool") for k in range(depth)]
    x = var("x", shape=(3,))
    vs = [op.multiply(x, pb.const(float(k + 2))) for k in range(depth)]
    h = op.exp(x)
    for k in reversed(range(depth)):
        h = If(c[k], op.multiply(h, vs[k]), op.add(vs[min(k + 3, depth - 1)], pb.const(float(k))))
    return Function(c + [x], h), vs


def _reference(depth: int, conds: list, xs: np.ndarray) -> np.ndarray:
    vs = [xs * (k + 2) for k in range(depth)]

    def level(k):
        if k == depth:
            return np.exp(xs)
        return level(k + 1) * vs[k] if conds[k] else vs[min(k + 3, depth - 1)] + k

    return level(0)


@pytest.mark.parametrize("cap", [0, 2, plan_mod.PRECISE_DEPTH])
def test_each_exit_level_with_values_shared_across_levels(monkeypatch, cap):
    monkeypatch.setattr(plan_mod, "PRECISE_DEPTH", cap)
    depth = 24
    f, _ = _levels(depth)
    exe = pb.build(f, check_outputs=True)
    xs = np.array([0.1, -0.2, 0.3], "float32")
    for exit_at in list(range(depth)) + [depth]:
        conds = [k < exit_at for k in range(depth)]
        got = exe["main"](*[np.array(b) for b in conds], xs)
        np.testing.assert_allclose(got, _reference(depth, conds, xs).astype("float32"), rtol=1e-4)


@pytest.mark.parametrize("cap", [0, 1])
def test_random_programs_agree_at_any_cap(monkeypatch, cap):
    for seed in range(60):
        mod = random_program(seed, max_nodes=14)
        inputs = random_inputs(mod, seed)
        want = pb.build(mod)["main"](*inputs)
        monkeypatch.setattr(plan_mod, "PRECISE_DEPTH", cap)
        got = pb.build(mod, check_outputs=True)["main"](*inputs)
        monkeypatch.undo()
        for g, w in zip(_leaves(got), _leaves(want), strict=True):
            np.testing.assert_array_equal(g, w)


def _leaves(v) -> list:
    return [x for f in v for x in _leaves(f)] if isinstance(v, tuple) else [np.asarray(v)]


def _deep_use(depth: int):
    """``v`` is used by the else branch of level 1 and at the bottom of the then chain, so it lives
    at the root and is followed into the chain; ``c1`` picks level 1, ``c`` every deeper level."""
    c1, c, x = var("c1", shape=(), dtype="bool"), var("c", shape=(), dtype="bool"), var("x", shape=(N,))
    v = op.negative(x)
    h = op.add(v, x)
    for _ in range(depth - 1):
        h = If(c, op.negative(h), op.negative(x))
    return Function([c1, c, x], If(c1, h, op.exp(v)))


@pytest.mark.parametrize("depth", [4, 30])
def test_a_value_used_deep_is_freed_on_every_path(depth):
    exe = pb.build(_deep_use(depth), check_outputs=True)
    xs = np.ones(N, "float32")
    t, f = np.array(True), np.array(False)
    # else at level 2: v is freed when that branch starts (within the followed levels)
    assert exe.profile(t, f, xs).peak_bytes == NB
    # all the way down: v dies at its use, or (beyond the followed levels) when the capped branch ends
    prof = exe.profile(t, t, xs)
    np.testing.assert_array_equal(prof.outputs, 0 * xs)
    assert prof.peak_bytes <= 3 * NB
    np.testing.assert_allclose(exe["main"](f, t, xs), np.exp(-xs))


def test_jax_target_nesting_too_deep_is_an_execution_error():
    """jax traces each lax.cond inside the one around it on the Python stack: past MAX_COND_DEPTH
    levels the program is an ExecutionError saying so before tracing (it was a RecursionError, or a
    kernel failure naming whichever operator the limit hit), and the numpy target runs it."""
    pytest.importorskip("jax")
    from pullback.runtime.jax_target import MAX_COND_DEPTH

    fn, _ = _chain(MAX_COND_DEPTH)
    np.testing.assert_allclose(pb.build(fn, target="jax")["main"](np.array(True), np.ones(3, "float32")),
                               pb.build(fn)["main"](np.array(True), np.ones(3, "float32")), rtol=1e-6)
    fn, _ = _chain(MAX_COND_DEPTH + 1)
    with pytest.raises(pb.ExecutionError, match=f"{MAX_COND_DEPTH + 1} levels"):
        pb.build(fn, target="jax")["main"]
    fn, _ = _chain(400)
    with pytest.raises(pb.ExecutionError, match="If expressions nest too deeply for the jax target"):
        pb.build(fn, target="jax")["main"](np.array(True), np.ones(3, "float32"))
    assert np.isfinite(pb.build(fn)["main"](np.array(True), np.ones(3, "float32"))).all()
    fn, _ = _chain(5)
    np.testing.assert_allclose(pb.build(fn, target="jax")["main"](np.array(True), np.ones(3, "float32")),
                               pb.build(fn)["main"](np.array(True), np.ones(3, "float32")), rtol=1e-6)


def test_jax_target_counts_the_ifs_of_a_called_function_from_its_call_site():
    pytest.importorskip("jax")
    from pullback.runtime.jax_target import MAX_COND_DEPTH

    inner, _ = _chain(MAX_COND_DEPTH // 2 + 1)
    g = pb.GlobalVar("g")
    c, x = var("c", shape=(), dtype="bool"), var("x", shape=(3,))
    h = Call(g, [c, x])
    for _ in range(MAX_COND_DEPTH // 2):
        h = If(c, op.tanh(h), op.sin(x))
    mod = pb.IRModule({g: inner, pb.GlobalVar("main"): Function([c, x], h)})
    with pytest.raises(pb.ExecutionError, match=f"{MAX_COND_DEPTH + 1} levels"):
        pb.build(mod, target="jax")["main"]
    assert pb.build(mod, target="jax")["g"] is not None  # g alone is shallow enough
