"""The JAX target: every op runs, results equal to the numpy target.

The operator table runs as one program per op test module (``op_table``: one jit compile each).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import pullback as pb
from op_table import covered_ops, table_programs, unsupported_cases
from pullback import Function, If, IRModule, Tuple, op, transform, var
from pullback.ops import list_ops

pytest.importorskip("jax")

from pullback.runtime.jax_target import missing_lowerings  # noqa: E402


def assert_same(want, got):
    wl, gl = pb.runtime.values.leaves(want), pb.runtime.values.leaves(got)
    assert len(wl) == len(gl)
    for k, (w, g) in enumerate(zip(wl, gl)):
        assert isinstance(g, np.ndarray), type(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


@pytest.mark.parametrize("mod, inputs", [pytest.param(m, i, id=name) for name, m, i in table_programs("jax")])
def test_op_table_matches_numpy(mod, inputs):
    assert_same(pb.build(mod)["main"](*inputs), pb.build(mod, target="jax")["main"](*inputs))


@pytest.mark.parametrize("mod, inputs, error", [pytest.param(m, i, e, id=c) for c, m, i, e in unsupported_cases("jax")])
def test_what_jax_cannot_run_is_a_clear_error(mod, inputs, error):
    with pytest.raises(pb.ExecutionError, match=error):
        pb.build(mod, target="jax")["main"](*inputs)


def test_op_table_covers_every_registered_op():
    assert sorted(o.name for o in list_ops() if o.name not in covered_ops()) == []


def test_every_registered_op_has_a_jax_kernel():
    assert missing_lowerings() == []


def test_control_flow_calls_fused_groups_and_float64():
    x, c = var("x", shape=(3,), dtype="float64"), var("c", shape=(), dtype="bool")
    t = var("t", pb.TupleType([pb.TensorType((3,), "float64"), pb.TensorType((), "float64")]))
    helper_x = var("hx", shape=(3,), dtype="float64")
    helper = Function([helper_x], op.tanh(op.exp(helper_x)))
    mod = IRModule({"helper": helper})
    gv = mod.get_global_var("helper")
    e = op.exp(x)
    body = If(c, op.sin(op.negative(e)), pb.Call(gv, [op.cos(e)]))
    main = Function([x, c, t], Tuple([op.multiply(body, t[0]), op.sum(op.add(x, t[1]))]))
    mod = mod.with_function("main", main)
    fused = transform.FuseOps()(mod)
    inputs = [np.array([0.1, 0.2, 0.3]), None, (np.array([1.0, 2.0, 3.0]), np.array(0.5))]
    exe, ref = pb.build(fused, target="jax"), pb.build(mod)
    for cond in (True, False):
        inputs[1] = np.array(cond)
        got = exe["main"](*inputs)
        assert got[0].dtype == np.float64
        assert_same(ref["main"](*inputs), got)


def test_gradient_program_matches():
    from pullback.testing import models

    mod, make_inputs = models.mlp(batch=4, sizes=(6, 8, 5))
    grad = transform.Sequential([transform.FirstOrderGradient(), transform.ConcretizeLike(),
                                 transform.standard_cleanup(), transform.FuseOps()])(mod)
    inputs = make_inputs(0)
    assert_same(pb.build(grad)["main_grad"](*inputs), pb.build(grad, target="jax")["main_grad"](*inputs))


def test_errors():
    x = var("x", shape=(2, 3))
    exe = pb.build(Function([x], op.exp(x)), target="jax")
    with pytest.raises(pb.ExecutionError, match="parameter %x"):
        exe["main"](np.zeros((3, 3), "float32"))
    with pytest.raises(pb.ExecutionError, match="takes 1 input"):
        exe["main"]()
    with pytest.raises(pb.ExecutionError, match="no function @nope"):
        exe["nope"]
    n = var("n", shape=(), dtype="int32")
    mod = IRModule({"f": Function([n], n)})
    gv = mod.get_global_var("f")
    mod = mod.with_function("f", Function([n], If(op.greater(n, pb.const(0)), pb.Call(gv, [op.subtract(n, pb.const(1))]), n),
                                         pb.TensorType((), "int32")))
    with pytest.raises(pb.ExecutionError, match="recursive"):
        pb.build(mod, target="jax")["f"]


def test_entries_share_helper_plans_with_constants():
    """Plans (and their constants) are compiled once and reused by every trace: no leaked tracers."""
    c = var("c", shape=(pb.Any,))
    mod = IRModule({"h": Function([c], op.add(c, pb.const(np.float32(2.0))))})
    h = mod.get_global_var("h")
    mod = mod.with_function("main", Function([c], pb.Call(h, [op.negative(c)])))
    mod = mod.with_function("other", Function([c], op.exp(pb.Call(h, [c]))))
    exe, ref = pb.build(mod, target="jax", check_outputs=True), pb.build(mod)
    for n in (3, 4):  # a new shape retraces with the same plans
        xs = np.linspace(-1, 1, n).astype("float32")
        for name in ("main", "other", "h"):
            assert_same(ref[name](xs), exe[name](xs))


X64_SCRIPT = """
import gc, numpy as np, jax, jax.numpy as jnp, pullback as pb
from pullback import op, var
from pullback.runtime import tuning
x = var("x", shape=(3,), dtype="float64")
exe = pb.build(pb.Function([x], op.multiply(op.exp(x), pb.const(np.float64(1.0) / 3))), target="jax")
got = exe["main"](np.array([0.1, 0.2, 0.3]))
assert got.dtype == np.float64, got.dtype
np.testing.assert_allclose(got, np.exp([0.1, 0.2, 0.3]) / 3, rtol=1e-15)
assert "f64" in exe["main"].lower_text(np.zeros(3))
assert jnp.ones(2).dtype == jnp.float32 and not jax.config.jax_enable_x64
assert pb.build(pb.Function([x], op.negative(x)))["main"](np.ones(3)).dtype == np.float64
assert gc.isenabled() and not tuning._malloc_tuned
gc.disable()
pb.build(pb.Function([x], op.negative(x)))["main"](np.ones(3))
assert not gc.isenabled()
print("OK")
"""


def test_no_process_wide_side_effects():
    """A float64 program runs in 64 bits without switching jax_enable_x64 on for the process; building
    restores the garbage collector's state and leaves malloc alone."""
    proc = subprocess.run([sys.executable, "-c", X64_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK"


def test_64_bit_constants_keep_their_precision_when_the_plan_is_made_before_the_first_call():
    """A float64 or int64 constant converted outside the module's 64-bit scope (``plan.ensure()`` right after
    ``build``, as the PyTorch integration does) stays 64-bit: 0.9189385332046727 (Normal.log_prob's constant)
    is not rounded to float32, 2**40 is not wrapped."""
    x, i = var("x", shape=(3,), dtype="float64"), var("i", shape=(3,), dtype="int64")
    body = Tuple([op.subtract(x, pb.const(np.float64(0.9189385332046727))), op.add(i, pb.const(np.int64(2**40)))])
    fn = pb.build(IRModule.from_expr(Function([x, i], body)), target="jax")["main"]
    fn.plan.ensure()
    v, k = np.array([1.5, 2.5, 3.5]), np.array([1, 2, 3])
    got, ints = fn(v, k)
    np.testing.assert_array_equal(got, v - 0.9189385332046727)
    np.testing.assert_array_equal(ints, k + 2**40)


def test_import_pullback_does_not_import_jax():
    code = "import sys, pullback; pullback.build; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_tensors_go_in_by_dlpack_and_results_come_out_native():
    torch = pytest.importorskip("torch")
    x, i = var("x", shape=(3, 4)), var("i", shape=(3,), dtype="int64")
    mod = IRModule.from_expr(Function([x, i], Tuple([op.transpose(x, (1, 0)), i])))
    fn = pb.build(mod, target="jax")["main"]
    t = torch.arange(12.0).reshape(4, 3).T  # not contiguous: copied once, then taken by DLPack
    idx = torch.tensor([1, 2, 3])
    c = t.contiguous()
    assert fn._exe.target.take(c).unsafe_buffer_pointer() == c.data_ptr()  # zero copy
    out, ii = fn.call_native([t, idx])
    assert type(out).__module__.startswith("jax") and ii.dtype == np.int64  # 64-bit ints stay 64-bit
    np.testing.assert_array_equal(np.asarray(out), t.numpy().T)
    back = torch.from_dlpack(out)
    assert back.data_ptr() == out.unsafe_buffer_pointer()
    np.testing.assert_array_equal(fn(t, idx)[0], t.numpy().T)  # __call__: NumPy arrays out


def test_power_keeps_the_exact_cases_of_pow_after_exp():
    """XLA rewrites pow(exp(u), v) to exp(u * v): 1 ** nan, 1 ** inf and nan ** 0 must still be 1, as in NumPy
    (found by the edge-value property test)."""
    x, y = var("x", shape=(2, 4), dtype="float64"), var("y", shape=(4,), dtype="float64")
    mod = IRModule.from_expr(Function([x, y], op.power(op.exp(op.tanh(x)), y)))
    xs = np.array([[0.0] * 4, [np.nan] * 4])
    ys = np.array([np.nan, np.inf, -np.inf, 0.0])
    want = pb.build(mod)["main"](xs, ys)
    np.testing.assert_array_equal(want[0], np.ones(4))
    np.testing.assert_array_equal(pb.build(mod, target="jax")["main"](xs, ys), want)


@pytest.mark.parametrize("targets, error", [([1, 0, 2, 1], None), ([1, 3, 2, 1], "out of range")])
def test_nll_loss_of_constant_targets_is_checked_after_the_call(targets, error):
    """Targets that are a constant of the program (folded, e.g. from ``arange``) are still traced values inside
    ``jax.jit``: the range check is recorded and raised after the call, as for an input's targets, and the loss
    is the numpy target's."""
    x = var("x", shape=(4, 3), dtype="float64")
    t = pb.const(np.array(targets, "int64"))
    f = Function([x], op.nn.nll_loss(op.nn.log_softmax(x), t, pb.const(np.ones(3)), "mean", -100))
    xs = np.random.default_rng(0).standard_normal((4, 3))
    if error is None:
        np.testing.assert_allclose(pb.build(f, target="jax")["main"](xs), pb.build(f)["main"](xs), rtol=1e-12)
    else:
        for target in ("numpy", "jax"):
            with pytest.raises(pb.ExecutionError, match=error):
                pb.build(f, target=target)["main"](xs)


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_sums_add_in_float32_and_round_once(target, dtype):
    """``sum``, the gradient's ``collapse_sum_like`` and ``cumsum`` of float16/bfloat16 add up in float32 and round
    once, as ATen does: ``jnp.sum(x, dtype=bfloat16)`` added in bfloat16 (a bias gradient 2.7x further from float64's than
    eager's), NumPy's float16 sums rounded at every pairwise step."""
    if target == "torch":
        pytest.importorskip("torch")
    import ml_dtypes  # noqa: F401  (NumPy's bfloat16)

    data = np.random.default_rng(0).standard_normal((512, 48)).astype(dtype)
    x = var("x", shape=(512, 48), dtype=dtype)
    like = var("b", shape=(48,), dtype=dtype)
    mod = IRModule.from_expr(Function([x, like], Tuple([op.sum(x, axis=0), op.collapse_sum_like(x, like),
                                                         op.cumsum(x, 0)])))
    wide = data.astype(np.float32)
    wants = [wide.sum(0), wide.sum(0), wide.cumsum(0)]
    for got, want in zip(pb.build(mod, target=target)["main"](data, data[0]), wants):
        got = got.float().numpy() if target == "torch" else np.asarray(got)
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(dtype).astype(np.float64))
