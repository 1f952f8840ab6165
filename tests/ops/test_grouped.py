"""nn.grouped_matmul and nn.grouped_transpose_matmul (a mixture of experts' GEMMs). Their cases (GROUPED, run by
test_nn_ops.py: forward and VJP against a per-group PyTorch reference in float64, finite differences, float16, and
by test_all_targets.py on every target; the VJP of nn.grouped_transpose_matmul, nn.grouped_matmul's gradient, is
its second order); here ATen's bits on torch, one rounding in half precision, errors."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.analysis import infer_expr
from pullback.ir.errors import TypeInferenceError

from opgrad import case

RNG = np.random.default_rng(5)
S, K, N, E = 7, 3, 4, 3
OFFS = {"all-rows": [2, 5, 7], "empty-groups": [0, 4, 4], "rows-past-the-last-group": [3, 3, 5], "no-rows": [0, 0, 0],
        "past-the-end": [2, 6, 9]}


def _groups(offs, rows):
    start = 0
    for e, end in enumerate(offs.tolist()):
        end = min(max(end, start), rows)
        yield e, start, end
        start = end


def grouped_torch(x, w, offs):
    """Each group's rows times its expert, in PyTorch (differentiable; rows past the last group zero)."""
    import torch

    parts = [x[lo:hi] @ w[e] for e, lo, hi in _groups(offs, x.shape[0])]
    end = sum(p.shape[0] for p in parts)
    return torch.cat(parts + [torch.zeros(x.shape[0] - end, w.shape[2], dtype=x.dtype)])


def transpose_torch(a, b, offs):
    import torch

    return torch.stack([a[lo:hi].T @ b[lo:hi] for _, lo, hi in _groups(offs, a.shape[0])])


def _offs(name):
    return np.array(OFFS[name], dtype="int64")


GROUPED = [case("nn.grouped_matmul", RNG.standard_normal((S, K)), RNG.standard_normal((E, K, N)), _offs(n),
              torch=grouped_torch, id=f"grouped_matmul-{n}") for n in OFFS] + \
        [case("nn.grouped_transpose_matmul", RNG.standard_normal((S, K)), RNG.standard_normal((S, N)), _offs(n),
              torch=transpose_torch, id=f"grouped_transpose_matmul-{n}") for n in OFFS]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_torch_target_is_atens_grouped_gemm_bit_for_bit(dtype):
    """On torch the products are ATen's ``_grouped_mm`` (eager's kernel for Hugging Face's experts), rows past
    the last group zero where ATen leaves them unwritten."""
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    x, w, g = torch.randn(24, 16, dtype=dt), torch.randn(3, 16, 8, dtype=dt), torch.randn(24, 8, dtype=dt)
    offs = torch.tensor([5, 5, 20], dtype=torch.int32)
    fwd = op.nn.grouped_matmul.impl("torch")(x, w, offs, None)
    want = torch._grouped_mm(x, w, offs=offs)
    assert torch.equal(fwd[:20], want[:20]) and not fwd[20:].any()
    assert torch.equal(op.nn.grouped_transpose_matmul.impl("torch")(x, g, offs, None), torch._grouped_mm(x.t(), g, offs=offs))


@pytest.mark.parametrize("case", ["takes", "float64", "odd-rows", "transposed", "unsorted-offsets", "past-the-end"])
def test_torch_target_calls_atens_grouped_gemm_once_where_it_takes_the_operands(case, monkeypatch):
    """One ``_grouped_mm`` call (eager's, no Python loop over the groups) for float32 operands ATen takes and
    offsets it can read unchecked (non-decreasing, within the rows); else the loop, with the op's values."""
    torch = pytest.importorskip("torch")
    calls = []
    real = torch._grouped_mm
    monkeypatch.setattr(torch, "_grouped_mm", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    k = 5 if case == "odd-rows" else 16  # 20-byte rows: ATen wants strides of 16-byte multiples
    dt = torch.float64 if case == "float64" else torch.float32
    x, w, g = torch.randn(24, k, dtype=dt), torch.randn(3, k, 8, dtype=dt), torch.randn(24, 8, dtype=dt)
    if case == "transposed":
        x = x.t().contiguous().t()
    offs = torch.tensor({"unsorted-offsets": [9, 5, 20], "past-the-end": [5, 9, 30]}.get(case, [5, 5, 20]))
    fwd = op.nn.grouped_matmul.impl("torch")(x, w, offs, None)
    bwd = op.nn.grouped_transpose_matmul.impl("torch")(x, g, offs, None)
    torch.testing.assert_close(fwd, grouped_torch(x, w, offs), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bwd, transpose_torch(x, g, offs), rtol=1e-5, atol=1e-5)
    assert len(calls) == {"takes": 2, "transposed": 2}.get(case, 0)  # column-major x: a stride of 24 floats


def test_half_precision_rounds_once():
    """float16 products accumulate in float32 and round once, on every target."""
    x = RNG.standard_normal((6, 64)).astype("float16")
    w = RNG.standard_normal((2, 64, 3)).astype("float16")
    offs = np.array([2, 6])
    exact = np.concatenate([x[:2].astype("f8") @ w[0].astype("f8"), x[2:].astype("f8") @ w[1].astype("f8")])
    xv, wv, ov = pullback.var("x", shape=x.shape, dtype="float16"), pullback.var("w", shape=w.shape, dtype="float16"), \
        pullback.var("o", shape=(2,), dtype="int64")
    mod = pullback.IRModule.from_expr(pullback.Function([xv, wv, ov], op.nn.grouped_matmul(xv, wv, ov)))
    for target in ("numpy", "jax", "torch"):
        got = pullback.build(mod, target=target)["main"](x, w, offs)
        got = np.asarray(got.numpy() if hasattr(got, "numpy") else got, dtype="f8")
        np.testing.assert_array_equal(got, exact.astype("float16").astype("f8"), err_msg=target)


def test_errors_name_the_op():
    x, w = pullback.var("x", shape=(S, K)), pullback.var("w", shape=(E, K, N))
    offs = pullback.var("o", shape=(E,), dtype="int64")
    bad = [(op.nn.grouped_matmul(x, pullback.var("w", shape=(E, K + 1, N)), offs), "grouped_matmul.*contraction"),
           (op.nn.grouped_matmul(x, w, pullback.var("o", shape=(E + 1,), dtype="int64")), "grouped_matmul.*group counts"),
           (op.nn.grouped_matmul(x, w, pullback.var("o", shape=(E,))), "grouped_matmul.*offs must be a rank-1 integer"),
           (op.nn.grouped_matmul(x, pullback.var("w", shape=(K, N)), offs), "grouped_matmul.*rank 3"),
           (op.nn.grouped_matmul(x, pullback.var("w", shape=(E, K, N), dtype="float64"), offs), "grouped_matmul.*one dtype"),
           (op.nn.grouped_transpose_matmul(x, pullback.var("b", shape=(S + 1, N)), offs), "grouped_transpose_matmul.*row counts")]
    for e, pattern in bad:
        with pytest.raises(TypeInferenceError, match=pattern):
            infer_expr(e)
