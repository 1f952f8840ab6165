"""The torch target: every operator's ``op.impl("torch")`` run on tensors equals the numpy target.

The operator table runs as one program per op test module (``op_table``), every result compared
with the numpy target's.
"""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from op_table import table_programs
from pullback import Call, Function, var
from pullback.ops.registry import OpDef
from xp_ops import mul, neg

torch = pytest.importorskip("torch")



def to_numpy(value):
    return pb.runtime.values.to_output(value, lambda t: t.detach().cpu().numpy())


def assert_same(want, got):
    wl, gl = pb.runtime.values.leaves(want), pb.runtime.values.leaves(to_numpy(got))
    assert len(wl) == len(gl)
    for k, (w, g) in enumerate(zip(wl, gl)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"output {k}")


@pytest.mark.parametrize("mod, inputs", [pytest.param(m, i, id=name) for name, m, i in table_programs("torch")])
def test_op_table_matches_numpy(mod, inputs):
    got = pb.build(mod, target="torch", check_outputs=True)["main"](*inputs)
    for leaf in pb.runtime.values.leaves(got):
        assert isinstance(leaf, torch.Tensor), type(leaf)
    assert_same(pb.build(mod)["main"](*inputs), got)


def test_an_operator_without_a_torch_kernel_is_refused_at_build():
    numpy_only = OpDef("numpy_only", 1, lambda ts, attrs: ts[0], compute=lambda x, attrs=None: -x)
    x = var("x", shape=(2,))
    with pytest.raises(pb.ExecutionError, match=r"^target 'torch': no kernel for numpy_only$"):
        pb.build(Function([x], Call(numpy_only, [x])), target="torch")


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


@pytest.mark.parametrize("k", [pb.const(2.0), pb.const(np.full((1, 1), 2.0, "float32")), pb.const(3.0), pb.const(0.5),
                               pb.const(-1.0), pb.const(-2.0), pb.const(1.7),
                               pb.const(np.float32(2.0) + np.zeros((3,), "float32"))])
def test_power_by_a_constant_scalar_gives_the_numpy_result(k):
    """``x ** k`` with a constant scalar ``k`` runs as ``torch.pow(x, float)`` (ATen's fast paths for 2, 3, +-0.5,
    -1, -2; pow by a 0-d tensor is its generic kernel) with the numpy target's result, broadcasting included."""
    x = var("x", shape=(2, 3))
    fn = Function([x], pb.op.power(x, k))
    xs = np.array([[-1.5, 0.0, np.inf], [np.nan, -0.0, 3.0]], "float32")
    want = pb.build(fn)["main"](xs)
    got = pb.build(fn, target="torch")["main"](xs)
    assert tuple(got.shape) == want.shape and got.numpy().dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, equal_nan=True)
