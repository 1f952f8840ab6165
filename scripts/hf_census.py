"""Train Hugging Face model families through pullback, side by side with eager PyTorch (docs/zoo.md's census).

    python scripts/hf_census.py                      # every family, torch target
    python scripts/hf_census.py --target numpy llama falcon
    python scripts/hf_census.py --route dynamo       # the families export refuses, through torch.compile

Each model is built from its config class with a tiny configuration and random weights (no downloads), trained
one step (float64 by default, dropout active, the same seeds) eagerly and through
``pullback.integrations.torch.compile``: ``OK`` when the loss and every parameter gradient agree within 1e-5
(relative; gradients to the largest one), else ``DIFF``, or the error. Three SGD steps side by side are reported
too. torch.export cannot trace a forward that branches on tensor values: those families are ``EXPECTED`` to fail,
with the reason; ``SKIPPED`` when eager PyTorch itself fails in the dtype. ``--route dynamo`` trains through
``torch.compile(model, backend=pullback_backend)`` instead: Dynamo runs those branches eagerly between graphs, and
``EXPECTED_DYNAMO`` lists what still fails there. Exits 1 on a ``DIFF`` or an unexpected error.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "zoo"))
from models import BATCH, SEQ, VOCAB, LossOf, _ids  # noqa: E402

import pullback.integrations.torch as pbt  # noqa: E402

LR = 0.05
H = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=VOCAB)
KV = dict(num_key_value_heads=1)
S2S = dict(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
           decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
           pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
AUDIO = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, conv_dim=(8, 8),
             conv_stride=(5, 2), conv_kernel=(10, 3), num_feat_extract_layers=2, num_conv_pos_embeddings=4,
             num_conv_pos_embedding_groups=2)
MOE = dict(experts_implementation="batched_mm")


def _build(cfg_name: str, model_name: str, **kw):
    tr = importlib.import_module("transformers")
    return getattr(tr, model_name)(getattr(tr, cfg_name)(**kw))


def causal(cfg, model, **kw):
    def make():
        ids = _ids(BATCH, SEQ)
        return LossOf(_build(cfg, model, **kw), ["input_ids", "labels"]), (ids, ids.clone())
    return make


def seq2seq(cfg, model, mask=False, tgt=4, **kw):
    """``mask=True`` passes an all-ones ``attention_mask`` (some encoders build it only when not traced); ``tgt``
    is the labels' length."""
    if mask:
        return lambda: (LossOf(_build(cfg, model, **kw), ["input_ids", "attention_mask", "labels"]),
                        (_ids(BATCH, SEQ, low=3), torch.ones(BATCH, SEQ, dtype=torch.long), _ids(BATCH, tgt, low=3)))
    return lambda: (LossOf(_build(cfg, model, **kw), ["input_ids", "labels"]), (_ids(BATCH, SEQ, low=3), _ids(BATCH, tgt, low=3)))


def classify(cfg, model, key="input_ids", shape=None, **kw):
    def make():
        x = _ids(BATCH, SEQ) if shape is None else torch.randn(*shape)
        return LossOf(_build(cfg, model, num_labels=3, **kw), [key, "labels"]), (x, torch.randint(0, 3, (BATCH,)))
    return make


def image(cfg, model, **kw):
    return classify(cfg, model, "pixel_values", (BATCH, 3, 32, 32), **kw)

def segment(cfg, model, **kw):
    return lambda: (LossOf(_build(cfg, model, num_labels=3, **kw), ["pixel_values", "labels"]),
                    (torch.randn(BATCH, 3, 32, 32), torch.randint(0, 3, (BATCH, 32, 32))))


def depth(cfg, model, **kw):
    return lambda: (LossOf(_build(cfg, model, **kw), ["pixel_values", "labels"]),
                    (torch.randn(BATCH, 3, 32, 32), torch.rand(BATCH, 32, 32) + 0.5))


def speech(cfg, model, **kw):
    return lambda: (LossOf(_build(cfg, model, **kw), ["input_features", "labels"]),
                    (torch.randn(BATCH, 16, 8), _ids(BATCH, 4, low=3)))


FAMILIES = {
    # decoder-only LMs
    "llama": causal("LlamaConfig", "LlamaForCausalLM", **H, **KV),
    "mistral": causal("MistralConfig", "MistralForCausalLM", **H, **KV),
    "qwen2": causal("Qwen2Config", "Qwen2ForCausalLM", **H, **KV),
    "qwen3": causal("Qwen3Config", "Qwen3ForCausalLM", **H, **KV, head_dim=8),
    "gemma": causal("GemmaConfig", "GemmaForCausalLM", **H, **KV, head_dim=8),
    "gemma2": causal("Gemma2Config", "Gemma2ForCausalLM", **H, **KV, head_dim=8),
    "phi": causal("PhiConfig", "PhiForCausalLM", **H),
    "phi3": causal("Phi3Config", "Phi3ForCausalLM", **H, pad_token_id=0),
    "gpt_neox": causal("GPTNeoXConfig", "GPTNeoXForCausalLM", **H),
    "opt": causal("OPTConfig", "OPTForCausalLM", hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=32,
                  word_embed_proj_dim=16, vocab_size=VOCAB),
    "bloom": causal("BloomConfig", "BloomForCausalLM", hidden_size=16, n_layer=2, n_head=2, vocab_size=VOCAB),
    "falcon": causal("FalconConfig", "FalconForCausalLM", hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     vocab_size=VOCAB),
    "gptj": causal("GPTJConfig", "GPTJForCausalLM", n_embd=16, n_layer=2, n_head=2, rotary_dim=4, vocab_size=VOCAB),
    "codegen": causal("CodeGenConfig", "CodeGenForCausalLM", n_embd=16, n_layer=2, n_head=2, rotary_dim=4, vocab_size=VOCAB),
    "olmo": causal("OlmoConfig", "OlmoForCausalLM", **H),
    "granite": causal("GraniteConfig", "GraniteForCausalLM", **H),
    "cohere": causal("CohereConfig", "CohereForCausalLM", **H, **KV),
    "starcoder2": causal("Starcoder2Config", "Starcoder2ForCausalLM", **H, **KV),
    "persimmon": causal("PersimmonConfig", "PersimmonForCausalLM", **H),
    "mpt": causal("MptConfig", "MptForCausalLM", d_model=16, n_heads=2, n_layers=2, vocab_size=VOCAB),
    "biogpt": causal("BioGptConfig", "BioGptForCausalLM", **H),
    "xglm": causal("XGLMConfig", "XGLMForCausalLM", vocab_size=VOCAB, d_model=16, num_layers=2, attention_heads=2, ffn_dim=32),
    "ctrl": causal("CTRLConfig", "CTRLLMHeadModel", vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, dff=32),
    "gpt_bigcode": causal("GPTBigCodeConfig", "GPTBigCodeForCausalLM", vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2),
    "gpt_neo": causal("GPTNeoConfig", "GPTNeoForCausalLM", vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2,
                      attention_types=[[["global", "local"], 1]], window_size=4),
    "mixtral": causal("MixtralConfig", "MixtralForCausalLM", **H, **KV, num_local_experts=4, num_experts_per_tok=2,
                      experts_implementation="batched_mm"),
    "mamba": causal("MambaConfig", "MambaForCausalLM", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, state_size=4,
                    expand=2),
    "rwkv": causal("RwkvConfig", "RwkvForCausalLM", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                   attention_hidden_size=16, intermediate_size=32, context_length=16),
    "olmo2": causal("Olmo2Config", "Olmo2ForCausalLM", **H),
    "olmo3": causal("Olmo3Config", "Olmo3ForCausalLM", **H),
    "olmoe": causal("OlmoeConfig", "OlmoeForCausalLM", **H, num_experts=4, num_experts_per_tok=2, **MOE),
    "qwen2_moe": causal("Qwen2MoeConfig", "Qwen2MoeForCausalLM", **H, **KV, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=16, shared_expert_intermediate_size=16, **MOE),
    "qwen3_moe": causal("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **H, **KV, head_dim=8, num_experts=4,
                        num_experts_per_tok=2, moe_intermediate_size=16, **MOE),
    "gemma3": causal("Gemma3TextConfig", "Gemma3ForCausalLM", **H, **KV, head_dim=8, sliding_window=4),
    "glm": causal("GlmConfig", "GlmForCausalLM", **H, **KV, head_dim=8, pad_token_id=0),
    "glm4": causal("Glm4Config", "Glm4ForCausalLM", **H, **KV, head_dim=8, pad_token_id=0),
    "helium": causal("HeliumConfig", "HeliumForCausalLM", **H, **KV, head_dim=8),
    "stablelm": causal("StableLmConfig", "StableLmForCausalLM", **H, num_key_value_heads=2),
    "nemotron": causal("NemotronConfig", "NemotronForCausalLM", **H, **KV, head_dim=8),
    "exaone4": causal("Exaone4Config", "Exaone4ForCausalLM", **H, **KV, head_dim=8),
    "smollm3": causal("SmolLM3Config", "SmolLM3ForCausalLM", **H, **KV, pad_token_id=0, bos_token_id=0, eos_token_id=0),
    "arcee": causal("ArceeConfig", "ArceeForCausalLM", **H, **KV),
    "ernie4_5": causal("Ernie4_5Config", "Ernie4_5ForCausalLM", **H, **KV, head_dim=8),
    "apertus": causal("ApertusConfig", "ApertusForCausalLM", **H, **KV),
    "lfm2": causal("Lfm2Config", "Lfm2ForCausalLM", **H, **KV, layer_types=["conv", "full_attention"]),
    "phimoe": causal("PhimoeConfig", "PhimoeForCausalLM", **H, **KV, num_local_experts=4, num_experts_per_tok=2, **MOE),
    "granitemoe": causal("GraniteMoeConfig", "GraniteMoeForCausalLM", **H, **KV, num_local_experts=4,
                         num_experts_per_tok=2, **MOE),
    "jetmoe": causal("JetMoeConfig", "JetMoeForCausalLM", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                     num_key_value_heads=2, kv_channels=8, intermediate_size=32, num_local_experts=4,
                     num_experts_per_tok=2, **MOE),
    "dbrx": causal("DbrxConfig", "DbrxForCausalLM", vocab_size=VOCAB, d_model=16, n_layers=2, n_heads=2,
                   max_seq_len=32, attn_config=dict(kv_n_heads=1, rope_theta=10000.0, clip_qkv=8.0),
                   ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2), **MOE),
    "gpt_oss": causal("GptOssConfig", "GptOssForCausalLM", **H, **KV, head_dim=8, num_local_experts=4,
                      num_experts_per_tok=2, sliding_window=4, **MOE),
    "deepseek_v3": causal("DeepseekV3Config", "DeepseekV3ForCausalLM", **H, moe_intermediate_size=16,
                          n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                          kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, **MOE),
    "jamba": causal("JambaConfig", "JambaForCausalLM", **H, **KV, num_experts=2, num_experts_per_tok=1,
                    attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                    mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, use_mamba_kernels=False, **MOE),
    "falcon_mamba": causal("FalconMambaConfig", "FalconMambaForCausalLM", vocab_size=VOCAB, hidden_size=16,
                           num_hidden_layers=2, state_size=4, expand=2),
    "mamba2": causal("Mamba2Config", "Mamba2ForCausalLM", vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2,
                     state_size=4, expand=2, head_dim=8, num_heads=4, n_groups=1, chunk_size=4),
    "bamba": causal("BambaConfig", "BambaForCausalLM", **H, **KV, attn_layer_indices=[1], mamba_d_state=4,
                    mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_chunk_size=4, mamba_expand=2),
    "falcon_h1": causal("FalconH1Config", "FalconH1ForCausalLM", **H, **KV, head_dim=8, mamba_d_state=4,
                        mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_chunk_size=4, mamba_expand=2, mamba_d_ssm=32),
    "zamba": causal("ZambaConfig", "ZambaForCausalLM", **{**H, "num_hidden_layers": 3}, **KV, attention_hidden_size=32,
                    attention_head_dim=16, mamba_d_state=4, mamba_expand=2, n_mamba_heads=2,
                    layers_block_type=["mamba", "hybrid", "hybrid"]),  # one hybrid layer fails HF's weight tying
    "recurrent_gemma": causal("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", vocab_size=VOCAB, hidden_size=16,
                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
                              lru_width=16, attention_window_size=4, block_types=["recurrent", "attention"]),
    "modernbert_decoder": causal("ModernBertDecoderConfig", "ModernBertDecoderForCausalLM", **H, pad_token_id=0),
    "bert_generation": causal("BertGenerationConfig", "BertGenerationDecoder", **H, is_decoder=True),
    # encoders
    "roberta": classify("RobertaConfig", "RobertaForSequenceClassification", **H),
    "xlm_roberta": classify("XLMRobertaConfig", "XLMRobertaForSequenceClassification", **H),
    "distilbert": classify("DistilBertConfig", "DistilBertForSequenceClassification", dim=16, n_layers=2, n_heads=2,
                           hidden_dim=32, vocab_size=VOCAB),
    "albert": classify("AlbertConfig", "AlbertForSequenceClassification", embedding_size=8, **H),
    "electra": classify("ElectraConfig", "ElectraForSequenceClassification", embedding_size=8, **H),
    "modernbert": classify("ModernBertConfig", "ModernBertForSequenceClassification", **H, pad_token_id=0),
    "mpnet": classify("MPNetConfig", "MPNetForSequenceClassification", **H),
    "funnel": classify("FunnelConfig", "FunnelForSequenceClassification", vocab_size=VOCAB, block_sizes=[1, 1], d_model=16,
                       n_head=2, d_head=8, d_inner=32),
    "convbert": classify("ConvBertConfig", "ConvBertForSequenceClassification", **H, embedding_size=16),
    "squeezebert": classify("SqueezeBertConfig", "SqueezeBertForSequenceClassification", **H, embedding_size=16),
    "layoutlm": classify("LayoutLMConfig", "LayoutLMForSequenceClassification", **H),
    "xlnet": classify("XLNetConfig", "XLNetForSequenceClassification", vocab_size=VOCAB, d_model=16, n_layer=2, n_head=2,
                      d_inner=32),
    "deberta_v2": classify("DebertaV2Config", "DebertaV2ForSequenceClassification", **H),
    "ernie": classify("ErnieConfig", "ErnieForSequenceClassification", **H),
    "nystromformer": classify("NystromformerConfig", "NystromformerForSequenceClassification", **H, num_landmarks=2,
                              segment_means_seq_len=SEQ, conv_kernel_size=3),
    "yoso": classify("YosoConfig", "YosoForSequenceClassification", **H, use_expectation=True),
    "mra": classify("MraConfig", "MraForSequenceClassification", **H),
    "canine": classify("CanineConfig", "CanineForSequenceClassification", hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32, num_hash_functions=2, num_hash_buckets=64,
                       downsampling_rate=2, local_transformer_stride=4),
    "rembert": classify("RemBertConfig", "RemBertForSequenceClassification", **H, input_embedding_size=8,
                        output_embedding_size=8),
    "roformer": classify("RoFormerConfig", "RoFormerForSequenceClassification", **H),
    "megatron_bert": classify("MegatronBertConfig", "MegatronBertForSequenceClassification", **H),
    "big_bird": classify("BigBirdConfig", "BigBirdForSequenceClassification", **H, attention_type="original_full"),
    "longformer": classify("LongformerConfig", "LongformerForSequenceClassification", **H, attention_window=4),
    "data2vec_text": classify("Data2VecTextConfig", "Data2VecTextForSequenceClassification", **H),
    "camembert": classify("CamembertConfig", "CamembertForSequenceClassification", **H),
    "deberta": classify("DebertaConfig", "DebertaForSequenceClassification", **H),
    "xlm": classify("XLMConfig", "XLMForSequenceClassification", vocab_size=VOCAB, emb_dim=16, n_layers=2, n_heads=2),
    "flaubert": classify("FlaubertConfig", "FlaubertForSequenceClassification", vocab_size=VOCAB, emb_dim=16,
                         n_layers=2, n_heads=2),
    "roc_bert": classify("RoCBertConfig", "RoCBertForSequenceClassification", **H, pronunciation_vocab_size=VOCAB,
                         shape_vocab_size=VOCAB, pronunciation_embed_dim=8, shape_embed_dim=8),
    "esm": classify("EsmConfig", "EsmForSequenceClassification", **H, pad_token_id=0, position_embedding_type="rotary"),
    "xlm_roberta_xl": classify("XLMRobertaXLConfig", "XLMRobertaXLForSequenceClassification", **H),
    "xmod": classify("XmodConfig", "XmodForSequenceClassification", **H, languages=("en_XX",), default_language="en_XX"),
    "ibert": classify("IBertConfig", "IBertForSequenceClassification", **H),
    "lilt": classify("LiltConfig", "LiltForSequenceClassification", **{**H, "hidden_size": 24}),
    # encoder-decoders
    "mbart": seq2seq("MBartConfig", "MBartForConditionalGeneration", **S2S),
    "pegasus": seq2seq("PegasusConfig", "PegasusForConditionalGeneration", **S2S),
    "marian": seq2seq("MarianConfig", "MarianMTModel", **S2S),
    "blenderbot_small": seq2seq("BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration", **S2S),
    "mt5": seq2seq("MT5Config", "MT5ForConditionalGeneration", vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1,
                   num_decoder_layers=1, num_heads=2, relative_attention_num_buckets=8, decoder_start_token_id=0,
                   pad_token_id=0),
    "led": seq2seq("LEDConfig", "LEDForConditionalGeneration", **S2S, max_encoder_position_embeddings=32,
                   max_decoder_position_embeddings=32, attention_window=[4]),
    "prophetnet": seq2seq("ProphetNetConfig", "ProphetNetForConditionalGeneration", vocab_size=VOCAB, hidden_size=16,
                          encoder_ffn_dim=32, decoder_ffn_dim=32, num_encoder_layers=1, num_decoder_layers=1,
                          num_encoder_attention_heads=2, num_decoder_attention_heads=2, ngram=2, num_buckets=8,
                          relative_max_distance=16, max_position_embeddings=32, pad_token_id=1, bos_token_id=0,
                          eos_token_id=2, decoder_start_token_id=2),
    "fsmt": seq2seq("FSMTConfig", "FSMTForConditionalGeneration", tgt=SEQ, langs=["en", "de"], src_vocab_size=VOCAB,
                    tgt_vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                    decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                    pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    "plbart": seq2seq("PLBartConfig", "PLBartForConditionalGeneration", **S2S),
    "m2m_100": seq2seq("M2M100Config", "M2M100ForConditionalGeneration", **S2S),
    "nllb_moe": seq2seq("NllbMoeConfig", "NllbMoeForConditionalGeneration", **S2S, num_experts=4, expert_capacity=8,
                        encoder_sparse_step=1, decoder_sparse_step=1),
    "switch_transformers": seq2seq("SwitchTransformersConfig", "SwitchTransformersForConditionalGeneration", mask=True,
                                   vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2,
                                   num_heads=2, num_experts=4, expert_capacity=8, encoder_sparse_step=2,
                                   decoder_sparse_step=2, relative_attention_num_buckets=8,
                                   decoder_start_token_id=0, pad_token_id=0),
    "umt5": seq2seq("UMT5Config", "UMT5ForConditionalGeneration", vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32,
                    num_layers=1, num_decoder_layers=1, num_heads=2, relative_attention_num_buckets=8,
                    decoder_start_token_id=0, pad_token_id=0),
    "longt5": seq2seq("LongT5Config", "LongT5ForConditionalGeneration", mask=True, vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32,
                      num_layers=1, num_decoder_layers=1, num_heads=2, relative_attention_num_buckets=8, local_radius=2,
                      global_block_size=2, decoder_start_token_id=0, pad_token_id=0),
    "mvp": seq2seq("MvpConfig", "MvpForConditionalGeneration", **S2S),
    "blenderbot": seq2seq("BlenderbotConfig", "BlenderbotForConditionalGeneration", **S2S),
    # vision
    "convnext": image("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
    "convnextv2": image("ConvNextV2Config", "ConvNextV2ForImageClassification", hidden_sizes=[8, 16], depths=[1, 1],
                        num_stages=2),
    "swin": image("SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=8, depths=[1, 1],
                  num_heads=[1, 2], window_size=4),
    "swinv2": image("Swinv2Config", "Swinv2ForImageClassification", image_size=32, patch_size=4, embed_dim=8,
                    depths=[1, 1], num_heads=[1, 2], window_size=4),
    "resnet": image("ResNetConfig", "ResNetForImageClassification", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]),
    "regnet": image("RegNetConfig", "RegNetForImageClassification", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                    groups_width=8),
    "mobilevit": image("MobileViTConfig", "MobileViTForImageClassification", image_size=32, hidden_sizes=[16, 16, 16],
                       neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32]),
    "mobilenet_v2": image("MobileNetV2Config", "MobileNetV2ForImageClassification", image_size=32, depth_multiplier=0.25),
    "deit": image("DeiTConfig", "DeiTForImageClassification", image_size=32, patch_size=8, hidden_size=16,
                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=32),
    "beit": image("BeitConfig", "BeitForImageClassification", image_size=32, patch_size=8, hidden_size=16,
                  num_hidden_layers=2, num_attention_heads=2, intermediate_size=32),
    "dinov2": image("Dinov2Config", "Dinov2ForImageClassification", image_size=32, patch_size=8, hidden_size=16,
                    num_hidden_layers=2, num_attention_heads=2),
    "vit_msn": image("ViTMSNConfig", "ViTMSNForImageClassification", image_size=32, patch_size=8, hidden_size=16,
                     num_hidden_layers=2, num_attention_heads=2, intermediate_size=32),
    "segformer": image("SegformerConfig", "SegformerForImageClassification", num_encoder_blocks=2, depths=[1, 1],
                       sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[7, 3],
                       strides=[4, 2], mlp_ratios=[2, 2]),
    "poolformer": image("PoolFormerConfig", "PoolFormerForImageClassification", num_encoder_blocks=2, depths=[1, 1],
                        hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]),
    "levit": image("LevitConfig", "LevitForImageClassification", image_size=32, hidden_sizes=[16, 24, 32],
                   num_attention_heads=[1, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16, stride=2,
                   kernel_size=3, padding=1),
    "focalnet": image("FocalNetConfig", "FocalNetForImageClassification", image_size=32, patch_size=4, embed_dim=8,
                      depths=[1, 1]),
    "efficientnet": image("EfficientNetConfig", "EfficientNetForImageClassification", image_size=32, width_coefficient=0.1,
                          depth_coefficient=1.0, kernel_sizes=[3, 3], in_channels=[8, 8], out_channels=[8, 16],
                          strides=[1, 2], num_block_repeats=[1, 1], expand_ratios=[1, 2],
                          hidden_dim=128),  # round_filters(config, 1280) at width 0.1: its head pools with a 128 window
    "mobilenet_v1": image("MobileNetV1Config", "MobileNetV1ForImageClassification", image_size=32, depth_multiplier=0.25),
    "bit": image("BitConfig", "BitForImageClassification", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_groups=2),
    "cvt": image("CvtConfig", "CvtForImageClassification", embed_dim=[8, 16], num_heads=[1, 2], depth=[1, 2],
                 patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], mlp_ratio=[2.0, 2.0],
                 attention_drop_rate=[0.0, 0.0], drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.1], qkv_bias=[True, True],
                 cls_token=[False, True], qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 3],
                 padding_kv=[1, 1], stride_kv=[2, 2], padding_q=[1, 1], stride_q=[1, 1]),
    "pvt": image("PvtConfig", "PvtForImageClassification", image_size=32, num_encoder_blocks=2, depths=[1, 1],
                 sequence_reduction_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[4, 2],
                 strides=[4, 2], mlp_ratios=[2, 2]),
    "pvt_v2": image("PvtV2Config", "PvtV2ForImageClassification", image_size=32, num_encoder_blocks=2, depths=[1, 1],
                    sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[7, 3],
                    strides=[4, 2], mlp_ratios=[2, 2]),
    "hiera": image("HieraConfig", "HieraForImageClassification", image_size=[32, 32], patch_size=[3, 3],
                   patch_stride=[2, 2], patch_padding=[1, 1], embed_dim=8, num_heads=[1, 2], depths=[1, 1],
                   query_stride=[2, 2], masked_unit_size=[4, 4], masked_unit_attention=[True, False], num_query_pool=1),
    "swiftformer": image("SwiftFormerConfig", "SwiftFormerForImageClassification", image_size=32, depths=[1, 1],
                         embed_dims=[8, 16], downsamples=[True, True]),
    "textnet": image("TextNetConfig", "TextNetForImageClassification", stem_out_channels=8,
                     conv_layer_kernel_sizes=[[[3, 3]], [[3, 3]]], conv_layer_strides=[[1], [2]],
                     hidden_sizes=[8, 8, 16]),
    "dinov2_registers": image("Dinov2WithRegistersConfig", "Dinov2WithRegistersForImageClassification", image_size=32,
                              patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_register_tokens=2),
    "ijepa": image("IJepaConfig", "IJepaForImageClassification", image_size=32, patch_size=8, hidden_size=16,
                   num_hidden_layers=2, num_attention_heads=2, intermediate_size=32),
    "data2vec_vision": image("Data2VecVisionConfig", "Data2VecVisionForImageClassification", image_size=32, patch_size=8,
                             hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32),
    "glpn": depth("GLPNConfig", "GLPNForDepthEstimation", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                  hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                  mlp_ratios=[2, 2], decoder_hidden_size=8),
    "dpt": segment("DPTConfig", "DPTForSemanticSegmentation", image_size=32, patch_size=8, hidden_size=16,
                   num_hidden_layers=4, num_attention_heads=2, intermediate_size=32, backbone_out_indices=[0, 1, 2, 3],
                   neck_hidden_sizes=[8, 8, 16, 16], fusion_hidden_size=16, reassemble_factors=[4, 2, 1, 0.5]),
    "upernet": segment("UperNetConfig", "UperNetForSemanticSegmentation", hidden_size=16, auxiliary_channels=8,
                       backbone_config=dict(model_type="convnext", hidden_sizes=[8, 8, 16], depths=[1, 1, 1], num_stages=3,
                                            out_features=["stage1", "stage2", "stage3"])),
    # audio
    "whisper_encoder": classify("WhisperConfig", "WhisperForAudioClassification", "input_features", (BATCH, 8, 32),
                                d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32, num_mel_bins=8,
                                max_source_positions=16, vocab_size=VOCAB),
    "ast": classify("ASTConfig", "ASTForAudioClassification", "input_values", (BATCH, 32, 16), hidden_size=16,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, max_length=32, num_mel_bins=16,
                    patch_size=8, frequency_stride=8, time_stride=8),
    "wav2vec2": classify("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", "input_values", (BATCH, 400), **AUDIO),
    "hubert": classify("HubertConfig", "HubertForSequenceClassification", "input_values", (BATCH, 400), **AUDIO),
    "data2vec_audio": classify("Data2VecAudioConfig", "Data2VecAudioForSequenceClassification", "input_values",
                               (BATCH, 400), **AUDIO),
    "sew": classify("SEWConfig", "SEWForSequenceClassification", "input_values", (BATCH, 400), **AUDIO, squeeze_factor=2),
    "sew_d": classify("SEWDConfig", "SEWDForSequenceClassification", "input_values", (BATCH, 400), **AUDIO,
                      squeeze_factor=2, position_buckets=8, max_position_embeddings=32),
    "unispeech": classify("UniSpeechConfig", "UniSpeechForSequenceClassification", "input_values", (BATCH, 400), **AUDIO),
    "unispeech_sat": classify("UniSpeechSatConfig", "UniSpeechSatForSequenceClassification", "input_values",
                              (BATCH, 400), **AUDIO),
    "wavlm": classify("WavLMConfig", "WavLMForSequenceClassification", "input_values", (BATCH, 400), **AUDIO,
                      num_buckets=8, max_bucket_distance=16),
    "speech_to_text": speech("Speech2TextConfig", "Speech2TextForConditionalGeneration", **S2S,
                             input_feat_per_channel=8, input_channels=1, conv_channels=8, conv_kernel_sizes=(5, 5),
                             num_conv_layers=2, max_source_positions=32, max_target_positions=32),
}

# families torch.export cannot trace in training mode (a branch on a tensor's value, a module cast in forward), with
# the reason
EXPECTED = {
    "deberta_v2": "its loss branches on `label_index.size(0) > 0` (a data-dependent size)",
    "wav2vec2": "LayerDrop draws `torch.rand(()) < layerdrop` per layer in training, and SpecAugment draws its masks "
                "with np.random (refused: they would be baked in); layerdrop=0, mask_time_prob=0 train like eager",
    "hubert": "LayerDrop draws `torch.rand(()) < layerdrop` per layer in training, and SpecAugment draws its masks "
              "with np.random (refused: they would be baked in); layerdrop=0, mask_time_prob=0 train like eager",
    "jetmoe": "not converted yet: its experts split the tokens by the router's counts (`split_with_sizes` with "
              "data-dependent sizes)",
    "deberta": "its loss branches on `label_index.size(0) > 0` (a data-dependent size)",
    "dbrx": "its experts loop `for expert_idx in expert_hit` over the experts the router picked (a data-dependent size)",
    "longformer": "global attention branches on `is_index_global_attn.flatten().any().item()`",
    "led": "global attention branches on `is_index_global_attn.flatten().any().item()`",
    "ibert": "QuantAct asserts `x_max.isnan().sum() == 0` (a tensor's value) even with quant_mode=False",
    "prophetnet": "_shift_right asserts `torch.all(shifted_input_ids >= 0).item()`",
    "fsmt": "make_padding_mask branches on `padding_mask.any()` (float32; in float64 eager fails: finfo(float64).min "
            "written into a float32 mask)",
    "m2m_100": "LayerDrop draws `torch.rand([]) < layerdrop` per layer in training; encoder_layerdrop=0, "
               "decoder_layerdrop=0 train like eager",
    "nllb_moe": "LayerDrop draws `torch.rand([]) < layerdrop` per layer; without it, the router casts its Linear in "
                "forward (`self.classifier = self.classifier.to(self.dtype)`), which torch.export cannot trace "
                "(`_apply(): Couldn't swap Linear.weight`)",
    "switch_transformers": "the router casts its Linear in forward (`self.classifier = self.classifier.to(self.dtype)`), "
                           "which torch.export cannot trace (`_apply(): Couldn't swap Linear.weight`), in float32 too",
    "nystromformer": "under torch.export create_bidirectional_mask materializes a (batch, 1, seq, seq) mask (eager "
                     "drops an all-ones one), which the landmark scores (batch, heads, landmarks, seq) cannot add",
    "sew_d": "SpecAugment draws its masks with np.random (refused: they would be baked in); with mask_time_prob=0, "
             "layerdrop=0 it trains like eager (its XDropout and XSoftmax Functions included)",
    "data2vec_audio": "LayerDrop draws `torch.rand(()) < layerdrop` per layer in training, and SpecAugment draws its masks "
                      "with np.random (refused: they would be baked in); layerdrop=0, mask_time_prob=0 train like eager",
    "sew": "LayerDrop draws `torch.rand(()) < layerdrop` per layer in training, and SpecAugment draws its masks "
                      "with np.random (refused: they would be baked in); layerdrop=0, mask_time_prob=0 train like eager",
    "unispeech": "LayerDrop draws `torch.rand(()) < layerdrop` per layer in training, and SpecAugment draws its masks "
                      "with np.random (refused: they would be baked in); layerdrop=0, mask_time_prob=0 train like eager",
    "unispeech_sat": "LayerDrop draws `torch.rand(()) < layerdrop` per layer in training, and SpecAugment draws its masks "
                      "with np.random (refused: they would be baked in); layerdrop=0, mask_time_prob=0 train like eager",
    "wavlm": "LayerDrop draws `torch.rand(()) < layerdrop` per layer in training, and SpecAugment draws its masks "
                      "with np.random (refused: they would be baked in); layerdrop=0, mask_time_prob=0 train like eager",
}


# Through ``--route dynamo`` (``torch.compile(model, backend=pullback_backend)``), the families above that still do
# not train like eager, with the reason (by default that route runs the families EXPECTED above: Dynamo runs the
# branches on tensor values eagerly between graphs, so most of them train there)
EXPECTED_DYNAMO = {
    "fsmt": "in float64 eager fails (finfo(float64).min written into a float32 mask)",
    "nystromformer": "Dynamo itself fails (fake tensors: the (batch, 1, seq, seq) mask against the landmark scores), "
                     "with aot_eager too",
}


def _compiled(model, inputs, target: str, route: str):
    if route == "dynamo":
        import functools

        import torch._dynamo

        from pullback.integrations.dynamo_backend import pullback_backend

        torch._dynamo.reset()  # every family's LossOf.forward is the same code: a fresh cache, no recompile limit
        # SpecAugment draws with np.random: by default Dynamo draws those from torch's generator instead
        torch._dynamo.config.use_numpy_random_stream = True
        return torch.compile(model, backend=functools.partial(pullback_backend, target=target))
    return pbt.compile(model, inputs, target=target)


def run(name: str, target: str, dtype: str, route: str = "export") -> tuple[str, str]:
    """``(status, detail)``: the first step's loss and every gradient against eager's (relative to the largest
    gradient), then three SGD steps side by side (their losses, for the record: a tiny model whose gradients are
    in the thousands diverges from rounding alone)."""
    torch.manual_seed(0)
    model, inputs = FAMILIES[name]()
    if dtype == "float64":
        model, inputs = model.double(), tuple(x.double() if x.is_floating_point() else x for x in inputs)
    model.train()
    eager = copy.deepcopy(model)
    try:
        first = eager(*inputs)
    except Exception as e:  # noqa: BLE001 - the family itself does not run so
        return "SKIPPED", f"eager PyTorch fails in {dtype}: {type(e).__name__}: {e}"
    if not torch.isfinite(first).all():  # e.g. CANINE in float64: finfo(float64).min written into a float32 mask
        return "SKIPPED", f"eager PyTorch's loss is not finite in {dtype} ({first.item()})"
    compiled = _compiled(model, inputs, target, route)
    grads = []
    for m in (eager, compiled):
        torch.manual_seed(1)  # the same dropout masks (and SpecAugment's, drawn with np.random)
        np.random.seed(1)
        loss = m(*inputs)
        loss.backward()
        grads.append((loss.item(), [p.grad for p in (m.parameters() if m is eager else model.parameters())]))
    (le, ge), (lp, gp) = grads
    scale = max((float(g.abs().max()) for g in ge if g is not None), default=1.0) or 1.0
    worst = max((float((a - b).abs().max()) / scale for a, b in zip(ge, gp) if a is not None and b is not None), default=0.0)
    missing = sum((a is None) != (b is None) for a, b in zip(ge, gp))
    loss_gap = abs(le - lp) / max(abs(le), 1e-12)
    ok = loss_gap < 1e-5 and worst < 1e-5 and not missing
    torch.manual_seed(0)
    model, inputs = FAMILIES[name]()
    if dtype == "float64":
        model, inputs = model.double(), tuple(x.double() if x.is_floating_point() else x for x in inputs)
    if route == "dynamo":
        torch._dynamo.reset()
    res = pbt.train_side_by_side(model.train(), [(inputs, None)] * 3, lambda loss, _: loss, lr=LR, target=target,
                                 verbose=False, route=route)
    steps = max(abs(e - p) / max(abs(e), 1e-12) for e, p in zip(res["eager"], res["pullback"]))
    return ("OK" if ok else "DIFF"), (f"first step: loss {loss_gap:.1e}, gradients {worst:.1e} apart (relative to "
                                      f"the largest, {scale:.2g}); 3 steps: losses {steps:.1e} apart")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="families to run (default: all)")
    ap.add_argument("--target", default="torch", choices=pbt.TARGETS)
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"),
                    help="float64 (default) keeps tiny BatchNorm batches from amplifying float32 rounding")
    ap.add_argument("--route", default="export", choices=("export", "dynamo"),
                    help="export: pullback.integrations.torch.compile (default); dynamo: torch.compile with pullback's "
                         "backend (default families: those EXPECTED to fail through export)")
    args = ap.parse_args(argv)
    expected = EXPECTED_DYNAMO if args.route == "dynamo" else EXPECTED
    bad = 0
    for name in args.names or (list(EXPECTED) if args.route == "dynamo" else list(FAMILIES)):
        t0 = time.perf_counter()
        try:
            status, detail = run(name, args.target, args.dtype, args.route)
            if status == "DIFF" and name in expected:
                status, detail = "EXPECTED", f"{expected[name]} ({detail})"
        except Exception as e:  # noqa: BLE001 - the census reports every failure and goes on
            status = "EXPECTED" if name in expected else "ERROR"
            detail = expected.get(name) or f"{type(e).__name__}: {str(e)[:300]}".replace("\n", " ")
        bad += status in ("DIFF", "ERROR")
        print(f"{name:18s} {status:9s} {time.perf_counter() - t0:5.1f}s  {detail}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
