"""Mixture-of-experts models (Mixtral): routing (top-k, sort, histc token counts, gathers) imports and trains like
eager, with transformers' ``batched_mm`` experts and with its default grouped GEMM (a ``torch.library`` custom op,
``frontend.library_ops``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pullback.integrations.torch import check_side_by_side, train_side_by_side  # noqa: E402

from models import BATCH, SEQ, LossOf, _ids  # noqa: E402


def mixtral(**kw):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, **kw)
    ids = _ids(BATCH, SEQ)
    return LossOf(MixtralForCausalLM(cfg), ("input_ids", "labels")).train(), (ids, ids.clone())


def test_mixtral_trains_like_eager_with_batched_experts():
    model, inputs = mixtral(experts_implementation="batched_mm")
    result = train_side_by_side(model, [(inputs, None)] * 3, lambda loss, _: loss, lr=0.05, target="torch", verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-5, verbose=False)


def test_mixtral_trains_like_eager_with_its_default_grouped_experts():
    model, inputs = mixtral()
    result = train_side_by_side(model, [(inputs, None)] * 3, lambda loss, _: loss, lr=0.05, target="torch", verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-5, verbose=False)


class Grouped(torch.nn.Module):
    def __init__(self, experts: int, k: int, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, k, n, dtype=torch.float64))

    def forward(self, x, offs):
        return torch.ops.transformers.grouped_mm_fallback(x, self.weight, offs)


@pytest.mark.parametrize("offs", [[2, 5, 7], [0, 4, 4], [3, 3, 5], [0, 0, 0]], ids=["all rows", "empty groups",
                                                                                   "rows past the last group", "none"])
def test_grouped_gemm_values_and_gradients_equal_eager(offs):
    """Each row through its group's expert, rows past ``offs[-1]`` zero, groups empty or not (float64)."""
    from pullback.integrations.torch import compile as pb_compile

    import transformers.integrations.moe  # noqa: F401  (registers the op)
    import copy

    torch.manual_seed(0)
    model, x, o = Grouped(3, 4, 5), torch.randn(7, 4, dtype=torch.float64, requires_grad=True), torch.tensor(offs)
    eager, xe = copy.deepcopy(model), x.detach().clone().requires_grad_(True)
    got, want = pb_compile(model, (x, o))(x, o), eager(xe, o)
    ct = torch.randn_like(want)
    (got * ct).sum().backward()
    (want * ct).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, xe.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.weight.grad, eager.weight.grad, rtol=1e-12, atol=1e-12)


class AtenGrouped(torch.nn.Module):
    """``torch._grouped_mm`` as Hugging Face's experts call it: rows by expert (2-D x 3-D), and the weight-gradient
    form (2-D x 2-D, the groups along the contraction)."""

    def __init__(self, experts: int, k: int, n: int, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, k, n, dtype=dtype))

    def forward(self, x, offs):
        y = torch._grouped_mm(x, self.weight, offs=offs)
        return y, torch._grouped_mm(x.t(), y, offs=offs)


@pytest.mark.parametrize("target", ["torch", "numpy", "jax"])
def test_atens_grouped_gemm_imports_as_one_grouped_product(target):
    """``aten._grouped_mm`` (the kernel transformers' default experts call in bfloat16; torch.export takes no other
    dtype for it) becomes ``nn.grouped_matmul`` / ``nn.grouped_transpose_matmul``: no (E, S, N) product of every row
    with every expert. Values and gradients are eager's, bit for bit on torch."""
    import copy

    import pullback
    from pullback.frontend import from_torch
    from pullback.integrations.torch import compile as pb_compile

    if target == "jax":
        pytest.importorskip("jax")
    dt = torch.bfloat16
    torch.manual_seed(0)
    model, offs = AtenGrouped(4, 16, 8, dt), torch.tensor([6, 6, 20, 32], dtype=torch.int32)
    x = torch.randn(32, 16, dtype=dt, requires_grad=True)
    eager, xe = copy.deepcopy(model), x.detach().clone().requires_grad_(True)
    names = {n.op.name for n in pullback.ir.traversal.post_order(from_torch(model, (x, offs))[0]["main"].body)
             if isinstance(n, pullback.ir.expr.Call) and hasattr(n.op, "name")}
    assert {"nn.grouped_matmul", "nn.grouped_transpose_matmul"} <= names and "nn.batch_matmul" not in names
    got, want = pb_compile(model, (x, offs), target=target)(x, offs), eager(xe, offs)
    cts = [torch.randn_like(w) for w in want]
    sum((g * c).sum() for g, c in zip(got, cts)).backward()
    sum((w * c).sum() for w, c in zip(want, cts)).backward()
    pairs = list(zip(got, want)) + [(x.grad, xe.grad), (model.weight.grad, eager.weight.grad)]
    for a, b in pairs:
        if target == "torch":
            assert torch.equal(a, b)
        else:  # float32 sums rounded once, added in another order: a bfloat16 unit at most
            torch.testing.assert_close(a, b, rtol=2 ** -8, atol=0)


def test_bfloat16_mixtral_with_its_default_grouped_experts_trains_with_eagers_bits():
    """In bfloat16 transformers' default experts call ``torch._grouped_mm`` (not its float32 fallback op): the
    model imports, and on torch the loss and the experts' and router's gradients are eager's bits."""
    import copy

    from pullback.integrations.torch import compile as pb_compile

    model, inputs = mixtral()
    model = model.to(torch.bfloat16)
    eager = copy.deepcopy(model)
    want = eager(*inputs)
    want.backward()
    got = pb_compile(model, inputs, target="torch")(*inputs)
    got.backward()
    assert torch.equal(got, want)
    moe = [(n, p) for n, p in model.named_parameters() if ".mlp." in n]
    assert moe and all(torch.equal(p.grad, dict(eager.named_parameters())[n].grad) for n, p in moe)
