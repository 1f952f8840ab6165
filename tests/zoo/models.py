"""The model zoo: popular architectures with tiny configs and random weights, each returning its training loss.

``ZOO[name]()`` gives ``(module, inputs)``: ``module(*inputs)`` is a scalar loss. HF models are built from their
config classes (no downloads); the ResNet follows torchvision's layout, written out (torchvision's wheel does not
match torch 2.13 here).
"""

from __future__ import annotations



import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, BATCH = 40, 6, 2


class LossOf(nn.Module):
    """A HF model called with keyword inputs; ``forward(*inputs)`` returns ``.loss``."""

    def __init__(self, model, keys):
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, *inputs):
        return self.model(**dict(zip(self.keys, inputs))).loss


def _ids(*shape, low=1):
    return torch.randint(low, VOCAB, shape)


def bert():
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, 4:] = 0
    return LossOf(BertForSequenceClassification(cfg), ("input_ids", "attention_mask", "labels")), (
        _ids(BATCH, SEQ), mask, torch.tensor([0, 2]))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    ids = _ids(BATCH, SEQ)
    return LossOf(GPT2LMHeadModel(cfg), ("input_ids", "labels")), (ids, ids.clone())


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, num_labels=3, hidden_dropout_prob=0.1)
    return LossOf(ViTForImageClassification(cfg), ("pixel_values", "labels")), (torch.randn(BATCH, 3, 8, 8), torch.tensor([0, 2]))


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                   relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0, dropout_rate=0.1)
    return LossOf(T5ForConditionalGeneration(cfg), ("input_ids", "labels")), (_ids(BATCH, SEQ), _ids(BATCH, 4))


def bart():
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16,
                     pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, dropout=0.1)
    return LossOf(BartForConditionalGeneration(cfg), ("input_ids", "labels")), (_ids(BATCH, SEQ, low=3), _ids(BATCH, 4, low=3))


def llama():
    """The Llama family's block (Mistral, Qwen, Gemma share it): RMSNorm, rotary positions, grouped-query attention
    (one key/value head for two query heads), a SiLU-gated MLP."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=16, attention_dropout=0.1)
    ids = _ids(BATCH, SEQ)
    return LossOf(LlamaForCausalLM(cfg), ("input_ids", "labels")), (ids, ids.clone())


def falcon():
    """Multi-query attention split from one fused projection with negative list indices (``qkv[..., [-2], :]``)."""
    from transformers import FalconConfig, FalconForCausalLM

    cfg = FalconConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, hidden_dropout=0.1)
    ids = _ids(BATCH, SEQ)
    return LossOf(FalconForCausalLM(cfg), ("input_ids", "labels")), (ids, ids.clone())


# ------------------------------------------------------------------ ResNet (torchvision's layout)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.resnet.ResNet with BasicBlock (stem, maxpool, four stages, avgpool, fc), narrow."""

    def __init__(self, layers=(1, 1, 1, 1), widths=(4, 8, 8, 8), num_classes=3):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(widths[0], layers[0])
        self.layer2 = self._make_layer(widths[1], layers[1], 2)
        self.layer3 = self._make_layer(widths[2], layers[2], 2)
        self.layer4 = self._make_layer(widths[3], layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x, y):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return F.cross_entropy(self.fc(torch.flatten(self.avgpool(x), 1)), y)


def resnet():
    return ResNet(), (torch.randn(4, 3, 64, 64), torch.tensor([1, 2, 0, 1]))


# ------------------------------------------------------------------ U-Nets


def _double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    """Two down steps, two up steps with skip connections joined by ``torch.cat``; ``up`` is a transposed
    convolution or ``nn.Upsample`` (bilinear) followed by a 1x1 convolution. Loss: per-pixel cross-entropy."""

    def __init__(self, upsample: bool, c=4, classes=3):
        super().__init__()
        self.inc = _double_conv(3, c)
        self.down1 = nn.Sequential(nn.MaxPool2d(2), _double_conv(c, 2 * c))
        self.down2 = nn.Sequential(nn.MaxPool2d(2), _double_conv(2 * c, 4 * c))

        def up(cin, cout):
            if upsample:
                return nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), nn.Conv2d(cin, cout, 1))
            return nn.ConvTranspose2d(cin, cout, 2, stride=2)

        self.up1, self.conv1 = up(4 * c, 2 * c), _double_conv(4 * c, 2 * c)
        self.up2, self.conv2 = up(2 * c, c), _double_conv(2 * c, c)
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x, y):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        u = self.conv1(torch.cat([x2, self.up1(x3)], dim=1))
        u = self.conv2(torch.cat([x1, self.up2(u)], dim=1))
        return F.cross_entropy(self.out(u), y)


def unet_transpose():
    return UNet(upsample=False), (torch.randn(BATCH, 3, 8, 8), torch.randint(0, 3, (BATCH, 8, 8)))


def unet_upsample():
    return UNet(upsample=True), (torch.randn(BATCH, 3, 8, 8), torch.randint(0, 3, (BATCH, 8, 8)))


# ------------------------------------------------------------------ RNN classifiers


class RNNClassifier(nn.Module):
    def __init__(self, cell: str, hidden=8, classes=3):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8, padding_idx=0)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(8, hidden, num_layers=1, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, ids, y):
        out, _ = self.rnn(self.emb(ids))
        return F.cross_entropy(self.fc(out[:, -1]), y)


def lstm():
    ids = _ids(BATCH, SEQ)
    ids[0, :2] = 0  # padding rows: no gradient for the padding embedding
    return RNNClassifier("lstm"), (ids, torch.tensor([0, 2]))


def gru():
    ids = _ids(BATCH, SEQ)
    ids[1, :1] = 0
    return RNNClassifier("gru"), (ids, torch.tensor([1, 0]))


# ------------------------------------------------------------------ causal LMs that build positions and masks in forward


class CausalLM(nn.Module):
    """A one-block causal LM: positions from ``torch.arange`` in forward; attention through
    ``F.scaled_dot_product_attention`` with ``is_causal=True`` or with a ``tril`` mask built in forward."""

    def __init__(self, masking: str, d=16, heads=2):
        super().__init__()
        self.masking, self.heads = masking, heads
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(16, d)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.1))
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, ids, targets):
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device)
        x = self.tok(ids) + self.pos(pos)[None]
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        if self.masking == "is_causal":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1 if self.training else 0.0)
        else:
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=ids.device))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        x = x + self.mlp(self.ln2(x))
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def causal_sdpa():
    ids = _ids(BATCH, SEQ)
    return CausalLM("is_causal"), (ids, torch.roll(ids, -1, 1))


def causal_tril():
    ids = _ids(BATCH, SEQ)
    return CausalLM("tril"), (ids, torch.roll(ids, -1, 1))


# ------------------------------------------------------------------ MLP


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.GELU(approximate="tanh"), nn.Dropout(0.2), nn.Linear(16, 16), nn.SiLU(),
                                 nn.Linear(16, 8), nn.LeakyReLU(0.1), nn.Linear(8, 2))

    def forward(self, x, y):
        return F.mse_loss(self.net(x), y)


def mlp():
    return MLP(), (torch.randn(8, 5), torch.randn(8, 2))


# ------------------------------------------------------------------ architectures users bring besides these families


class InvertedResidual(nn.Module):
    """MobileNetV3's block: pointwise expansion (ReLU6), a depthwise 3x3 (hardswish), squeeze-and-excitation (a global
    pool gating the channels through SiLU and sigmoid), a linear projection and the residual."""

    def __init__(self, c, expand=4, squeeze=4):
        super().__init__()
        e = c * expand
        self.expand, self.bn1 = nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e)
        self.depthwise, self.bn2 = nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e)
        self.se_down, self.se_up = nn.Conv2d(e, squeeze, 1), nn.Conv2d(squeeze, e, 1)
        self.project, self.bn3 = nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        h = F.relu6(self.bn1(self.expand(x)))
        h = F.hardswish(self.bn2(self.depthwise(h)))
        h = h * torch.sigmoid(self.se_up(F.silu(self.se_down(F.adaptive_avg_pool2d(h, 1)))))
        return x + self.bn3(self.project(h))


class MobileNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(InvertedResidual(8), InvertedResidual(8))
        self.fc = nn.Linear(8, classes)

    def forward(self, x, y):
        return F.cross_entropy(self.fc(self.blocks(self.stem(x)).mean((2, 3))), y, label_smoothing=0.1)


def mobilenet():
    return MobileNet(), (torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 4]))


class PaddedSelfAttention(nn.Module):
    """``nn.MultiheadAttention`` (batch first, dropout) over a padded batch: ``key_padding_mask`` from the ids, the
    averaged attention weights returned and used; targets of the padding ignored (``ignore_index``)."""

    def __init__(self, d=16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d, padding_idx=0)
        self.attn = nn.MultiheadAttention(d, 2, dropout=0.1, batch_first=True)
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, ids, targets):
        h = self.emb(ids)
        a, weights = self.attn(h, h, h, key_padding_mask=ids == 0, need_weights=True)
        logits = self.out(self.ln(h + a))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0) + weights.pow(2).mean()


def padded_mha():
    ids = _ids(BATCH, SEQ)
    ids[0, 4:] = 0
    ids[1, 5:] = 0
    targets = torch.roll(ids, -1, 1)
    return PaddedSelfAttention(), (ids, targets)


class AudioClassifier(nn.Module):
    """Strided and dilated 1-D convolutions with GroupNorm, then a bidirectional GRU pooled by its maximum."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv1, self.norm = nn.Conv1d(1, 8, 9, stride=2, padding=4), nn.GroupNorm(2, 8)
        self.conv2 = nn.Conv1d(8, 8, 5, dilation=2, padding=4)
        self.gru = nn.GRU(8, 6, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(12, classes)

    def forward(self, wave, y):
        h = F.elu(self.conv2(F.gelu(self.norm(self.conv1(wave)))))
        out, _ = self.gru(h.transpose(1, 2))
        return F.nll_loss(F.log_softmax(self.fc(out.amax(1)), -1), y)


def audio():
    return AudioClassifier(), (torch.randn(3, 1, 32), torch.tensor([0, 2, 1]))


class ImageToImage(nn.Module):
    """Image-to-image operators: InstanceNorm, a learned affine warp (``affine_grid`` + ``grid_sample``), bilinear
    upsampling, ``pixel_shuffle`` / ``pixel_unshuffle``; smooth-L1 and L1 losses."""

    def __init__(self):
        super().__init__()
        self.down, self.norm = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True)
        self.theta = nn.Parameter(torch.tensor([[1.0, 0.1, 0.0], [0.05, 0.9, 0.1]]))
        self.up = nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x, target):
        h = F.leaky_relu(self.norm(self.down(x)), 0.2)
        grid = F.affine_grid(self.theta.expand(x.shape[0], 2, 3), h.shape, align_corners=False)
        h = F.grid_sample(h, grid, padding_mode="border", align_corners=False)
        coarse = F.interpolate(F.avg_pool2d(h, 2), scale_factor=2, mode="bilinear", align_corners=False)
        fine = F.pixel_shuffle(torch.cat([h, coarse], 1), 2)  # 16 channels -> 4 at twice the size
        out = self.up(F.pixel_unshuffle(fine, 2)[:, :8])
        return F.smooth_l1_loss(out, target) + F.l1_loss(fine.mean(), target.mean())


def image_to_image():
    return ImageToImage(), (torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8))


class CheckpointedBlock(nn.Module):
    """Activation checkpointing (``torch.utils.checkpoint``, non-reentrant) around a weight-normalised MLP
    (``parametrizations.weight_norm``), RMSNorm, and a KL-divergence term."""

    def __init__(self, d=10):
        super().__init__()
        self.l1 = nn.utils.parametrizations.weight_norm(nn.Linear(d, 2 * d))
        self.l2 = nn.Linear(2 * d, d)
        self.norm = nn.RMSNorm(d)

    def mlp(self, x):
        return self.l2(F.silu(self.l1(x)))

    def forward(self, x, y):
        h = torch.utils.checkpoint.checkpoint(self.mlp, x, use_reentrant=False)
        return F.mse_loss(self.norm(h + x), y) + F.kl_div(F.log_softmax(h, -1), F.softmax(y, -1), reduction="batchmean")


def checkpointed():
    return CheckpointedBlock(), (torch.randn(6, 10), torch.randn(6, 10))


class VideoClassifier(nn.Module):
    """3-D convolution, batch norm and max pooling over (frames, height, width) clips."""

    def __init__(self, classes=5):
        super().__init__()
        self.conv, self.bn, self.pool = nn.Conv3d(3, 4, 3, padding=1), nn.BatchNorm3d(4), nn.MaxPool3d(2)
        self.fc = nn.Linear(4 * 2 * 4 * 4, classes)

    def forward(self, clips, y):
        return F.cross_entropy(self.fc(self.pool(F.relu(self.bn(self.conv(clips)))).flatten(1)), y)


def video():
    return VideoClassifier(), (torch.randn(2, 3, 4, 8, 8), torch.tensor([1, 3]))


class Seq2SeqDecoder(nn.Module):
    """``nn.TransformerDecoder`` (two layers, dropout) over a padded target with a causal mask and an encoder's
    memory; cross-entropy with label smoothing, the padding ignored."""

    def __init__(self, d=16):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d, padding_idx=0)
        layer = nn.TransformerDecoderLayer(d, 2, 2 * d, dropout=0.1, batch_first=True)
        self.dec, self.out = nn.TransformerDecoder(layer, 2), nn.Linear(d, VOCAB)

    def forward(self, ids, memory, targets):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        h = self.dec(self.emb(ids), memory, tgt_mask=mask, tgt_is_causal=True)
        return F.cross_entropy(self.out(h).flatten(0, 1), targets.flatten(), ignore_index=0, label_smoothing=0.1)


def transformer_decoder():
    ids = _ids(BATCH, SEQ + 1)
    ids[1, 5:] = 0
    return Seq2SeqDecoder(), (ids, torch.randn(BATCH, 5, 16), torch.roll(ids, -1, 1))


class VAE(nn.Module):
    """A variational autoencoder: the reparameterised sample (``torch.randn_like`` in forward), a Bernoulli
    reconstruction loss and the Gaussian KL term."""

    def __init__(self, d=16, z=4):
        super().__init__()
        self.enc, self.mu, self.log_var, self.dec = nn.Linear(d, 8), nn.Linear(8, z), nn.Linear(8, z), nn.Linear(z, d)

    def forward(self, x):
        h = F.relu(self.enc(x))
        mu, log_var = self.mu(h), self.log_var(h)
        sample = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
        kl = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())
        return F.binary_cross_entropy(torch.sigmoid(self.dec(sample)), x, reduction="sum") + kl


def vae():
    return VAE(), (torch.rand(8, 16),)


ZOO = {f.__name__: f for f in (bert, gpt2, vit, t5, bart, llama, falcon, resnet, unet_transpose, unet_upsample, lstm, gru, causal_sdpa,
                               causal_tril, mlp, mobilenet, padded_mha, audio, image_to_image, checkpointed, video,
                               transformer_decoder, vae)}


# ------------------------------------------------------------------ models torch.export cannot trace


class CTCRecognizer(nn.Module):
    """A bidirectional LSTM over feature frames trained with the CTC loss: its lengths are tensors, so the size of
    its alignment table depends on their values."""

    def __init__(self, features=8, symbols=6):
        super().__init__()
        self.rnn, self.fc = nn.LSTM(features, 16, batch_first=True, bidirectional=True), nn.Linear(32, symbols)

    def forward(self, frames, targets, frame_lengths, target_lengths):
        h, _ = self.rnn(frames)
        log_probs = F.log_softmax(self.fc(h), -1).transpose(0, 1)
        return F.ctc_loss(log_probs, targets, frame_lengths, target_lengths, zero_infinity=True)


def ctc():
    return CTCRecognizer(), (torch.randn(2, 12, 8), torch.randint(1, 6, (2, 4)), torch.tensor([12, 10]), torch.tensor([4, 3]))


class PackedClassifier(nn.Module):
    """A GRU over a ``PackedSequence`` of unsorted lengths: the packed batch sizes come from the lengths' values."""

    def __init__(self, classes=2):
        super().__init__()
        self.emb, self.rnn, self.fc = nn.Embedding(VOCAB, 8), nn.GRU(8, 8, batch_first=True), nn.Linear(8, classes)

    def forward(self, ids, lengths, y):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(ids), lengths, batch_first=True, enforce_sorted=False)
        return F.cross_entropy(self.fc(self.rnn(packed)[1][-1]), y)


def packed_gru():
    return PackedClassifier(), (_ids(3, SEQ), torch.tensor([6, 3, 4]), torch.tensor([0, 1, 1]))


class SparseGCN(nn.Module):
    """A graph convolution over a sparse COO adjacency matrix (``torch.sparse.mm``)."""

    def __init__(self, features=5, classes=3):
        super().__init__()
        self.lin = nn.Linear(features, classes)

    def forward(self, x, adjacency, y):
        return F.cross_entropy(torch.sparse.mm(adjacency, self.lin(x)), y)


def sparse_gcn():
    edges = torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3]])
    adjacency = torch.sparse_coo_tensor(edges, torch.full((7,), 0.5), (6, 6))
    return SparseGCN(), (torch.randn(6, 5), adjacency, torch.randint(0, 3, (6,)))


class HostMatching(nn.Module):
    """DETR-style: each prediction matched to its nearest target by NumPy on the detached costs, then an L1 loss."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 4)

    def forward(self, x, targets):
        pred = self.head(x)
        nearest = torch.as_tensor(torch.cdist(pred, targets).detach().numpy().argmin(1))
        return F.l1_loss(pred, targets[nearest])


def host_matching():
    return HostMatching(), (torch.randn(5, 4), torch.randn(5, 4))


# each with the words of the error from_torch gives (what to do instead, or torch.compile)
TORCH_COMPILE_ONLY = {ctc: "ctc_loss.*mask", packed_gru: "pack_padded_sequence.*mask", sparse_gcn: "sparse_coo tensor.*to_dense",
                      host_matching: "into NumPy"}

