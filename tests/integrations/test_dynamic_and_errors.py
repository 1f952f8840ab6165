"""Dynamic batch (``dynamic_batch=True``, ``torch.compile(dynamic=True)``) and the one error for missing operators."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import pullback as pb  # noqa: E402
from pullback.frontend import UnsupportedOperatorError, from_torch, import_torch, main_inputs  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                 nn.Dropout(0.2), nn.Linear(4 * 4 * 4, 3))

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def _data(b):
    return torch.randn(b, 3, 8, 8), torch.randint(0, 3, (b,))


def test_from_torch_dynamic_batch_gives_main_a_dynamic_batch_dimension():
    torch.manual_seed(0)
    model = CNN().eval()
    mod, params = from_torch(model, _data(4), dynamic_batch=True)
    assert [p.type_annotation.shape[0] for p in mod["main"].params[:2]] == [pb.Any, pb.Any]
    exe = pb.build(mod)["main"]
    prog = import_torch(model, _data(4), dynamic_batch=True)
    for b in (2, 3, 7):
        x, y = _data(b)
        np.testing.assert_allclose(exe(*main_inputs(prog, [x, y])), model(x, y).item(), rtol=1e-5)


def test_compile_with_dynamic_batch_builds_one_program_for_every_batch_size(target):
    torch.manual_seed(0)
    model = CNN()
    eager = copy.deepcopy(model)
    cm = pb_compile(model, _data(4), dynamic_batch=True, target=target)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, cm)]
    for step, b in enumerate((4, 2, 6, 3)):
        x, y = _data(b)
        losses = []
        for m, opt in zip((eager, cm), opts):
            torch.manual_seed(step)
            loss = m(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert len(cm._programs) == 1
    for a, b in zip(eager.state_dict().values(), model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class BatchBranch(nn.Module):
    """diffusers' Upsample2D: ``if x.shape[0] >= 64`` (there a ``.contiguous()``; here a change of values)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        if x.shape[0] >= 64:
            x = x * 2
        return F.interpolate(self.conv(x), scale_factor=2.0, mode="nearest").square().mean()


def test_dynamic_batch_of_a_model_branching_on_the_batch_size_exports_once_per_range():
    """torch.export cannot give such a model one batch dimension of every size: an export for the batch sizes below
    64, one for those from 64, one for a batch of 1 (torch specialises 1); each trains like eager."""
    torch.manual_seed(0)
    model = BatchBranch().double()
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (torch.randn(2, 3, 4, 4, dtype=torch.float64),), dynamic_batch=True)
    for b, imports in ((2, 1), (63, 1), (64, 2), (100, 2), (5, 2), (1, 3), (1, 3)):
        x = torch.randn(b, 3, 4, 4, dtype=torch.float64)
        got, want = cm(x), eager(x)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        got.backward()
        want.backward()
        torch.testing.assert_close(model.conv.weight.grad, eager.conv.weight.grad, rtol=1e-12, atol=0)
        assert len(cm._imports) == imports, b
    assert sorted(e.batches for e in cm._imports.values()) == [(1, 1), (2, 63), (64, None)]


class SlicedTable(nn.Module):
    """A learnt table sliced to the batch size (``table[:b]``, ``table[1:b + 1]``): slices whose ends are symbolic."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(64, 3, dtype=torch.float64))
        self.lin = nn.Linear(3, 3).double()

    def forward(self, x):
        b = x.shape[0]
        return self.lin(x * self.table[:b] + self.table[1:b + 1].tanh()).square().mean()


def test_slices_to_the_batch_size_keep_the_batch_dynamic(target):
    """A slice's end of the batch size was compared or turned into an int while importing, which fixed the batch
    at the example's (an import error: shapes (6, 3) and (63, 3)); it stays symbolic: one program for every batch
    size, the table's gradient eager's."""
    torch.manual_seed(0)
    model = SlicedTable()
    eager = copy.deepcopy(model)
    cm = pb_compile(model, (torch.randn(6, 3, dtype=torch.float64),), dynamic_batch=True, target=target)
    for b in (6, 9, 2, 63):
        x = torch.randn(b, 3, dtype=torch.float64)
        got, want = cm(x), eager(x)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        got.backward()
        want.backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-15)
    assert len(cm._programs) == 1


def test_torch_compile_dynamic_true_works():
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="pullback", dynamic=True)
    for b in (3, 5, 4):
        x = torch.randn(b, 5)
        out = compiled(x)
        out.sum().backward()
        ref = eager(x)
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


class TinyLM(nn.Module):
    """Attention with positions, a ``tril`` mask and a broadcast padding mask built in forward from the batch."""

    def __init__(self, d=8, vocab=11):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(8, d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, vocab)
        self.drop = nn.Dropout(0.2)

    def forward(self, ids, keep):
        b, t = ids.shape
        rows = torch.arange(b)[:, None]  # a dynamic arange, advanced indexing over the batch
        x = self.tok(ids) + self.pos(torch.arange(t))[None]
        q, k, v = self.qkv(x).view(b, t, 2, -1).transpose(1, 2).chunk(3, dim=-1)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))[None, None] & keep[rows, torch.arange(t)[None]][:, None, None]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(b, 1, t, t))
        h = self.drop(a.transpose(1, 2).reshape(b, t, -1))
        zeros = torch.zeros(b, t, dtype=torch.long)  # a full of the dynamic shape
        return F.cross_entropy(self.out(h).flatten(0, 1), (ids + zeros).roll(-1, 1).flatten())


def _lm_data(b):
    keep = torch.ones(b, 5, dtype=torch.bool)
    keep[0, 3:] = False
    return torch.randint(0, 11, (b, 5)), keep


def test_attention_with_masks_built_in_forward_imports_with_a_dynamic_batch():
    torch.manual_seed(0)
    model = TinyLM().eval()
    prog = import_torch(model, _lm_data(4), dynamic_batch=True)
    assert [p.type_annotation.shape[0] for p in prog.main.params[:2]] == [pb.Any, pb.Any]
    exe = pb.build(prog.mod)["main"]
    for b in (1, 3, 6):
        data = _lm_data(b)
        np.testing.assert_allclose(exe(*main_inputs(prog, data)), model(*data).item(), rtol=1e-5)


def test_torch_compile_dynamic_true_compiles_one_program_for_every_batch_size():
    """Dynamo's size arguments are read off the batch and the dropout rate it passes as a tensor is a constant:
    one program serves every batch size, losses and gradients equal eager's (same dropout masks)."""
    import torch._dynamo

    import pullback.integrations.dynamo_backend as backend

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyLM()
    eager = copy.deepcopy(model)
    made = []

    def spy(gm, example_inputs):
        made.append(backend.pullback_backend(gm, example_inputs))
        return made[-1]

    compiled = torch.compile(model, backend=spy, dynamic=True)
    for step, b in enumerate((3, 5, 2, 4)):
        data = _lm_data(b)
        torch.manual_seed(step)
        loss = compiled(*data)
        loss.backward()
        torch.manual_seed(step)
        ref = eager(*data)
        ref.backward()
        assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch._dynamo.reset()
    assert [len(f.programs) for f in made] == [1] * len(made) and made
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


class Missing(nn.Module):
    def forward(self, x):
        a = torch.special.airy_ai(x)
        b = torch.special.airy_ai(x.exp() *
                                    2)
        return (a + b).sum()


def test_one_error_lists_each_missing_operator_with_count_and_whole_lines():
    with pytest.raises(UnsupportedOperatorError) as info:
        from_torch(Missing(), (torch.randn(3, 3),))
    (diag,) = info.value.diagnostics
    assert diag.startswith("aten.special_airy_ai.default (2 uses)")
    assert "a = torch.special.airy_ai(x)" in diag and "b = torch.special.airy_ai(x.exp() * 2)" in diag


def test_torch_compile_reports_the_same_text():
    import torch._dynamo

    with pytest.raises(UnsupportedOperatorError) as direct:
        from_torch(Missing(), (torch.randn(3, 3),))
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(Missing(), backend="pullback", dynamic=False)(torch.randn(3, 3))
    torch._dynamo.reset()
    err = getattr(info.value, "inner_exception", info.value)  # Dynamo's BackendCompilerFailed wraps it
    assert isinstance(err, UnsupportedOperatorError)
    assert err.diagnostics[0].splitlines()[0] == direct.value.diagnostics[0].splitlines()[0]
    assert str(direct.value).split("(1 problem):")[1].splitlines()[1] in str(info.value)  # the same lines
    assert "a = torch.special.airy_ai(x)" in str(info.value)


class MaskedTokenLoss(nn.Module):
    """A token classifier whose loss is taken over the positions a boolean mask keeps, as users write it."""

    def __init__(self, weighted: bool):
        super().__init__()
        self.embed, self.head = nn.Linear(6, 8), nn.Linear(8, 5)
        self.weight = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0], dtype=torch.float64) if weighted else None

    def forward(self, x, labels, mask):
        logits = self.head(torch.tanh(self.embed(x)))
        return F.cross_entropy(logits[mask], labels[mask], weight=self.weight, label_smoothing=0.1)


@pytest.mark.parametrize("target", ["numpy", "torch"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_over_boolean_mask_selected_tokens_trains_like_eager(target, weighted):
    """``F.cross_entropy(logits[mask], labels[mask])``: the masked batch has a data-dependent size, which PyTorch's
    Python reference of nll_loss cannot take in the retrace (it asks whether the batch is empty): the import failed
    with a bare GuardOnDataDependentSymNode. One program serves masks keeping any number of tokens."""
    torch.manual_seed(0)
    model = MaskedTokenLoss(weighted).double()
    eager = copy.deepcopy(model)
    x, labels = torch.randn(3, 4, 6, dtype=torch.float64), torch.randint(0, 5, (3, 4))
    masks = [torch.rand(3, 4) > p for p in (0.3, 0.6, 0.1, 0.8)]
    compiled = pb_compile(model, (x, labels, masks[0]), target=target)
    runs = [(compiled, torch.optim.SGD(model.parameters(), lr=0.5)), (eager, torch.optim.SGD(eager.parameters(), lr=0.5))]
    for mask in masks:
        losses = []
        for f, opt in runs:
            opt.zero_grad()
            loss = f(x, labels, mask)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-12)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=name)


class SparseMoE(nn.Module):
    """Mixtral's sparse mixture of experts as Hugging Face wrote it before grouped GEMMs: each expert takes the
    tokens routed to it (``torch.where`` of the routing mask: a data-dependent count) and adds its outputs back
    with ``index_add_``."""

    def __init__(self, d=8, experts=4, k=2):
        super().__init__()
        self.k, self.n = k, experts
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 16), nn.SiLU(), nn.Linear(16, d)) for _ in range(experts))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        b, length, d = x.shape
        h = x.view(-1, d)
        w, chosen = torch.topk(F.softmax(self.gate(h), dim=1), self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        routed = F.one_hot(chosen, num_classes=self.n).permute(2, 1, 0)
        for e in range(self.n):
            slot, tokens = torch.where(routed[e])
            out.index_add_(0, tokens, self.experts[e](h[tokens]) * w[tokens, slot, None])
        return self.head(out.view(b, length, d)).mean(1)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_a_mixture_of_experts_routing_tokens_with_where_and_index_add_trains_like_eager(target):
    """Each step routes a different number of tokens to each expert: one program, eager's losses and weights
    (``index_add_`` of a data-dependent number of rows needed static shapes before)."""
    from pullback.integrations.torch import check_side_by_side, train_side_by_side

    torch.manual_seed(0)
    batches = [((torch.randn(3, 5, 8, dtype=torch.float64),), torch.randint(0, 3, (3,))) for _ in range(4)]
    result = train_side_by_side(SparseMoE().double(), batches, F.cross_entropy, lr=0.5, target=target, verbose=False)
    check_side_by_side(result, rtol=1e-10, atol=1e-12, verbose=False)


def _same_values_and_gradients(compiled, model, eager, *inputs):
    """One call of ``compiled`` (which trains ``model``) and of ``eager``: the same value and gradients (float64)."""
    model.zero_grad()
    eager.zero_grad()
    got, want = compiled(*inputs), eager(*inputs)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)


class RowsWrittenBack(nn.Module):
    """Writes of a data-dependent number of rows: ``out[idx] = rows``, a slice of them, ``scatter_add``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask):
        h = self.lin(x)
        idx = torch.nonzero(mask).squeeze(-1)
        out = torch.zeros_like(h)
        out[idx] = h[idx] * 2
        part = h.clone()
        part[idx, 1:3] = h[idx, :2].tanh()
        summed = torch.zeros(4, 4, dtype=h.dtype).scatter_add(0, idx[:, None].expand(-1, 4) % 4, h[idx])
        return out.pow(2).sum() + part.sum() + summed.pow(2).sum()


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_rows_selected_by_a_mask_written_back_compute_eagers_values_and_gradients(target):
    torch.manual_seed(0)
    model = RowsWrittenBack().double()
    eager = copy.deepcopy(model)
    x = torch.randn(6, 4, dtype=torch.float64)
    masks = [torch.tensor(m) for m in ([1, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1])]
    compiled = pb_compile(model, (x, masks[0].bool()), target=target)
    for mask in masks:
        _same_values_and_gradients(compiled, model, eager, x, mask.bool())


class SelectedRowsJoined(nn.Module):
    """``torch.cat`` of rows a mask selects with rows of static count, before, after and around them."""

    def __init__(self, both_selected: bool = False):
        super().__init__()
        self.lin, self.both = nn.Linear(4, 4), both_selected

    def forward(self, x, mask):
        h = self.lin(x)
        if self.both:
            return torch.cat([h[mask], h[~mask]]).pow(2).sum()
        around = torch.cat([h[:1], h[mask] * 2, h[-2:].tanh()])
        first = torch.cat([h[mask], h[:2]])
        last = torch.cat([h[:3], h[mask].sin()])
        weights = torch.arange(first.shape[0], dtype=h.dtype)[:, None]
        return around.pow(2).sum() + (first * weights).sum() + last.pow(3).sum()


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_rows_selected_by_a_mask_joined_with_others_get_eagers_gradients(target):
    """The gradient of a concatenation with one part of run-time size slices the others from either end (it
    needed every size static); masks selecting some, most and no rows."""
    torch.manual_seed(0)
    model = SelectedRowsJoined().double()
    eager = copy.deepcopy(model)
    x = torch.randn(6, 4, dtype=torch.float64)
    masks = [torch.tensor(m, dtype=torch.bool) for m in ([1, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0], [0] * 6)]
    compiled = pb_compile(model, (x, masks[0]), target=target)
    for mask in masks:
        _same_values_and_gradients(compiled, model, eager, x, mask)


def test_joining_two_parts_of_run_time_sizes_names_what_the_gradient_needs():
    x, mask = torch.randn(6, 4), torch.tensor([True, False, True, True, False, False])
    with pytest.raises(pb.PullbackError, match=r"concatenate: the gradient needs static sizes along axis 0 for all "
                                               r"parts but one, got \['\?', '\?'\] \(rows a mask selects"):
        pb_compile(SelectedRowsJoined(both_selected=True), (x, mask))(x, mask)


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_torch_compile_capturing_data_dependent_shapes_computes_eagers_gradients(target):
    """With Dynamo capturing operators of data-dependent shapes into the graph (instead of breaking it there),
    the sizes of a concatenation of selected rows arrive as ``torch.sym_sum``, a Python function the importer
    named a library's custom operator and refused."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = SelectedRowsJoined().double()
    eager = copy.deepcopy(model)
    x = torch.randn(6, 4, dtype=torch.float64)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        compiled = torch.compile(model, backend="pullback", options={"target": target})
        for mask in ([1, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0]):
            mask = torch.tensor(mask, dtype=torch.bool)
            _same_values_and_gradients(compiled, model, eager, x, mask)
    torch._dynamo.reset()
