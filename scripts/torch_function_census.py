"""Import ~130 PyTorch functions one at a time through pullback and compare with eager (docs/torch.md).

    python scripts/torch_function_census.py                 # numpy target
    python scripts/torch_function_census.py --target torch cumprod median

Each case is a small module calling one function (losses, activations, linear algebra, special functions,
scans, indexing) on float64 inputs; it is compiled with ``pullback.integrations.torch.compile`` and its value and
input gradient (with a random cotangent) are compared with eager autograd: ``OK``, ``DIFF`` or the error. The
functions pullback does not convert yet are ``EXPECTED`` to fail, with the reason. Exits 1 on a ``DIFF`` or an
unexpected failure. This is how the gaps listed in docs/torch.md were found.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from pullback.testing import census

torch.manual_seed(0)


def X(*s):
    return torch.randn(*s, dtype=torch.float64)


def P(*s):  # positive
    return torch.rand(*s, dtype=torch.float64) + 0.1


def _written_through_as_strided(x, v):
    """A write through an ``as_strided`` view of a copy (exported as ``as_strided_scatter``; eager's own gradient of
    a direct ``torch.as_strided_scatter`` call w.r.t. its input is not the scatter's, 2.13)."""
    y = x.clone()
    y.as_strided((2, 2), (1, 4), 1).copy_(v)
    return y


def _adapt_selected_rows(x, mask):
    """``out[mask] = f(x[mask])``: a language adapter applied to the rows of one language (X-MOD)."""
    out = torch.zeros_like(x)
    out[mask] = torch.tanh(x[mask] * 2.0)
    return out + x


def _class_means(x, labels):
    """Per-class means of the rows of ``x`` through ``torch.unique`` (a prototype loss's centroids)."""
    classes, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    sums = torch.zeros(classes.shape[0], x.shape[1], dtype=x.dtype).index_add(0, inverse, x)
    return sums / counts[:, None]


def _with_nans(x):
    """NaN at (0, 1), (0, 3) and (2, 4); row 1 has none."""
    nan = torch.zeros_like(x)
    nan[0, 1] = nan[0, 3] = nan[2, 4] = float("nan")
    return x + nan


TARGET = torch.rand(3, 4, dtype=torch.float64)
SORTED = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
CASES = {
    "cumprod": (lambda x: torch.cumprod(x, 1), (X(3, 4),)),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), (X(3, 4),)),
    "cummax": (lambda x: torch.cummax(x, 1)[0], (X(3, 4),)),
    "cummin": (lambda x: torch.cummin(x, 0)[0] * torch.cummin(x, 0)[1], (X(3, 4),)),
    "logcumsumexp_wide": (lambda x: torch.logcumsumexp(x * 300.0, 0), (X(5, 2),)),
    "matrix_exp": (lambda x: torch.linalg.matrix_exp(x), (X(3, 3) * 0.3,)),
    "matrix_norm_fro": (lambda x: torch.linalg.matrix_norm(x), (X(3, 3),)),
    "matrix_norm_nuc": (lambda x: torch.linalg.matrix_norm(x, "nuc"), (X(3, 3),)),
    "linalg_norm": (lambda x: torch.linalg.norm(x), (X(3, 3),)),
    "kron": (lambda x: torch.kron(x, x), (X(2, 2),)),
    "einsum": (lambda x: torch.einsum("ij,jk->ik", x, x), (X(3, 3),)),
    "diff": (lambda x: torch.diff(x, dim=1), (X(3, 4),)),
    "trace": (lambda x: torch.trace(x), (X(3, 3),)),
    "diag_embed": (lambda x: torch.diag_embed(x), (X(3, 4),)),
    "block_diag": (lambda x: torch.block_diag(x, x), (X(2, 2),)),
    "cross": (lambda x: torch.linalg.cross(x, x.flip(0)), (X(2, 3),)),
    "nan_to_num": (lambda x: torch.nan_to_num(x), (X(3, 4),)),
    "logit": (lambda x: torch.logit(x, eps=1e-6), (P(3, 4) * 0.8,)),
    "xlogy": (lambda x: torch.xlogy(x, x + 1), (P(3, 4),)),
    "special_xlog1py": (lambda x: torch.special.xlog1py(x, x), (P(3, 4),)),
    "i0": (lambda x: torch.i0(x), (X(3, 4),)),
    "special_i0e": (lambda x: torch.special.i0e(x), (X(3, 4),)),
    "special_i1": (lambda x: torch.special.i1(x), (X(3, 4),)),
    "sinc": (lambda x: torch.sinc(x), (X(3, 4),)),
    "hypot": (lambda x: torch.hypot(x, x * 2), (X(3, 4),)),
    "copysign": (lambda x: torch.copysign(x, -x), (X(3, 4),)),
    "lerp": (lambda x: torch.lerp(x, x * 2, 0.3), (X(3, 4),)),
    "addcmul": (lambda x: torch.addcmul(x, x, x, value=0.5), (X(3, 4),)),
    "renorm": (lambda x: torch.renorm(x, 2, 0, 1.0), (X(3, 4),)),
    "rot90": (lambda x: torch.rot90(x, 1, (0, 1)), (X(3, 4),)),
    "roll": (lambda x: torch.roll(x, 1, 1), (X(3, 4),)),
    "trapezoid": (lambda x: torch.trapezoid(x, dim=1), (X(3, 4),)),
    "std_mean": (lambda x: torch.std_mean(x, 1)[0], (X(3, 4),)),
    "aminmax": (lambda x: torch.aminmax(x, dim=1)[0], (X(3, 4),)),
    "nanmean": (lambda x: torch.nanmean(x, 1), (X(3, 4),)),
    "nansum": (lambda x: torch.nansum(x, 1), (X(3, 4),)),
    "median": (lambda x: torch.median(x, 1)[0], (X(3, 5),)),
    "quantile": (lambda x: torch.quantile(x, 0.3, dim=1), (X(3, 5),)),
    "kthvalue": (lambda x: torch.kthvalue(x, 2, 1)[0], (X(3, 5),)),
    "logaddexp": (lambda x: torch.logaddexp(x, x * 2), (X(3, 4),)),
    "cosine_similarity": (lambda x: F.cosine_similarity(x, x.flip(0)), (X(3, 4),)),
    "pixel_shuffle": (lambda x: F.pixel_shuffle(x, 2), (X(1, 8, 3, 3),)),
    "pixel_unshuffle": (lambda x: F.pixel_unshuffle(x, 2), (X(1, 2, 4, 4),)),
    "channel_shuffle": (lambda x: F.channel_shuffle(x, 2), (X(1, 4, 3, 3),)),
    "affine_grid": (lambda x: F.affine_grid(x, (1, 1, 4, 4), align_corners=False), (X(1, 2, 3),)),
    "bicubic": (lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), (X(1, 2, 4, 4),)),
    "ctc_loss": (lambda x: F.ctc_loss(x.log_softmax(2), torch.tensor([[1, 2]]), torch.tensor([5]), torch.tensor([2])),
                 (X(5, 1, 4),)),
    "multi_margin": (lambda x: F.multi_margin_loss(x, torch.tensor([0, 1, 2])), (X(3, 4),)),
    "poisson_nll": (lambda x: F.poisson_nll_loss(x, x.abs()), (X(3, 4),)),
    "kl_div": (lambda x: F.kl_div(x.log_softmax(1), x.softmax(1).flip(0), reduction="batchmean"), (X(3, 4),)),
    "huber": (lambda x: F.huber_loss(x, x.flip(0)), (X(3, 4),)),
    "smooth_l1": (lambda x: F.smooth_l1_loss(x, x.flip(0)), (X(3, 4),)),
    "soft_margin": (lambda x: F.soft_margin_loss(x, torch.ones(3, 4, dtype=torch.float64)), (X(3, 4),)),
    "hinge_embedding": (lambda x: F.hinge_embedding_loss(x, torch.ones(3, 4, dtype=torch.float64)), (X(3, 4),)),
    "triplet": (lambda x: F.triplet_margin_loss(x, x.flip(0), x * 2), (X(3, 4),)),
    "cosine_embedding": (lambda x: F.cosine_embedding_loss(x, x.flip(0), torch.tensor([1, -1, 1])), (X(3, 4),)),
    "margin_ranking": (lambda x: F.margin_ranking_loss(x[0], x[1], torch.ones(4)), (X(2, 4),)),
    "local_response_norm": (lambda x: F.local_response_norm(x, 2), (X(1, 4, 3, 3),)),
    "instance_norm": (lambda x: F.instance_norm(x), (X(2, 4, 3, 3),)),
    "rms_norm": (lambda x: F.rms_norm(x, (4,)), (X(3, 4),)),
    "bce_logits": (lambda x: F.binary_cross_entropy_with_logits(x, TARGET), (X(3, 4),)),
    "bce": (lambda x: F.binary_cross_entropy(torch.sigmoid(x), TARGET), (X(3, 4),)),
    "glu": (lambda x: F.glu(x, 1), (X(3, 4),)),
    "hardswish": (lambda x: F.hardswish(x), (X(3, 4),)),
    "mish": (lambda x: F.mish(x), (X(3, 4),)),
    "selu": (lambda x: F.selu(x), (X(3, 4),)),
    "celu": (lambda x: F.celu(x), (X(3, 4),)),
    "softsign": (lambda x: F.softsign(x), (X(3, 4),)),
    "tanhshrink": (lambda x: F.tanhshrink(x), (X(3, 4),)),
    "softshrink": (lambda x: F.softshrink(x), (X(3, 4),)),
    "hardshrink": (lambda x: F.hardshrink(x), (X(3, 4),)),
    "rrelu_eval": (lambda x: F.rrelu(x, training=False), (X(3, 4),)),
    "prelu": (lambda x: F.prelu(x, torch.tensor([0.25], dtype=torch.float64)), (X(3, 4),)),
    "logsigmoid": (lambda x: F.logsigmoid(x), (X(3, 4),)),
    "softmin": (lambda x: F.softmin(x, 1), (X(3, 4),)),
    "searchsorted": (lambda x: x * torch.searchsorted(SORTED, x.detach()), (X(3, 4),)),
    "bucketize": (lambda x: x * torch.bucketize(x.detach(), SORTED[:2]), (X(3, 4),)),
    "max_unpool": (lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2), (X(1, 1, 4, 4),)),
    "adaptive_max_pool": (lambda x: F.adaptive_max_pool2d(x, 2), (X(1, 2, 4, 4),)),
    "lp_pool": (lambda x: F.lp_pool2d(x, 2, 2), (X(1, 2, 4, 4),)),
    "conv1d_same": (lambda x: F.conv1d(x, torch.ones(2, 2, 3, dtype=torch.float64), padding="same"), (X(1, 2, 5),)),
    "atleast_3d": (lambda x: torch.atleast_3d(x).sum(), (X(3, 4),)),
    "cdist_p1": (lambda x: torch.cdist(x, x.flip(0), p=1), (X(3, 4),)),
    "frac": (lambda x: torch.frac(x), (X(3, 4),)),
    "fmax": (lambda x: torch.fmax(x, x.flip(0)), (X(3, 4),)),
    "clamp_tensor": (lambda x: torch.clamp(x, min=x.flip(0)), (X(3, 4),)),
    "cholesky_inverse": (lambda x: torch.cholesky_inverse(torch.linalg.cholesky(x @ x.T + torch.eye(3, dtype=x.dtype))),
                         (X(3, 3),)),
    "eigvalsh": (lambda x: torch.linalg.eigvalsh(x + x.T), (X(3, 3),)),
    "qr": (lambda x: torch.linalg.qr(x)[0], (X(3, 3),)),
    "svdvals": (lambda x: torch.linalg.svdvals(x), (X(3, 3),)),
    "lstsq": (lambda x: torch.linalg.lstsq(x, x[:, :1]).solution, (X(3, 3),)),
    "pinv": (lambda x: torch.linalg.pinv(x), (X(3, 3),)),
    "matrix_power": (lambda x: torch.linalg.matrix_power(x, 3), (X(3, 3),)),
    "embedding_max_norm": (lambda x: F.embedding(torch.tensor([0, 1]), x, max_norm=1.0), (X(3, 4),)),
    "one_hot": (lambda x: x * F.one_hot(torch.tensor([0, 1, 2]), 4), (X(3, 4),)),
    "masked_fill": (lambda x: x.masked_fill(x > 0, 0.0), (X(3, 4),)),
    "index_add": (lambda x: torch.zeros(2, 4, dtype=torch.float64).index_add(0, torch.tensor([0, 1, 0]), x), (X(3, 4),)),
    "put": (lambda x: x.flatten().put(torch.tensor([0, 3]), torch.tensor([1.0, 2.0], dtype=torch.float64)), (X(3, 4),)),
    "take": (lambda x: torch.take(x, torch.tensor([0, 5])), (X(3, 4),)),
    "take_along_dim": (lambda x: torch.take_along_dim(x, torch.tensor([[0], [1], [2]]), 1), (X(3, 4),)),
    "count_nonzero": (lambda x: x * torch.count_nonzero(x > 0), (X(3, 4),)),
    "signbit": (lambda x: x * torch.signbit(x), (X(3, 4),)),
    "isclose": (lambda x: x * torch.isclose(x, x), (X(3, 4),)),
    "cov": (lambda x: torch.cov(x), (X(3, 4),)),
    "corrcoef": (lambda x: torch.corrcoef(x), (X(3, 4),)),
    "vander": (lambda x: torch.linalg.vander(x[0]), (X(3, 4),)),
    "tensordot": (lambda x: torch.tensordot(x, x, dims=([1], [1])), (X(3, 4),)),
    "outer": (lambda x: torch.outer(x[0], x[1]), (X(3, 4),)),
    "baddbmm": (lambda x: torch.baddbmm(x[None], x[None], x.T[None]), (X(3, 3),)),
    "multi_dot": (lambda x: torch.linalg.multi_dot([x, x.T, x]), (X(3, 4),)),
    "bilinear": (lambda x: F.bilinear(x, x, torch.ones(2, 4, 4, dtype=torch.float64)), (X(3, 4),)),
    "dist": (lambda x: torch.dist(x, x.flip(0)), (X(3, 4),)),
    "logspace": (lambda x: x * torch.logspace(0, 1, 4, dtype=torch.float64), (X(3, 4),)),
    "heaviside": (lambda x: x * torch.heaviside(x.detach(), torch.tensor(0.5, dtype=torch.float64)), (X(3, 4),)),
    "addmv": (lambda x: torch.addmv(x[0, :3], x[:, :3], x[1, :3], beta=0.5, alpha=2.0), (X(3, 4),)),
    "addbmm": (lambda x: torch.addbmm(x[:, :3], x[None].expand(2, 3, 4), x.T[None].expand(2, 4, 3) * 0.5, alpha=2.0),
               (X(3, 4),)),
    "view_copy": (lambda x: torch.view_copy(x, (4, 3)), (X(3, 4),)),
    "permute_copy": (lambda x: torch.permute_copy(x, (1, 0)), (X(3, 4),)),
    "narrow": (lambda x: torch.narrow(x, 1, 1, 2) * torch.narrow_copy(x, 0, 1, 2)[:1, 1:3], (X(3, 4),)),
    "diagonal_scatter": (lambda x: torch.diagonal_scatter(x, x[0, :3] * 2.0, 1), (X(3, 4),)),
    "fill_diagonal": (lambda x: (x @ x.T).fill_diagonal_(-5.0).softmax(-1), (X(3, 4),)),
    "diagonal_copy_": (lambda x: torch.diagonal(x.clone(), 0, 0, 1).copy_(x[1, :3]).sum() * x, (X(3, 4),)),
    "masked_select": (lambda x: torch.masked_select(x, x > 0) * 2.0, (X(3, 4),)),
    "as_strided_write": (lambda x: _written_through_as_strided(x, x[:2, :2] * 3.0), (X(3, 4),)),
    "gumbel_softmax": (lambda x: F.gumbel_softmax(x, tau=0.5), (X(3, 4),)),
    "gumbel_softmax_hard": (lambda x: F.gumbel_softmax(x, tau=0.5, hard=True) * x, (X(3, 4),)),
    "uniform_": (lambda x: x * torch.empty_like(x).uniform_(-2.0, 3.0), (X(3, 4),)),
    "samplers_": (lambda x: x * (torch.empty_like(x).cauchy_() + torch.empty_like(x).log_normal_(0.5, 0.25)
                                 + torch.empty_like(x).geometric_(0.3) + torch.empty_like(x.T).exponential_(2.0).T), (X(3, 4),)),
    "median_nan": (lambda x: x * torch.median(_with_nans(x), 1, keepdim=True).indices + torch.median(x[1]), (X(3, 5),)),
    "nanmedian": (lambda x: torch.nanmedian(_with_nans(x), 1).values * torch.nanmedian(_with_nans(x)), (X(3, 5),)),
    "nanmedian_indices": (lambda x: x * torch.nanmedian(_with_nans(x), 1, keepdim=True).indices, (X(3, 5),)),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, (2, 3)), (X(2, 3, 5, 7),)),
    "adaptive_max_pool2d_indices": (lambda x: x[..., :3, :2] * F.adaptive_max_pool2d(x, (3, 2), return_indices=True)[1],
                                    (X(2, 3, 5, 7),)),
    "adaptive_max_pool1d": (lambda x: F.adaptive_max_pool1d(x, 4), (X(2, 3, 7),)),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, (2, 3, 2)) * F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True)[1],
                            (X(1, 2, 3, 5, 4),)),
    "grid_sample_3d": (lambda x, g: F.grid_sample(x, g, align_corners=False), (X(2, 3, 4, 5, 6), X(2, 3, 2, 4, 3) * 0.7)),
    "grid_sample_3d_border": (lambda x, g: F.grid_sample(x, g, padding_mode="border", align_corners=True),
                              (X(1, 2, 3, 4, 5), X(1, 2, 3, 2, 3) * 0.8)),
    "grid_sample_3d_reflection": (lambda x, g: F.grid_sample(x, g, padding_mode="reflection"),
                                  (X(1, 2, 3, 4, 5), X(1, 2, 3, 2, 3) * 0.9)),
    "grid_sample_3d_nearest": (lambda x, g: F.grid_sample(x, g, mode="nearest") * g.sum(), (X(1, 2, 3, 4, 5), X(1, 2, 3, 2, 3))),
    "put_accumulate": (lambda x: x.put(torch.tensor([0, -2, 0]), x[0, :3] * 3.0, accumulate=True), (X(3, 4),)),
    "rrelu_train": (lambda x: F.rrelu(x, training=True), (X(3, 4),)),
    "index_reduce": (lambda x: x.index_reduce(0, torch.tensor([0, 2, 0]), x.flip(0) * 2.0, "amax")
                     + x.index_reduce(1, torch.tensor([1, 1, 3, 0]), x.exp(), "mean", include_self=False)
                     + x.index_reduce(0, torch.tensor([2, 1, 2]), x.flip(1), "prod"), (X(3, 4),)),
    "triangular_solve": (lambda x: torch.triangular_solve(x[:, :2], x[:, :3].triu() + 3 * torch.eye(3, dtype=x.dtype))[0]
                         + torch.triangular_solve(x[:, 1:3], x[:, 1:].tril() + 3 * torch.eye(3, dtype=x.dtype),
                                                  upper=False, transpose=True)[0], (X(3, 4),)),
    "unique": (lambda x: x * torch.unique(torch.tensor([[3, 1, 3], [2, 1, 5]]))[:1].sum(), (X(3, 4),)),
    "unique_inverse_counts": (lambda x: _class_means(x, torch.tensor([2, 0, 2])), (X(3, 4),)),
    "masked_rows_written": (lambda x: _adapt_selected_rows(x, x[:, 0] > 0), (X(5, 4),)),
    "complex": (lambda x: torch.view_as_real(torch.complex(x, x.flip(0)[:1]) * (1 + 2j)), (X(3, 4),)),
    "angle": (lambda x: torch.angle(torch.complex(x, x.flip(0))) + torch.angle(x), (X(3, 4),)),
    # float exponents: with integer ones eager's gradient w.r.t. x is 2 ** e in integers (0 where e < 0, torch 2.13)
    "ldexp": (lambda x: torch.ldexp(x, torch.tensor([[1.0, -2.0, 3.0, 0.0]], dtype=x.dtype)), (X(3, 4),)),
    "polar": (lambda x: torch.view_as_real(torch.polar(x.abs(), x)), (X(3, 4),)),
    "erfinv": (lambda x: torch.erfinv(x), (P(3, 4) * 0.8,)),
    "special_ndtri": (lambda x: torch.special.ndtri(x), (P(3, 4) * 0.8,)),
    "special_log_ndtr": (lambda x: torch.special.log_ndtr(x), (X(3, 4),)),
    "special_entr": (lambda x: torch.special.entr(x), (P(3, 4),)),
    "mvlgamma": (lambda x: torch.mvlgamma(x + 2, 2), (P(3, 4),)),
    "gammainc": (lambda x: torch.special.gammainc(x, x + 1), (P(3, 4),)),
}
EXPECTED = {
    "rrelu_train": "refused: eager draws one slope per negative entry (a data-dependent number of draws)",
    "gammainc": "not converted yet (aten.igamma)",
    "ctc_loss": "torch.export: its result's shape depends on the target lengths' values",
    "lstsq": "torch.export: data-dependent output shapes (rank, residuals)",
    "cov": "torch.export: a data-dependent aten.equal check",
    "corrcoef": "torch.export: a data-dependent aten.equal check",
}

# results whose length depends on the data: the jax target (jax.jit, static shapes) says so and names the others
EXPECTED_ON = {"jax": {name: "a data-dependent length: run on the numpy or torch target"
                       for name in ("masked_select", "unique", "unique_inverse_counts", "masked_rows_written")}}


class Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def check(name: str, target: str) -> str:
    """``OK``, ``DIFF: ...`` or ``ERROR: ...`` for one case."""
    from pullback.integrations.torch import compile as pb_compile

    fn, args = CASES[name]

    def input_gradients(out, ref, xs, ys):
        ct = torch.randn_like(ref)
        xs, ys = ([a for a in v if a.requires_grad] for v in (xs, ys))
        census.assert_same_gradients(torch.autograd.grad(out, xs, ct, allow_unused=True),
                                     torch.autograd.grad(ref, ys, ct, allow_unused=True), rtol=1e-8, atol=1e-10)

    return census.side_by_side(lambda: pb_compile(Call(fn), args, target=target), fn, args, input_gradients)


if __name__ == "__main__":
    sys.exit(census.main(__doc__, CASES, EXPECTED, check, "functions", 22, EXPECTED_ON))
