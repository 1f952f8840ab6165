"""Hugging Face decoder families compiled as users call them: ``compile(model, batch)``, then ``model(**batch).loss``.

Their ``forward`` returns a key/value cache unless ``use_cache=False`` (the compiled module passes it); each
trains through five SGD steps like eager PyTorch (losses, first gradients, final weights), with the
attention mask of a left-padded batch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tracking import compiled_tracks_eager  # noqa: E402

SIZES = dict(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=16)
DECODERS = {  # rotary positions with grouped-query attention; parallel attention + MLP with a fused projection
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **SIZES)),
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SIZES)),
}


def _batch():
    ids = torch.randint(1, 40, (2, 8))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("name", list(DECODERS))
def test_a_decoder_compiled_with_its_batch_trains_like_eager(name):
    torch.manual_seed(0)
    model = DECODERS[name]().train()
    assert model.config.use_cache
    compiled_tracks_eager(name, model, _batch())
