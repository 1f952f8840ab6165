"""Every operator runs on every target and gives NumPy's result.

Each Case of the op test tables (collected as test_registry.py does) is
evaluated node by node with ``op.impl(target)`` on jax arrays (inside
``jax.jit``, 64-bit types on) and on torch tensors, its float inputs in
float64 and in float32, and every operator's result is compared with
``op.impl("numpy")``'s: the same dtype and shape, equal integer and bool
entries, floats within a tight tolerance. The metadata the program generator
reads (``dtypes``, ``domain``, ``kinks``) is checked here too.
"""

from __future__ import annotations

import numpy as np
import pytest

from pullback.ir.errors import ExecutionError

from pullback.analysis import infer_expr
from pullback.ir.errors import TypeInferenceError
from pullback.ir.expr import Call
from pullback.ir.traversal import post_order
from pullback.ir.types import ALL_DTYPES, TensorType, real_of
from pullback.ops import list_ops

from opgrad import UNSUPPORTED, at_precision, case_tables, evaluate, to_target, vars_for

# Operators whose jax/torch kernels are being written (kernels-nn): their tests must fail until then.
# The lead empties this list when merging.
PENDING: set = set()  # operators whose jax/torch kernels are not written yet (none)
PENDING_MARK = pytest.mark.xfail(strict=True, reason="nn kernels pending")
TARGETS = ("jax", "torch")
TOLERANCE = {"float64": (1e-11, 1e-13), "float32": (2e-6, 1e-6)}  # (rtol, atol)
OPS = list_ops()


def _ops_in(c) -> set:
    return {n.op.name for n in post_order(c.build(*vars_for(c.inputs))) if isinstance(n, Call)}


def _variants():
    out = []
    for _, c in case_tables():
        pending = bool(_ops_in(c) & PENDING)
        floats = any(x.dtype.kind in "fc" for x in c.inputs)
        for target in TARGETS:
            for dt in ("float64", "float32") if floats else ("native",):
                out.append(pytest.param(c, target, dt, id=f"{c.id}-{target}-{dt}", marks=[PENDING_MARK] if pending else []))
    return out


# ------------------------------------------------------------------ evaluation on a target


def _to_numpy(v):
    if isinstance(v, (tuple, list)):
        return tuple(_to_numpy(f) for f in v)
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


def _calls(expr, env: dict, target: str) -> list:
    """The value of every Call of ``expr`` (post order) computed with ``op.impl(target)``."""
    calls: list = []
    evaluate(expr, env, target, calls)
    return calls


def _run(target: str, expr, xs, inputs) -> list:
    args = [to_target(target, x) for x in inputs]
    if target != "jax":
        return _to_numpy(_calls(expr, dict(zip(xs, args)), target))
    import jax

    return _to_numpy(jax.jit(lambda *a: _calls(expr, dict(zip(xs, a)), "jax"))(*args))


def _leaves(v) -> list:
    return [x for f in v for x in _leaves(f)] if isinstance(v, tuple) else [np.asarray(v)]


def _compare(got, want, what: str) -> None:
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape}, NumPy gives {w.dtype}{w.shape}"
        if w.dtype.kind in "fc":
            rtol, atol = TOLERANCE[real_of(w.dtype.name)]
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


@pytest.mark.parametrize("c, target, dt", _variants())
def test_op_gives_numpy_result_on_target(c, target, dt):
    pytest.importorskip(target)
    inputs = [at_precision(x, dt) if dt != "native" else x for x in c.inputs]
    xs = vars_for(inputs)
    expr = c.build(*xs)
    infer_expr(expr)
    calls = [n for n in post_order(expr) if isinstance(n, Call)]
    want = _run("numpy", expr, xs, inputs)
    unsupported = [UNSUPPORTED[(n.op.name, target)] for n in calls if (n.op.name, target) in UNSUPPORTED]
    if unsupported:
        with pytest.raises(ExecutionError, match=unsupported[0]):
            _run(target, expr, xs, inputs)
        return
    _check_calls(target, expr, xs, inputs, calls, want, c.id)


def _check_calls(target: str, expr, xs, inputs, calls, want, what: str) -> None:
    """Every call's value on ``target`` (jax: 64-bit types on) against NumPy's ``want``."""
    if target == "jax":
        import jax

        with jax.enable_x64(True):
            got = _run(target, expr, xs, inputs)
    else:
        got = _run(target, expr, xs, inputs)
    for n, g, w in zip(calls, got, want, strict=True):
        _compare(g, w, f"{what}: {n.op.name} on {target}")


def _narrowed(c, itype: str):
    """``c``'s inputs with its integer ones (positions, offsets, integer data) as ``itype`` and its floats in
    float32, or None when a value does not fit ``itype`` or the operators do not take it (their type rules say
    so on every target)."""
    info = np.iinfo(itype)
    ints = [x for x in c.inputs if x.dtype.kind in "iu"]
    if not ints or any(x.size and (x.min() < info.min or x.max() > info.max) for x in ints):
        return None
    inputs = [x.astype(itype) if x.dtype.kind in "iu" else at_precision(x, "float32") if x.dtype.kind == "f" else x
              for x in c.inputs]
    try:
        infer_expr(c.build(*vars_for(inputs)))
    except TypeInferenceError:
        return None
    return inputs


@pytest.mark.parametrize("c, target, itype", [
    pytest.param(c, t, it, id=f"{c.id}-{t}-{it}") for _, c in case_tables() for it in ("int8", "uint8")
    if _narrowed(c, it) is not None for t in TARGETS if not _ops_in(c) & {o for o, u in UNSUPPORTED if u == t}])
def test_narrow_integer_inputs_give_numpy_result_on_target(c, target, itype):
    """The op table's integer inputs as int8 and uint8 (positions of take, index_add, gather, scatter...; integer
    data): NumPy's result on every target. ATen indexes with int32 and int64 only (uint8: a mask), so narrow
    positions failed on torch; an int8 position counted from the end of an axis overflowed on every target."""
    pytest.importorskip(target)
    inputs = _narrowed(c, itype)
    xs = vars_for(inputs)
    expr = c.build(*xs)
    infer_expr(expr)
    calls = [n for n in post_order(expr) if isinstance(n, Call)]
    _check_calls(target, expr, xs, inputs, calls, _run("numpy", expr, xs, inputs), f"{c.id} ({itype})")


# operators whose kernels met an empty batch badly: MKL's FFT (torch) refused it, ATen's batch norm backward
# divided by zero (a floating-point exception ending the process), the shared max-pool gradient reshaped with -1
EMPTIED = {"fft_r2c", "fft_c2r", "fft_c2c", "nn.batch_norm_grad", "nn.native_batch_norm_grad",
           "nn.max_pool2d_with_indices_grad"}


def _emptied(c):
    """``c``'s inputs (floats in float32) with the leading axis of those sharing the first input's emptied (an
    empty batch), or None when that is not a valid program or NumPy's kernels refuse it."""
    inputs = [at_precision(x, "float32") if x.dtype.kind == "f" else x for x in c.inputs]
    batch = inputs[0].shape[0] if inputs[0].ndim else 0
    if batch < 2:
        return None
    inputs = [x[:0] if x.ndim and x.shape[0] == batch else x for x in inputs]
    try:
        xs = vars_for(inputs)
        expr = c.build(*xs)
        infer_expr(expr)
        _run("numpy", expr, xs, inputs)
    except Exception:  # noqa: BLE001 - an invalid program, or NumPy's kernel refuses it (an FFT over the empty axis)
        return None
    return inputs


@pytest.mark.parametrize("c, target", [pytest.param(c, t, id=f"{c.id}-{t}") for _, c in case_tables()
                                       if _ops_in(c) & EMPTIED and _emptied(c) is not None for t in TARGETS])
def test_an_empty_batch_gives_numpy_result_on_target(c, target):
    """A batch of no elements: the empty results (and the batch norm's zero parameter gradients) NumPy gives."""
    pytest.importorskip(target)
    inputs = _emptied(c)
    xs = vars_for(inputs)
    expr = c.build(*xs)
    infer_expr(expr)
    calls = [n for n in post_order(expr) if isinstance(n, Call)]
    _check_calls(target, expr, xs, inputs, calls, _run("numpy", expr, xs, inputs), f"{c.id} (empty batch)")

@pytest.mark.parametrize("o, target", [
    pytest.param(o, t, id=f"{o.name}-{t}", marks=[PENDING_MARK] if o.name in PENDING and t != "numpy" else [])
    for o in OPS for t in ("numpy",) + TARGETS])
def test_op_has_a_kernel_for_target(o, target):
    if target == "numpy":
        assert callable(o.impl("numpy"))
    else:
        assert o.kernel is not None or target in o.impls, f"{o.name}: no kernel and no {target} override"


def test_pending_list_names_registered_ops():
    assert PENDING <= {o.name for o in OPS}


# ------------------------------------------------------------------ metadata the generator reads


@pytest.mark.parametrize("o", [o for o in OPS if o.elementwise and o.num_inputs in (1, 2)], ids=lambda o: o.name)
def test_declared_dtypes_match_type_inference(o):
    """``OpDef.dtypes`` says exactly which input dtypes ``infer`` accepts."""
    attrs = o.make_attrs(**o.example_attrs) if o.attrs_type is not None else None
    for dt in ALL_DTYPES:
        try:
            o.infer([TensorType((2,), dt)] * o.num_inputs, attrs)
            accepted = True
        except TypeInferenceError:
            accepted = False
        assert accepted == (dt in o.dtypes), f"{o.name}: infer {'accepts' if accepted else 'rejects'} {dt}"


@pytest.mark.parametrize("o", OPS, ids=lambda o: o.name)
def test_domain_and_kinks_are_well_formed(o):
    assert len(o.domain) <= max(o.num_inputs, 0), f"{o.name}: a domain for more inputs than it has"
    assert all(d is None or len(d) == 2 and d[0] < d[1] for d in o.domain), f"{o.name}: bad domain {o.domain}"
    assert callable(o.kinks) or all(isinstance(k, float) for k in o.kinks), f"{o.name}: bad kinks {o.kinks}"
