"""Mixture-of-experts models (Mixtral): routing (top-k, sort, histc token counts, gathers) imports and trains like
eager through transformers' ``batched_mm`` experts; its default grouped GEMM, a custom op, is refused with that advice."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pullback.frontend import UnsupportedOperatorError, import_torch  # noqa: E402
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


def test_grouped_experts_are_refused_with_the_config_that_imports():
    model, inputs = mixtral()
    with pytest.raises(UnsupportedOperatorError, match='(?s)transformers.grouped_mm_fallback.*experts_implementation="batched_mm"'):
        import_torch(model, inputs)
