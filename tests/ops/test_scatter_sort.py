"""cumsum, cumprod, logcumsumexp, cumargmax/cumargmin, argsort, unique, nonzero, scatter and scatter_reduce: forward vs PyTorch, kernels on every namespace, gradient rules."""

from __future__ import annotations

import numpy as np
import pytest

import pullback
from pullback import op
from pullback.analysis import infer_expr
from pullback.ir.errors import AttrError, ExecutionError, TypeInferenceError

from namespaces import check_namespaces
from opgrad import Case, case, check_ad, check_rule, check_second, dtype_check, forward, torch_check

RNG = np.random.default_rng(11)
X = RNG.standard_normal((3, 4))
TIES = np.array([[3.0, 1.0, 3.0, 2.0, 1.0], [0.5, 0.5, np.nan, -1.0, 0.5]])
IDX = np.array([[2, 0, 1], [1, 2, 0]], dtype="int64")  # a permutation per row: no repeated writes
UPD = RNG.standard_normal((2, 3))


def torch():
    import torch as t

    return t


CASES = [
    case("cumsum", X, attrs=dict(axis=1), torch=lambda x: torch().cumsum(x, 1)),
    case("cumsum", X, attrs=dict(axis=0, reverse=True), torch=lambda x: torch().cumsum(x.flip(0), 0).flip(0)),
    case("cumsum", np.array(2.5), torch=lambda x: torch().cumsum(x, 0)),
    case("scatter", X, IDX, UPD, attrs=dict(axis=1), torch=lambda x, i, u: torch().scatter(x, 1, i, u)),
    case("scatter", X, IDX.T.copy()[:2], UPD.T.copy()[:2], attrs=dict(axis=0),
         torch=lambda x, i, u: torch().scatter(x, 0, i, u)),
]
RIDX = np.array([[0, 3, 0, 1, 0], [2, 2, 1, 2, 0]], dtype="int64")  # repeated positions along axis 1
RUPD = RNG.standard_normal((2, 5))
RZERO = RUPD.copy()
RZERO[0, 1] = 0.0  # a single zero factor at (0, 3)
RZERO[1, [0, 1]] = 0.0  # two zero factors at (1, 2)


def _scatter_reduce(reduce, include_self, idx=RIDX, upd=RUPD, **kw):
    return case("scatter_reduce", X, idx, upd, attrs=dict(axis=1, reduce=reduce, include_self=include_self),
                torch=lambda x, i, u: x.scatter_reduce(1, i, u, reduce, include_self=include_self),
                id=f"scatter_reduce-{reduce}-{'self' if include_self else 'noself'}" + kw.pop("tag", ""), **kw)


CASES += [_scatter_reduce(r, inc) for r in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)]
CASES += [_scatter_reduce("prod", inc, upd=RZERO, tag="-zeros") for inc in (True, False)]
TIED = RUPD.copy()
TIED[0, [0, 2]] = 5.0  # a tie for the maximum at (0, 0)
CASES += [_scatter_reduce(r, True, upd=TIED * s, tag="-ties", fd=False) for r, s in (("amax", 1.0), ("amin", -1.0))]
NONDIFF = [
    case("cumsum", np.array([[1, 2, 3], [4, 5, 6]], dtype="int32"), attrs=dict(axis=-1), torch=lambda x: torch().cumsum(x, -1, dtype=x.dtype)),
    case("argsort", X, torch=lambda x: torch().argsort(x, stable=True)),
    case("argsort", TIES, attrs=dict(axis=1), torch=lambda x: torch().argsort(x, dim=1, stable=True)),
    case("argsort", TIES, attrs=dict(axis=1, descending=True), torch=lambda x: torch().argsort(x, dim=1, descending=True, stable=True)),
    case("argsort", TIES, attrs=dict(axis=0, descending=True), torch=lambda x: torch().argsort(x, dim=0, descending=True, stable=True)),
    case("nonzero", np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]]), torch=lambda x: torch().nonzero(x)),
    case("nonzero", np.array([True, False, True]), torch=lambda x: torch().nonzero(x)),
    case("nonzero", np.array(0.0), torch=lambda x: torch().nonzero(x)),
    case("scatter_reduce", np.arange(12).reshape(3, 4), RIDX, np.arange(10).reshape(2, 5) - 4,
         attrs=dict(axis=1, reduce="mean", include_self=False),
         torch=lambda x, i, u: x.scatter_reduce(1, i, u, "mean", include_self=False)),
    case("scatter_reduce", np.arange(12).reshape(3, 4), RIDX, np.arange(10).reshape(2, 5) - 4,
         attrs=dict(axis=1, reduce="amin", include_self=False),
         torch=lambda x, i, u: x.scatter_reduce(1, i, u, "amin", include_self=False)),
]
ZEROS = X.copy()
ZEROS[0, 1] = 0.0  # one zero in a row
ZEROS[2, [0, 2]] = 0.0  # two zeros in a row (the gradient is zero before the second)
CUMPROD = [
    case("cumprod", X, attrs=dict(axis=1), torch=lambda x: torch().cumprod(x, 1)),
    case("cumprod", ZEROS, attrs=dict(axis=1), torch=lambda x: torch().cumprod(x, 1), id="cumprod-zeros"),
    case("cumprod", ZEROS, attrs=dict(axis=-2), torch=lambda x: torch().cumprod(x, -2), id="cumprod-zeros-axis0"),
    case("cumprod", np.array(2.5), torch=lambda x: torch().cumprod(x, 0)),
]


def _cumprod_vjp(g, x):
    x = x.detach().requires_grad_(True)
    return torch().autograd.grad(torch().cumprod(x, 1), x, g)[0]


NONDIFF += [
    case("cumprod", np.array([[1, 2, 3], [4, 0, 6]], dtype="int64"), attrs=dict(axis=1),
         torch=lambda x: torch().cumprod(x, 1)),
    case("cumprod_grad", RNG.standard_normal((3, 4)), ZEROS, attrs=dict(axis=1), torch=_cumprod_vjp),
]
WIDE = X * np.array([1.0, 300.0, -200.0, 1.0])  # exp overflows float64 near 710: log-space only
CUMULATIVE_LOG = [
    case("logcumsumexp", X, attrs=dict(axis=1), torch=lambda x: torch().logcumsumexp(x, 1)),
    case("logcumsumexp", X, attrs=dict(axis=0, reverse=True), torch=lambda x: torch().logcumsumexp(x.flip(0), 0).flip(0)),
    case("logcumsumexp", WIDE, attrs=dict(axis=-1), torch=lambda x: torch().logcumsumexp(x, -1), id="logcumsumexp-wide",
         extra=dict(second=False)),  # squares of values near 600: second-order finite differences are noise
    case("logcumsumexp", np.array(2.5), torch=lambda x: torch().logcumsumexp(x, 0)),
]
CASES += CUMULATIVE_LOG
NONDIFF += [
    case(name, v, attrs=dict(axis=ax), torch=lambda x, f=f, ax=ax: getattr(torch(), f)(x, ax).indices, id=f"{name}-{tag}-{ax}")
    for name, f in (("cumargmax", "cummax"), ("cumargmin", "cummin"))
    for tag, v in (("ties-nan", TIES), ("ints", np.array([[3, 1, 3, 2], [0, 5, 5, -1]], dtype="int64")),
                   ("bool", np.array([[False, True, False, True]])))
    for ax in (1, 0)
]
NONDIFF += [case("cumargmax", np.array(1.5), torch=lambda x: torch().cummax(x, 0).indices)]
NONDIFF += [  # distinct values: every target's choice is torch.topk's (ties: test_topk_breaks_ties_as_torch_topk_on_torch)
    case("topk_indices", X, attrs=dict(k=2), torch=lambda x: torch().topk(x, 2).indices),
    case("topk_indices", X, attrs=dict(k=2, axis=0, largest=False), torch=lambda x: torch().topk(x, 2, 0, largest=False).indices),
    case("topk_indices", np.array(1.5), attrs=dict(k=1), torch=lambda x: torch().topk(x, 1).indices),
]


def _torch_unique(x):
    values, inverse, counts = x.reshape(-1).unique(sorted=True, return_inverse=True, return_counts=True)
    return values, inverse.reshape(x.shape), counts


NONDIFF += [case("unique", np.array([[3, 1, 3], [2, 1, 5]]), torch=_torch_unique),
            case("unique", np.array([1.0, np.nan, 1.0, np.nan, -0.5]), torch=_torch_unique, id="unique-nans")]
ALL = CASES + CUMPROD + NONDIFF


@pytest.mark.parametrize("c", ALL, ids=repr)
def test_forward_and_vjp_match_torch(c):
    pytest.importorskip("torch")
    torch_check(c)


@pytest.mark.parametrize("c", CASES + CUMPROD, ids=repr)
def test_gradient_rule_matches_finite_differences(c):
    check_rule(c)


@pytest.mark.parametrize("c", CASES + CUMPROD, ids=repr)
def test_ad_pass_gradient(c):
    check_ad(c)


def test_cumprod_has_no_second_derivative_and_says_so():
    assert "second derivatives of cumprod" in pullback.ops.get_op("cumprod_grad").nondiff_reason


@pytest.mark.parametrize("c", [c for c in CASES if c.fd and c.extra.get("second", True)], ids=repr)  # ties: no FD
def test_second_order(c):
    sq = Case(c.op, c.inputs, lambda *xs: op.multiply(c.build(*xs), c.build(*xs)), wrt=c.wrt)
    check_second(sq)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("c", ALL, ids=repr)
def test_kernel_returns_inferred_dtype(c, dtype):
    dtype_check(c, dtype)


@pytest.mark.parametrize("c", [c for c in ALL if c.op != "nonzero" or c.inputs[0].ndim], ids=repr)
def test_kernel_on_every_namespace(c):
    check_namespaces(c, ("torch",) if c.op == "nonzero" else ("jax", "torch"))


def test_scatter_last_write_wins_and_zeroes_the_written_gradient():
    x = np.zeros((1, 3))
    c = case("scatter", x, np.array([[1, 1]]), np.array([[5.0, 7.0]]), attrs=dict(axis=1))
    got, _ = forward(c)
    np.testing.assert_array_equal(got, [[0.0, 7.0, 0.0]])
    from opgrad import rule_vjp

    gx, _, gu = rule_vjp(c, np.array([[1.0, 2.0, 3.0]]))
    np.testing.assert_array_equal(gx, [[1.0, 0.0, 3.0]])
    np.testing.assert_array_equal(gu, [[2.0, 2.0]])  # torch's rule: gather(g, index)


def test_nonzero_has_a_dynamic_first_dimension():
    x = pullback.var("x", shape=(2, 3))
    assert infer_expr(op.nonzero(x)).shape == (pullback.Any, 2)


def test_errors_name_the_op():
    x = pullback.var("x", shape=(2, 3))
    i = pullback.var("i", shape=(2, 3), dtype="int64")
    bad = [(op.cumsum(x, 2), "cumsum.*axis 2"), (op.cumsum(pullback.var("b", shape=(2,), dtype="bool")), "cumsum.*bool"),
           (op.argsort(x, 3), "argsort.*axis 3"), (op.scatter(x, x, x), "scatter.*integer"),
           (op.scatter(x, i, pullback.var("u", shape=(2, 2))), "scatter.*updates"),
           (op.scatter(x, pullback.var("j", shape=(3, 3), dtype="int64"), pullback.var("u", shape=(3, 3)), 1), "scatter.*exceeds")]
    for e, pattern in bad:
        with pytest.raises(TypeInferenceError, match=pattern):
            infer_expr(e)
    for make, pattern in [(lambda: op.cumsum(x, 1.5), "cumsum.*axis"), (lambda: op.argsort(x, 0, "yes"), "argsort.*descending"),
                          (lambda: op.scatter(x, i, x, axis=None), "scatter.*axis")]:
        with pytest.raises(AttrError, match=pattern):
            make()
    with pytest.raises(ExecutionError, match="scatter.*out of range"):
        forward(case("scatter", X, IDX + 3, UPD, attrs=dict(axis=1)))
    with pytest.raises(ExecutionError, match="scatter_reduce.*out of range"):
        forward(case("scatter_reduce", X, RIDX + 2, RUPD, attrs=dict(axis=1, reduce="amax")))
    with pytest.raises(AttrError, match="scatter_reduce.*reduce must be one of"):
        op.scatter_reduce(x, i, x, 1, "max")
    with pytest.raises(TypeInferenceError, match="scatter_reduce.*rank 1"):
        infer_expr(op.scatter_reduce(pullback.var("s", shape=()), pullback.var("k", shape=(), dtype="int64"),
                                     pullback.var("t", shape=())))


def test_an_unstable_argsort_leaves_ties_in_atens_order_on_torch():
    """``stable=False`` (what ``torch.sort`` asks for by default): on torch the permutation is ATen's, eager's own
    (it differs from the stable one at this size); elsewhere the stable one. The sorted values agree everywhere."""
    torch_ = pytest.importorskip("torch")
    keys = np.random.default_rng(3).integers(0, 4, 1024)
    x = pullback.var("x", shape=(1024,), dtype="int64")
    mod = pullback.IRModule.from_expr(pullback.Function([x], op.argsort(x, 0, False, False)))
    got = pullback.build(mod, target="torch")["main"](torch_.from_numpy(keys))
    want = torch_.sort(torch_.from_numpy(keys)).indices
    assert torch_.equal(got, want) and not torch_.equal(want, torch_.sort(torch_.from_numpy(keys), stable=True).indices)
    np.testing.assert_array_equal(pullback.build(mod)["main"](keys), np.argsort(keys, kind="stable"))
    with pytest.raises(AttrError, match="argsort.*stable"):
        op.argsort(x, 0, False, "no")


def test_topk_breaks_ties_as_torch_topk_on_torch():
    """Among equal values ``torch.topk`` chooses in its own order (not a stable sort's): on torch
    ``topk_indices`` is its result, so a bfloat16 router's tied experts are eager's choice; elsewhere ties go to
    the lower index. Every target picks values equal to the k largest."""
    torch_ = pytest.importorskip("torch")
    keys = np.random.default_rng(4).integers(0, 3, (64, 4)).astype("float32")
    x = pullback.var("x", shape=(64, 4))
    mod = pullback.IRModule.from_expr(pullback.Function([x], op.topk_indices(x, 2)))
    want = torch_.topk(torch_.from_numpy(keys), 2).indices
    assert torch_.equal(pullback.build(mod, target="torch")["main"](torch_.from_numpy(keys)), want)
    stable = pullback.build(mod)["main"](keys)
    np.testing.assert_array_equal(stable, np.argsort(-keys, axis=1, kind="stable")[:, :2])
    assert not np.array_equal(stable, want.numpy())  # the two tie rules differ on these rows
    np.testing.assert_array_equal(np.take_along_axis(keys, stable, 1), torch_.topk(torch_.from_numpy(keys), 2).values.numpy())
    with pytest.raises(TypeInferenceError, match="topk_indices.*k=5 exceeds"):
        infer_expr(op.topk_indices(x, 5))
    with pytest.raises(AttrError, match="k must be >= 0"):
        op.topk_indices(x, -1)


@pytest.mark.parametrize("target", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_logcumsumexp_in_half_precision_rounds_once_on_every_target(dtype, target):
    """A 64-long ``logcumsumexp`` of half-precision values, forward and reverse, within one rounding of float64's on
    the same inputs: accumulated in float32 on every target (jax scanned in bfloat16 itself, whole units off)."""
    if target != "numpy":
        pytest.importorskip(target)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    half = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    xs = np.random.default_rng(4).uniform(-3, 3, (2, 64)).astype(half)
    want = np.logaddexp.accumulate(xs.astype("float64"), axis=-1)
    for reverse in (False, True):
        x = pullback.var("x", shape=xs.shape, dtype=dtype)
        run = pullback.build(pullback.Function([x], op.logcumsumexp(x, axis=-1, reverse=reverse)), target=target)["main"]
        if target == "torch":
            import torch as t

            arg = t.from_numpy(xs.view(np.int16)).view(getattr(t, dtype))
            got = run(arg).float().numpy()
        else:
            got = np.asarray(run(xs)).astype("float64")
        ref = want if not reverse else np.flip(np.logaddexp.accumulate(np.flip(xs.astype("float64"), -1), axis=-1), -1)
        ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
        np.testing.assert_allclose(got, ref, rtol=2 * ulp, atol=0, err_msg=f"reverse={reverse}")
