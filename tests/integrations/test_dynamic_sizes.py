"""Sizes other than the batch that vary (a sequence length): ``dynamic_dims`` when importing, and the compiled
module's automatic dynamic sizes (``dynamic=None``: the second export makes the sizes that changed dynamic, as
``torch.compile`` does), each compared with eager PyTorch."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pullback as pb  # noqa: E402
from pullback.frontend import UnsupportedOperatorError, import_torch, main_inputs  # noqa: E402
from pullback.frontend.aten_table import ATEN_TABLE  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402


class Decoder(nn.Module):
    """A causal language model over token ids (B, T): learnt positions sliced to T, a padding mask read by
    advanced indexing, attention through sdpa (causal, and with a boolean mask: the math over dynamic lengths),
    a layer norm over the last two dimensions, a product of 4-D tensors, dropout, and a loss over the tokens
    rolled by one."""

    def __init__(self, d=8, vocab=11, heads=2):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(16, d))
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, vocab)
        self.norm = nn.LayerNorm((heads, d // heads))
        self.drop = nn.Dropout(0.25)

    def forward(self, ids, keep):
        b, t = ids.shape
        x = self.drop(self.tok(ids) + self.pos[:t])
        q, k, v = self.qkv(x).view(b, t, 3 * self.heads, -1).transpose(1, 2).chunk(3, dim=1)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        rows = torch.arange(b)[:, None]
        mask = keep[rows, torch.arange(t)[None]][:, None, None] & torch.ones(t, t, dtype=torch.bool).tril()
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        scores = (q @ k.transpose(-1, -2)).softmax(-1) @ v  # a product of (B, H, T, T) scores
        h = self.norm((causal + masked + scores).transpose(1, 2))  # (B, T, H, E) normalised over (H, E)
        logits = self.out(h.flatten(2))
        return F.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten())


def _batch(t, b=3, dtype=torch.int64):
    keep = torch.ones(b, t, dtype=torch.bool)
    keep[0, max(1, t // 2):] = False
    return torch.randint(0, 11, (b, t), dtype=dtype), keep


def test_import_with_a_dynamic_sequence_length_runs_every_length():
    torch.manual_seed(0)
    model = Decoder().double().eval()
    prog = import_torch(model, _batch(5), dynamic_dims=[(1,), (1,)])
    assert [tuple(p.type_annotation.shape) for p in prog.main.params[:2]] == [(3, pb.Any)] * 2
    attention = [n for n in pb.ir.traversal.post_order(prog.main.body)
                 if isinstance(n, pb.Call) and getattr(n.op, "name", None) == "nn.attention"]
    assert sorted(len(n.args) for n in attention) == [3, 4]  # causal; the padding mask as the kernel's bias
    exe = pb.build(prog.mod)["main"]
    for t in (2, 5, 9, 16):
        data = _batch(t)
        np.testing.assert_allclose(exe(*main_inputs(prog, data)), model(*data).item(), rtol=1e-12)


class HFCausal(nn.Module):
    """Attention under the causal mask as Hugging Face builds it over a dynamic length: ``kv_idx <= q_idx`` of two
    aranges (the queries' cache positions: the range plus 0 tokens seen), or'ed with a batch of False; ``padded``:
    and'ed with the keys' padding mask."""

    def __init__(self, d=8, heads=2, padded=False):
        super().__init__()
        self.heads, self.qkv, self.padded = heads, nn.Linear(d, 3 * d), padded
        self.tok = nn.Embedding(11, d)

    def forward(self, ids, keep):
        b, t = ids.shape
        q, k, v = self.qkv(self.tok(ids)).view(b, t, 3 * self.heads, -1).transpose(1, 2).chunk(3, dim=1)
        cache_position = torch.arange(t) + 0
        kv_idx = torch.arange(t)
        mask = (kv_idx[None, None, None, :] <= cache_position[None, None, :, None]) | torch.zeros(b, 1, 1, 1, dtype=torch.bool)
        if self.padded:  # a padded batch: the keys of padding masked too
            mask = mask & keep[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).square().mean()


@pytest.mark.parametrize("padded", [False, True])
def test_a_causal_mask_over_a_dynamic_length_is_flash_attentions_is_causal(padded):
    """The causal mask of a dynamic length cannot be evaluated to see what it keeps (``causal_mask`` folds
    constants); its two aranges are recognised instead: one ``nn.attention`` with ``is_causal`` and no bias (flash
    attention on torch), or the padding mask beside it as the bias, eager's values at every length."""
    torch.manual_seed(0)
    model = HFCausal(padded=padded).double()
    prog = import_torch(model, _batch(5), dynamic_dims=[(1,), (1,)])
    calls = [n for n in pb.ir.traversal.post_order(prog.main.body) if isinstance(n, pb.Call) and hasattr(n.op, "name")]
    (attention,) = [n for n in calls if n.op.name == "nn.attention"]
    assert attention.attrs.is_causal and len(attention.args) == (4 if padded else 3)
    assert not [n for n in calls if n.op.name in ("nn.softmax", "nn.batch_matmul")]
    for target in ("numpy", "torch"):
        exe = pb.build(prog.mod, target=target)["main"]
        for t in (1, 4, 9):
            data = _batch(t)
            np.testing.assert_allclose(np.asarray(exe(*main_inputs(prog, data))), model(*data).item(), rtol=1e-12)


def _train(model, lengths, seed_base=0, **options):
    """Train ``model`` compiled with ``options`` and a copy eagerly (SGD) on batches of the ``lengths``; the
    compiled module and the largest weight difference."""
    eager = copy.deepcopy(model)
    compiled = pb_compile(model, _batch(lengths[0]), **options)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, compiled)]
    for step, t in enumerate(lengths):
        data = _batch(t)
        losses = []
        for m, opt in zip((eager, compiled), opts):
            torch.manual_seed(seed_base + step)  # the same dropout masks
            loss = m(*data)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-10), t
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), eager.parameters()))
    return compiled, diff


def test_a_length_that_varies_is_dynamic_from_the_second_export(target):
    """The first shape is exported as it is; the second, of another length, with the length dynamic, and every
    later length runs that program (the first shape its own): two exports, training like eager (dropout masks
    drawn as eager draws them)."""
    torch.manual_seed(0)
    compiled, diff = _train(Decoder().double(), [5, 7, 3, 16, 2, 5], target=target)
    assert diff < 1e-12
    assert len(compiled._imports) == 2 and not compiled._fixed
    dynamic = [e for e in compiled._imports.values() if e.sizes is not None]
    assert [tuple(p.type_annotation.shape) for p in dynamic[0].prog.main.params[:2]] == [(3, pb.Any)] * 2
    for t, static in ((5, True), (6, False)):  # the first shape keeps its static program
        key, *_ = compiled._prepared(*compiled._flat(_batch(t), {}))
        assert (None not in key[4][0]) == static


def test_without_dynamic_sizes_each_length_is_exported():
    torch.manual_seed(0)
    compiled, diff = _train(Decoder().double(), [5, 7, 3, 7], dynamic=False)
    assert diff < 1e-12
    assert len(compiled._imports) == 3


class Branching(nn.Module):
    """A model that branches on the length: torch.export bounds the dynamic length to the side it traced."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 4).double()

    def forward(self, ids, keep):
        h = self.emb(ids) * keep[..., None]
        return (h * 2).sum() if ids.shape[1] > 6 else h.square().sum()


@pytest.mark.parametrize("lengths, exports", [([8, 10, 4, 5, 12, 9], 3), ([3, 4, 5, 2], 2)])
def test_a_length_beyond_the_range_an_export_holds_is_exported_again(lengths, exports):
    """Lengths 10 and 12 fit the dynamic export of 10 (torch bounds it to lengths over 6); 4 does not (another
    export, of the other branch, which 5 reuses)."""
    torch.manual_seed(0)
    compiled, diff = _train(Branching(), lengths)
    assert diff < 1e-12
    assert len(compiled._imports) == exports


def _fixing_slice(cx, x, dim=0, start=None, end=None, step=1):
    """The slice converter of an older release: it made ints of the bounds (fixing a dynamic length)."""
    return pb.op.strided_slice(x, (int(start or 0),), (int(end),), (step,), (dim,))


def test_a_converter_that_fixes_a_dynamic_size_is_reported(monkeypatch):
    """Comparing a symbolic size, or making an int of it, fixes it to the example's in torch's shape environment:
    the program would hold for that length alone. The importer names the operator and the size instead."""
    monkeypatch.setitem(ATEN_TABLE, "aten.slice.Tensor", _fixing_slice)
    torch.manual_seed(0)
    with pytest.raises(UnsupportedOperatorError, match=r"(?s)aten\.slice\.Tensor.*fixed a dynamic size \(dimension 1 of "
                                                       r"ids at 5\)"):
        import_torch(Decoder().eval(), _batch(5), dynamic_dims=[(1,), (1,)])


class Merged(nn.Module):
    """Rows of the batch and the sequence merged, then split again: not both of them can be dynamic (a reshape to
    two dynamic sizes from their product)."""

    def __init__(self):
        super().__init__()
        self.emb, self.lin = nn.Embedding(11, 4).double(), nn.Linear(4, 4).double()

    def forward(self, ids, keep):
        b, t = ids.shape
        h = self.lin(self.emb(ids).flatten(0, 1)).view(b, t, -1)
        return (h * keep[..., None]).square().mean()


def test_a_size_that_cannot_also_vary_keeps_the_others_dynamic():
    """Lengths vary (the second export makes the length dynamic); then the batch size changes, which this model
    cannot take dynamic with the length: the length stays dynamic, exported for the new batch size (two exports
    of dynamic lengths, one per batch size), every step eager's."""
    torch.manual_seed(0)
    model = Merged()
    eager = copy.deepcopy(model)
    compiled = pb_compile(model, _batch(5))
    for b, t in ((3, 5), (3, 7), (2, 6), (2, 9), (3, 4), (2, 3)):
        data = _batch(t, b)
        got, want = compiled(*data), eager(*data)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        got.backward()
        want.backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-15)
    (why,) = compiled._fixed.values()
    assert "needs static shapes" in why
    assert sorted(e.sizes is not None for e in compiled._imports.values()) == [False, True, True]


def test_a_program_that_cannot_take_the_length_dynamic_exports_each_length(monkeypatch):
    """With ``dynamic=None`` a dynamic export that fails is given up: each length is exported as before (and
    trains like eager); with ``dynamic=True`` the error is the user's."""
    monkeypatch.setitem(ATEN_TABLE, "aten.slice.Tensor", _fixing_slice)
    torch.manual_seed(0)
    compiled, diff = _train(Decoder().double(), [5, 7, 3, 7])
    assert diff < 1e-12
    assert len(compiled._imports) == 3
    (why,) = compiled._fixed.values()
    assert "fixed a dynamic size" in why
    with pytest.raises(UnsupportedOperatorError, match="fixed a dynamic size"):
        _train(Decoder().double(), [5, 7], dynamic=True)
