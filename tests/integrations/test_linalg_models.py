"""Models built on torch.linalg (Cholesky, triangular and general solves, inverses, log-determinants) train
through ``pullback.integrations.torch.compile`` exactly like eager: a module calling every converted linalg
operator, a Glow-style invertible 1x1 convolution (a flow's log-determinant), and a Gaussian process's
marginal likelihood; float64 against eager autograd."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from pullback.integrations.torch import compile as pb_compile  # noqa: E402
from pullback.ir.errors import PullbackError  # noqa: E402

TOL = dict(rtol=1e-10, atol=1e-12)


class EveryLinalgOp(nn.Module):
    """Each converted overload once: cholesky (lower, upper), solve_triangular (left, right), solve (matrix and
    vector right-hand sides, left=False, broadcast batch axes), inv, slogdet, det, logdet, cholesky_solve."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

    def forward(self, a, b):
        eye = torch.eye(4, dtype=a.dtype)
        s = a @ a.mT + 3 * eye + self.w @ self.w.T
        low, up = torch.linalg.cholesky(s), torch.linalg.cholesky(s, upper=True)
        terms = [
            torch.linalg.solve_triangular(low, b, upper=False),
            torch.linalg.solve_triangular(up, b.mT, upper=True, left=False),
            torch.linalg.solve_triangular(up[0], b, upper=True, unitriangular=True),  # batch axes broadcast
            torch.linalg.solve(s, b), torch.linalg.solve(s, b[..., 0]), torch.linalg.solve(s[0], b.mT, left=False),
            torch.linalg.inv(s), torch.cholesky_solve(b, low), torch.cholesky_solve(b, up, upper=True),
        ]
        sign, logabsdet = torch.linalg.slogdet(s - 4 * eye)
        dets = [sign * logabsdet, torch.linalg.det(s) * 1e-3, torch.logdet(s)]
        return sum(t.square().sum() for t in terms) + sum(d.sum() for d in dets)


def _train_like_eager(model, inputs, target, steps=1, lr=0.0):
    """Losses, parameter gradients and input gradients of ``steps`` SGD steps, compiled vs eager."""
    eager = copy.deepcopy(model)
    cm = pb_compile(model, inputs, target=target)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=lr), torch.optim.SGD(eager.parameters(), lr=lr)
    for _ in range(steps):
        xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        ref_xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        out, ref = cm(*xs), eager(*ref_xs)
        out.backward()
        ref.backward()
        torch.testing.assert_close(out, ref, **TOL)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL)
        for x, y in zip(xs, ref_xs):
            if x.grad is not None or y.grad is not None:
                torch.testing.assert_close(x.grad, y.grad, **TOL)
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()


def test_every_linalg_operator_trains_like_eager(target):
    torch.manual_seed(0)
    a, b = torch.randn(2, 4, 4, dtype=torch.float64), torch.randn(2, 4, 3, dtype=torch.float64)
    _train_like_eager(EveryLinalgOp(), (a, b), target)


class InvertibleConv(nn.Module):
    """Glow's invertible 1x1 convolution and its log-determinant, then a Gaussian prior: a flow's loss."""

    def __init__(self, c):
        super().__init__()
        q, _ = torch.linalg.qr(torch.randn(c, c, dtype=torch.float64))
        self.weight = nn.Parameter(q)

    def forward(self, x):
        n, c, h, w = x.shape
        z = nn.functional.conv2d(x, self.weight.view(c, c, 1, 1))
        logdet = h * w * torch.linalg.slogdet(self.weight)[1]
        return (0.5 * z.square().sum() - n * logdet) / x.numel()


def test_invertible_one_by_one_convolution_trains_like_eager(target):
    torch.manual_seed(1)
    _train_like_eager(InvertibleConv(6), (torch.randn(3, 6, 5, 5, dtype=torch.float64),), target, steps=3, lr=0.1)


class DeltaRuleChunk(nn.Module):
    """The unit-triangular solve of a gated delta rule (Qwen3-Next, Qwen3.5) as Hugging Face writes it for
    torch.export: forward substitution, one row of the matrix overwritten per step (``u[..., i, :i] = ...``), each
    step reading rows the earlier steps wrote; then the solve applied to values."""

    def __init__(self, d, chunk):
        super().__init__()
        self.k = nn.Linear(d, d, dtype=torch.float64)
        self.chunk = chunk

    def forward(self, x, v):
        k = nn.functional.normalize(self.k(x), dim=-1)
        u = -(k @ k.mT * 0.5).tril(-1)
        for i in range(1, self.chunk):
            row = u[..., i, :i].clone()
            sub = u[..., :i, :i].clone()
            u[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
        u = u + torch.eye(self.chunk, dtype=u.dtype)
        return ((u @ v) ** 2).sum()


def test_a_forward_substitution_writing_rows_in_place_trains_like_eager(target):
    """The rows the forward saves for the backward are read before later steps overwrite the matrix in place
    (the torch target writes every row into one buffer): losses and gradients are eager's."""
    torch.manual_seed(2)
    x, v = torch.randn(2, 3, 8, 5, dtype=torch.float64), torch.randn(2, 3, 8, 4, dtype=torch.float64)
    _train_like_eager(DeltaRuleChunk(5, 8), (x, v), target, steps=2, lr=0.1)


class GaussianProcess(nn.Module):
    """The negative log marginal likelihood of GP regression with an RBF kernel, by Cholesky."""

    def __init__(self):
        super().__init__()
        self.log_lengthscale = nn.Parameter(torch.zeros((), dtype=torch.float64))
        self.log_noise = nn.Parameter(torch.tensor(-2.0, dtype=torch.float64))

    def forward(self, x, y):
        d2 = (x[:, None, :] - x[None, :, :]).square().sum(-1)
        k = torch.exp(-0.5 * d2 / torch.exp(2 * self.log_lengthscale))
        k = k + torch.exp(self.log_noise) * torch.eye(x.shape[0], dtype=x.dtype)
        low = torch.linalg.cholesky(k)
        alpha = torch.cholesky_solve(y[:, None], low)
        return 0.5 * (y[:, None] * alpha).sum() + torch.log(torch.diagonal(low)).sum()


def test_gaussian_process_marginal_likelihood_trains_like_eager(target):
    torch.manual_seed(2)
    x = torch.rand(12, 2, dtype=torch.float64) * 4
    y = torch.sin(x.sum(1)) + 0.1 * torch.randn(12, dtype=torch.float64)
    _train_like_eager(GaussianProcess(), (x, y), target, steps=3, lr=0.05)


class CholeskyEx(nn.Module):
    def forward(self, a):
        low, info = torch.linalg.cholesky_ex(a)
        return low.sum() + info.sum()


def test_a_matrix_that_is_not_positive_definite_is_an_error_as_in_eager():
    """``info`` is 0 when the factorization succeeds; where eager raises, so does the compiled module."""
    good = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    cm = pb_compile(CholeskyEx(), (good,), target="numpy")
    torch.testing.assert_close(cm(good), CholeskyEx()(good), **TOL)
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(bad)
    with pytest.raises(PullbackError, match="cholesky.*not positive definite"):
        cm(bad)


class LogDet(nn.Module):
    def forward(self, a):
        return torch.logdet(a @ a.mT + torch.eye(3, dtype=a.dtype)) + torch.linalg.inv(a + 3 * torch.eye(3, dtype=a.dtype)).sum()


def test_hessian_of_a_log_determinant_through_compile_matches_eager():
    torch.manual_seed(3)
    a = torch.randn(3, 3, dtype=torch.float64)
    cm = pb_compile(LogDet(), (a,), target="numpy")
    got = torch.autograd.functional.hessian(cm, a)
    want = torch.autograd.functional.hessian(LogDet(), a)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


class OrthogonalNet(nn.Module):
    """Layers kept orthogonal by ``nn.utils.parametrizations.orthogonal``: a square one through each map
    (``matrix_exp``, ``cayley``, ``householder``) and a tall one through Householder reflectors."""

    def __init__(self):
        super().__init__()
        orth = nn.utils.parametrizations.orthogonal
        self.square = nn.ModuleList(orth(nn.Linear(5, 5).double(), orthogonal_map=m)
                                    for m in ("matrix_exp", "cayley", "householder"))
        self.tall = orth(nn.Linear(5, 7).double(), orthogonal_map="householder")

    def forward(self, x):
        for layer in self.square:
            x = torch.tanh(layer(x))
        return self.tall(x).square().mean()


def test_orthogonal_parametrizations_train_like_eager(target):
    torch.manual_seed(4)
    _train_like_eager(OrthogonalNet(), (torch.randn(6, 5, dtype=torch.float64),), target, steps=3, lr=0.1)


class SpectralPenalty(nn.Module):
    """A loss on a weight's spectrum and eigenvector projections (signs cancel in the squares): eigvalsh's
    largest eigenvalue of ``W^T W`` and eigh's eigenvectors, UPLO lower and upper."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 4, dtype=torch.float64))

    def forward(self, x):
        gram = self.weight.T @ self.weight + torch.eye(4, dtype=x.dtype)
        top = torch.linalg.eigvalsh(gram)[-1]
        w, v = torch.linalg.eigh(gram, UPLO="U")
        proj = (x @ v).square() * w
        return (x @ self.weight.T).square().mean() + 0.1 * top + proj.mean()


def test_spectral_losses_train_like_eager(target):
    torch.manual_seed(5)
    _train_like_eager(SpectralPenalty(), (torch.randn(6, 4, dtype=torch.float64),), target, steps=3, lr=0.05)


class LowRank(nn.Module):
    """Singular values and vectors in a loss: a nuclear-norm regularizer, the spectral norm, a least-squares
    fit by the pseudo-inverse, and a reconstruction from the top singular pair (signs cancel in the product)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4, dtype=torch.float64))

    def forward(self, x, y):
        u, s, vh = torch.linalg.svd(self.weight, full_matrices=False)
        top = s[0] * u[:, :1] @ vh[:1]
        fit = torch.linalg.pinv(x) @ y
        return (torch.linalg.matrix_norm(self.weight, "nuc") + torch.linalg.matrix_norm(self.weight, 2)
                + (x @ top.T).square().mean() + (self.weight[:4] - fit).square().sum() + torch.linalg.svdvals(x).sum())


def test_svd_losses_train_like_eager(target):
    torch.manual_seed(6)
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)
    _train_like_eager(LowRank(), (x, y), target, steps=3, lr=0.02)


class FullSVD(nn.Module):
    def forward(self, a):
        u, s, vh = torch.linalg.svd(a)  # full_matrices=True: U is 5x5 for a 5x3 matrix
        return u.sum() + s.sum()


def test_full_singular_vectors_of_a_non_square_matrix_are_refused_with_the_fix():
    with pytest.raises(PullbackError, match=r"full_matrices=True of a 5x3 matrix.*full_matrices=False"):
        pb_compile(FullSVD(), (torch.randn(5, 3, dtype=torch.float64),), target="numpy")(torch.randn(5, 3, dtype=torch.float64))


class QROrthogonal(nn.Module):
    """A layer whose weight is the Q factor of a parameter (orthonormal columns), and R's log-diagonal."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4, dtype=torch.float64))

    def forward(self, x):
        q, r = torch.linalg.qr(self.weight)
        return (x @ q.T).tanh().square().mean() + torch.diagonal(r).abs().log().sum() * 0.1


def test_qr_losses_train_like_eager(target):
    torch.manual_seed(7)
    _train_like_eager(QROrthogonal(), (torch.randn(5, 4, dtype=torch.float64),), target, steps=3, lr=0.1)
