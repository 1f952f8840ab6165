"""The torch target: every operator's ``op.impl("torch")`` run on tensors equals the numpy target.

The operator table is run output by output (one program per call of ``op_cases``), so each
operator passes or fails on its own. A program using an operator without a torch kernel yet is
an expected failure (strict: it must fail), so the table becomes complete as kernels land.
"""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from op_cases import CASES
from pullback import Call, Function, IRModule, var
from pullback.ir.traversal import post_order
from pullback.ops.registry import OpDef
from xp_ops import mul, neg

torch = pytest.importorskip("torch")

from pullback.runtime.torch_target import TorchTarget  # noqa: E402


def _ops(expr) -> list[OpDef]:
    return sorted({n.op for n in post_order(expr) if isinstance(n, Call) and isinstance(n.op, OpDef)},
                  key=lambda o: o.name)


def missing_torch_kernels(ops) -> list[str]:
    target = TorchTarget()
    return [o.name for o in ops if not target.has_kernel(o)]


def _table():
    params = []
    for case in CASES:
        fn, inputs = case()
        for k, out in enumerate(fn.body.fields):
            ops = _ops(out)
            missing = missing_torch_kernels(ops)
            marks = [pytest.mark.xfail(strict=True, raises=pb.ExecutionError,
                                       reason=f"no torch kernel yet for {', '.join(missing)}")] if missing else []
            ident = f"{case.__name__[5:]}{k}-{'+'.join(o.name for o in ops)}"
            params.append(pytest.param(Function(fn.params, out), inputs, id=ident, marks=marks))
    return params


def to_numpy(value):
    return pb.runtime.values.to_output(value, lambda t: t.detach().cpu().numpy())


def assert_same(want, got):
    wl, gl = pb.runtime.values.leaves(want), pb.runtime.values.leaves(to_numpy(got))
    assert len(wl) == len(gl)
    for k, (w, g) in enumerate(zip(wl, gl)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


@pytest.mark.parametrize("fn, inputs", _table())
def test_op_matches_numpy(fn, inputs):
    mod = IRModule.from_expr(fn)
    got = pb.build(mod, target="torch", check_outputs=True)["main"](*inputs)
    for leaf in pb.runtime.values.leaves(got):
        assert isinstance(leaf, torch.Tensor), type(leaf)
    assert_same(pb.build(mod)["main"](*inputs), got)


def test_missing_kernels_are_refused_at_build():
    for case in CASES:
        fn, _ = case()
        missing = missing_torch_kernels(_ops(fn.body))
        if missing:
            with pytest.raises(pb.ExecutionError, match=rf"^target 'torch': no kernel for {', '.join(missing)}$"):
                pb.build(fn, target="torch")
            return
    pytest.skip("every registered operator has a torch kernel")


def test_tensors_in_and_out_without_copies():
    x = var("x", shape=(2, 3))
    exe = pb.build(Function([x], mul(x, x)), target="torch", device="cpu")
    assert exe.device == torch.device("cpu")
    t = torch.arange(6.0).reshape(2, 3)
    out = exe["main"](t)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    torch.testing.assert_close(out, t * t)
    a = np.arange(6, dtype="float32").reshape(2, 3)
    ident = pb.build(Function([x], x), target="torch")["main"]
    assert np.shares_memory(ident(a).numpy(), a)  # a writable NumPy input is used in place
    ro = a.copy()
    ro.flags.writeable = False
    assert not np.shares_memory(ident(ro).numpy(), ro)  # a read-only one is copied: tensors are writable


def test_bad_device_is_a_pullback_error():
    x = var("x", shape=(2,))
    with pytest.raises(pb.ExecutionError, match="target 'torch': cannot use device 'nonsense'"):
        pb.build(Function([x], neg(x)), target="torch", device="nonsense")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_device():  # pragma: no cover - no GPU on the test machines
    x = var("x", shape=(2,))
    out = pb.build(Function([x], neg(x)), target="torch", device="cuda")["main"](np.ones(2, "float32"))
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), -torch.ones(2))
