"""More Hugging Face families, compiled as users call them (``compile(model, batch)``, ``model(**batch).loss``):
the loss, every gradient and the weights after one SGD step equal eager PyTorch's, dropout drawn as eager draws it.

Each family brings something of its own: Phi-3's fused gate/up projection, Gemma 2's soft-capped logits and
sliding windows, OPT's learned positions, Bloom's ALiBi, mT5's relative buckets and encoder-decoder cache,
Whisper's audio convolutions, MobileNetV2's ReLU6 and depthwise convolutions, ConvNeXt's 7x7 depthwise ones
down to 1x1 planes, Swin's shifted windows (``roll``), DeBERTa-v2's disentangled attention, Mamba's
selective scan, CLIP's two towers and contrastive loss, PhiMoE's router and YOSO's LSH cumulation (custom
autograd Functions with a backward of their own), GraniteMoe's ``use_cache`` taken through ``**kwargs``, Informer's
keys sampled with ``torch.randint``. Through ``torch.compile(backend="pullback")``: Longformer, Reformer, Switch
Transformers and FSMT, which branch on tensors' values or run autograd in a Function's backward.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

from tracking import compiled_tracks_eager  # noqa: E402

D = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
         max_position_embeddings=32)


def _ids(*shape):
    return torch.randint(3, 64, shape)


def _lm(model):
    ids = _ids(2, 10)
    return model, {"input_ids": ids, "labels": ids}


def _seq2seq(model):
    return model, {"input_ids": _ids(2, 10), "labels": _ids(2, 6)}


def _images(model, size: int = 32, dtype=torch.float32):
    return model.to(dtype), {"pixel_values": torch.randn(2, 3, size, size, dtype=dtype), "labels": torch.tensor([0, 2])}


FAMILIES = {
    # depthwise convolutions (channels-last on torch), ReLU6 (``clip``'s one-kernel gradient), TensorFlow padding.
    # float64: on two images its 52 batch norms make float32 gradients of ~5000 whose rounding moves single
    # elements by 10% (3e-4 of the largest); against float64's, eager's float32 gradients are off by 2.5e-4
    # (median relative norm over the parameters), pullback's by 2.0e-4
    "mobilenet_v2": lambda: _images(T.MobileNetV2ForImageClassification(T.MobileNetV2Config(
        image_size=32, depth_multiplier=0.35, num_labels=3)), dtype=torch.float64),
    # 7x7 depthwise convolutions down to 1x1 planes, layer scale, channels-last layer norm
    "convnext": lambda: _images(T.ConvNextForImageClassification(T.ConvNextConfig(
        hidden_sizes=[8, 16, 32], depths=[1, 1, 1], num_stages=3, num_labels=3, image_size=32))),
    "phi3": lambda: _lm(T.Phi3ForCausalLM(T.Phi3Config(pad_token_id=0, **D))),
    "gemma2": lambda: _lm(T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=8, num_key_value_heads=1, sliding_window=4, **D))),
    "opt": lambda: _lm(T.OPTForCausalLM(T.OPTConfig(vocab_size=64, hidden_size=16, ffn_dim=32, num_hidden_layers=1,
                                                    num_attention_heads=2, word_embed_proj_dim=16, max_position_embeddings=32))),
    "bloom": lambda: _lm(T.BloomForCausalLM(T.BloomConfig(vocab_size=64, hidden_size=16, n_layer=1, n_head=2))),
    "mt5": lambda: _seq2seq(T.MT5ForConditionalGeneration(T.MT5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32,
                                                                      num_layers=1, num_heads=2))),
    "whisper": lambda: (T.WhisperForConditionalGeneration(T.WhisperConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, num_mel_bins=8, max_source_positions=8, max_target_positions=16,
        decoder_start_token_id=1, pad_token_id=0)), {"input_features": torch.randn(2, 8, 16), "labels": _ids(2, 5)}),
    "swin": lambda: (T.SwinForImageClassification(T.SwinConfig(image_size=16, patch_size=2, embed_dim=8, depths=[2],
                                                               num_heads=[2], window_size=4, num_labels=3)),
                     {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 2])}),
    "deberta_v2": lambda: (T.DebertaV2ForSequenceClassification(T.DebertaV2Config(
        num_labels=3, problem_type="single_label_classification", **D)),
        {"input_ids": _ids(2, 10), "labels": torch.tensor([0, 2])}),
    "mamba": lambda: _lm(T.MambaForCausalLM(T.MambaConfig(vocab_size=64, hidden_size=16, state_size=4,
                                                          num_hidden_layers=1, expand=2, conv_kernel=3))),
    "clip": lambda: (T.CLIPModel(T.CLIPConfig(
        text_config=dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         max_position_embeddings=16),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                           patch_size=8), projection_dim=8)),
        {"input_ids": _ids(2, 6), "pixel_values": torch.randn(2, 3, 16, 16), "return_loss": True}),
    # custom autograd.Functions whose backward is not their forward's derivative (kept: frontend.custom_vjp)
    "phimoe": lambda: _lm(T.PhimoeForCausalLM(T.PhimoeConfig(num_key_value_heads=1, num_local_experts=4,
                                                              num_experts_per_tok=2, experts_implementation="batched_mm",
                                                              **D))),
    "yoso": lambda: (T.YosoForSequenceClassification(T.YosoConfig(use_expectation=True, num_labels=3, **D)),
                     {"input_ids": _ids(2, 10), "labels": torch.tensor([0, 2])}),
    # takes use_cache only through **kwargs (compile passes use_cache=False there: it returned its cache)
    "granitemoe": lambda: _lm(T.GraniteMoeForCausalLM(T.GraniteMoeConfig(num_key_value_heads=1, num_local_experts=4,
                                                                          num_experts_per_tok=2, **D))),
    # ProbSparse attention samples its keys with torch.randint (a random input drawn as eager draws it)
    "informer": lambda: (T.InformerForPrediction(T.InformerConfig(
        prediction_length=4, context_length=8, lags_sequence=[1, 2], num_time_features=1, d_model=16,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
        decoder_layerdrop=0.0)),
        {"past_values": torch.randn(2, 10), "past_time_features": torch.randn(2, 10, 1),
         "past_observed_mask": torch.ones(2, 10), "future_values": torch.randn(2, 4),
         "future_time_features": torch.randn(2, 4, 1)}),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_one_training_step_equals_eager(name):
    torch.manual_seed(0)
    model, batch = FAMILIES[name]()
    compiled_tracks_eager(name, model.train(), batch, steps=1)


def _through_torch_compile_like_eager(model, batch, rtol: float = 1e-7, loss_rtol: float = 1e-10, atol: float = 1e-12):
    """One step of ``model`` through ``torch.compile(backend="pullback")`` and eagerly: the loss to ``loss_rtol``
    and every gradient to ``rtol`` (float64 by default); a parameter eager leaves without a gradient gets none
    (or zeros)."""
    import torch._dynamo

    eager = copy.deepcopy(model)
    want = eager(**batch).loss
    want.backward()
    torch._dynamo.reset()
    try:
        got = torch.compile(model, backend="pullback", dynamic=False)(**batch).loss
        got.backward()
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=loss_rtol, atol=0)
    for (k, p), q in zip(model.named_parameters(), eager.parameters()):
        if q.grad is None:
            assert p.grad is None or not p.grad.any(), k
        else:
            torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m, k=k: f"gradient of {k}: {m}")
    return model


def test_longformer_through_torch_compile_trains_like_eager():
    """Longformer branches on its mask's values (torch.export refuses it; Dynamo splits the model there) and chunks
    its attention with ``as_strided`` of a transposed view: read through the view's own strides, the loss and every
    gradient equal eager's in float64 (the chunks were once read in row-major order: gradients off by 1e-5, more
    than some of them)."""
    torch.manual_seed(0)
    cfg = T.LongformerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=64, pad_token_id=1, attention_window=[4, 4],
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = T.LongformerForMaskedLM(cfg).double().train()
    _through_torch_compile_like_eager(model, {"input_ids": torch.randint(3, 100, (2, 16)),
                                              "labels": torch.randint(3, 100, (2, 16))})


def test_reformer_through_torch_compile_trains_like_eager():
    """Reformer's reversible layers are a custom Function whose backward runs autograd itself (refused by name by
    ``compile``); Dynamo leaves that Function to eager autograd, and traces ``np.lcm`` of two config ints (its
    chunk length) into ``aten.lcm``."""
    torch.manual_seed(0)
    cfg = T.ReformerConfig(vocab_size=64, hidden_size=16, num_attention_heads=2, attention_head_size=8,
                           attn_layers=["local", "lsh"], axial_pos_shape=(4, 4), axial_pos_embds_dim=(8, 8),
                           feed_forward_size=32, is_decoder=True, local_attn_chunk_length=4, lsh_attn_chunk_length=4,
                           num_buckets=2, num_hashes=1, hash_seed=0, max_position_embeddings=16,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                           lsh_attention_probs_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0)
    ids = _ids(2, 16)
    model = _through_torch_compile_like_eager(T.ReformerModelWithLMHead(cfg).double().train(),
                                              {"input_ids": ids, "labels": ids, "use_cache": False})
    # the reversible layers' gradients included: written by the Function's own backward
    assert sum(p.grad is not None and bool(p.grad.any()) for p in model.parameters()) >= 30


def test_switch_transformers_through_torch_compile_trains_like_eager():
    """Its router re-assigns its classifier in ``forward`` (``self.classifier = self.classifier.to(dtype)``: a
    no_grad block returning the parameter itself, which keeps its gradient) and branches on which experts got
    tokens (torch.export refuses it). In float32: its router computes in float32 (``router_dtype``), a float64
    model's classifier would be converted."""
    torch.manual_seed(0)
    cfg = T.SwitchTransformersConfig(vocab_size=64, d_model=16, d_kv=8, d_ff=32, expert_capacity=8, num_layers=2,
                                     num_sparse_encoder_layers=1, num_decoder_layers=2, num_sparse_decoder_layers=1,
                                     num_heads=2, num_experts=4, router_jitter_noise=0.0, decoder_start_token_id=0,
                                     dropout_rate=0.0)
    model = _through_torch_compile_like_eager(T.SwitchTransformersForConditionalGeneration(cfg).train(),
                                              {"input_ids": _ids(2, 10), "labels": _ids(2, 6)}, rtol=1e-4,
                                              loss_rtol=1e-6, atol=1e-6)
    routers = [p for k, p in model.named_parameters() if "router.classifier" in k]
    assert routers and all(p.grad is not None and p.grad.any() for p in routers)


def test_fsmt_through_torch_compile_trains_like_eager():
    """FSMT's decoder is time-major and projects ``x.transpose(0, 1)``; its loss, past a graph break, reshapes the
    logits with ``.view``: they come back laid out as eager's (contiguous). In float32: eager's FSMT fills its
    causal mask through float32 (float64's minimum overflows)."""
    torch.manual_seed(0)
    cfg = T.FSMTConfig(langs=["en", "de"], src_vocab_size=64, tgt_vocab_size=64, d_model=16, encoder_layers=1,
                       decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                       decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=1, decoder_start_token_id=2,
                       bos_token_id=0, eos_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    _through_torch_compile_like_eager(T.FSMTForConditionalGeneration(cfg).train(),
                                      {"input_ids": _ids(2, 10), "labels": _ids(2, 10)}, rtol=1e-4, loss_rtol=1e-6,
                                      atol=1e-6)
