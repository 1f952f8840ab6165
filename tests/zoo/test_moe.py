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
