"""Hugging Face decoder families compiled as users call them: ``compile(model, batch)``, then ``model(**batch).loss``.

Their ``forward`` returns a key/value cache unless ``use_cache=False`` (the compiled module passes it); each
trains through five SGD steps like eager PyTorch (losses, first gradients, final weights), with the
attention mask of a left-padded batch.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pullback.integrations.torch import compile as pb_compile  # noqa: E402

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


def _train(model, batch, steps=5):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, first = [], None
    for _ in range(steps):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        if first is None:
            first = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        opt.step()
        losses.append(loss.item())
    return losses, first


@pytest.mark.parametrize("name", list(DECODERS))
def test_a_decoder_compiled_with_its_batch_trains_like_eager(name):
    torch.manual_seed(0)
    model = DECODERS[name]().train()
    assert model.config.use_cache
    batch = _batch()
    eager = copy.deepcopy(model)
    ref_losses, ref_grads = _train(eager, batch)
    losses, grads = _train(pb_compile(model, batch), batch)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=2e-5, atol=1e-6)
    for key, g, want in zip((k for k, _ in model.named_parameters()), grads, ref_grads):
        if want is None:
            assert g is None or not g.abs().max() > 0, key
        else:
            torch.testing.assert_close(g, want, rtol=1e-3, atol=2e-5, msg=lambda m, key=key: f"{name}: gradient of {key}: {m}")
    for (key, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4, msg=lambda m, key=key: f"{name}: final {key}: {m}")
