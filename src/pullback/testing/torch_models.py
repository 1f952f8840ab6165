"""PyTorch training workloads shared by ``bench/torch_train.py`` and the integration tests (issue 14).

Each workload is a ``torch.nn.Module`` whose ``forward(*inputs)`` returns the
scalar training loss (model and loss in one module), so eager PyTorch,
``torch.compile`` and ``pullback.integrations.torch.compile`` train exactly the
same thing. ``make_workload(name, small=False)`` returns a :class:`TorchWorkload`;
``small=True`` gives sizes for the test suite. Dropout is off everywhere (the
masks would differ between runs of different systems, not the arithmetic).

- ``transformer``: ``nn.TransformerEncoderLayer(256, 4, 1024, gelu, batch_first)``, seq 128, batch 8, MSE loss;
- ``bert``: Hugging Face ``BertLayer`` (hidden 256, 4 heads, ff 1024, eager attention), seq 128, batch 8, MSE;
- ``cnn``: the BN-CNN (``testing.models.cnn``'s layout with batch norm): conv-bn-relu-maxpool twice,
  global average pool, linear; 32x32 images, batch 32, cross-entropy;
- ``resnet``: ResNet-18 in torchvision's layout (``BasicBlock``, names as torchvision's, so its
  state_dict loads), 10 classes, 32x32 images, batch 16, cross-entropy;
- ``gpt2``: a tiny Hugging Face ``GPT2LMHeadModel`` (2 layers, d256, 4 heads, vocab 1024), seq 128, batch 8,
  its own causal-LM loss.

``transformers`` is imported only by the workloads that need it. This module imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class TorchWorkload:
    """A loss module and how to draw its batches: ``model(*batch(seed))`` is the scalar loss."""

    name: str
    model: nn.Module
    batch: Callable[[int], tuple]
    description: str

    @property
    def example_inputs(self) -> tuple:
        return self.batch(0)


class LossOf(nn.Module):
    """``loss(net(*inputs), target)``: the network (``.net``) and its loss as one module."""

    def __init__(self, net: nn.Module, loss: Callable):
        super().__init__()
        self.net = net
        self.loss = loss

    def forward(self, *inputs_and_target):
        *inputs, target = inputs_and_target
        return self.loss(self.net(*inputs), target)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _regression_batch(shape: tuple) -> Callable[[int], tuple]:
    def batch(seed: int) -> tuple:
        g = _generator(1000 + seed)
        return torch.randn(shape, generator=g), torch.randn(shape, generator=g)

    return batch


def _image_batch(n: int, channels: int, size: int, classes: int) -> Callable[[int], tuple]:
    def batch(seed: int) -> tuple:
        g = _generator(1000 + seed)
        return torch.randn(n, channels, size, size, generator=g), torch.randint(0, classes, (n,), generator=g)

    return batch


# ------------------------------------------------------------------ the five workloads


def transformer(small: bool = False) -> TorchWorkload:
    d, h, ff, s, b = (32, 4, 64, 16, 2) if small else (256, 4, 1024, 128, 8)
    net = nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, activation="gelu", batch_first=True)
    return TorchWorkload("transformer", LossOf(net, F.mse_loss), _regression_batch((b, s, d)),
                         f"TransformerEncoderLayer d{d} h{h} ff{ff}, seq {s}, batch {b}, MSE")


def bert(small: bool = False) -> TorchWorkload:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    d, h, ff, s, b = (32, 4, 64, 16, 2) if small else (256, 4, 1024, 128, 8)
    cfg = BertConfig(hidden_size=d, num_attention_heads=h, intermediate_size=ff, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, attn_implementation="eager")
    return TorchWorkload("bert", LossOf(BertLayer(cfg), F.mse_loss), _regression_batch((b, s, d)),
                         f"HF BertLayer hidden {d} h{h} ff{ff}, seq {s}, batch {b}, MSE")


class BNCNN(nn.Module):
    """conv-bn-relu-maxpool twice, global average pool, linear (``testing.models.cnn`` with batch norm)."""

    def __init__(self, channels=(3, 16, 32), classes: int = 10):
        super().__init__()
        c0, c1, c2 = channels
        self.features = nn.Sequential(
            nn.Conv2d(c0, c1, 3, padding=1, bias=False), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2), nn.ReLU(), nn.MaxPool2d(2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c2, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.features(x)), 1))


def cnn(small: bool = False) -> TorchWorkload:
    b, size, channels = (4, 8, (3, 4, 8)) if small else (32, 32, (3, 16, 32))
    return TorchWorkload("cnn", LossOf(BNCNN(channels), F.cross_entropy), _image_batch(b, 3, size, 10),
                         f"BN-CNN channels {channels}, {size}x{size}, batch {b}, cross-entropy")


class BasicBlock(nn.Module):
    """torchvision's ``BasicBlock`` (same attribute names)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` with ``BasicBlock`` (stem 7x7/2 + maxpool, four stages, average pool, fc).

    ``ResNet((2, 2, 2, 2))`` is resnet18; ``width`` scales the stage widths (64 in torchvision).
    """

    def __init__(self, layers=(2, 2, 2, 2), num_classes: int = 1000, width: int = 64):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet(small: bool = False) -> TorchWorkload:
    layers, width, b = ((1, 1, 1, 1), 8, 8) if small else ((2, 2, 2, 2), 64, 16)
    size = 32
    net = ResNet(layers, num_classes=10, width=width)
    return TorchWorkload("resnet", LossOf(net, F.cross_entropy), _image_batch(b, 3, size, 10),
                         f"ResNet-18 layout blocks {layers} width {width}, {size}x{size}, batch {b}, cross-entropy")


class CausalLM(nn.Module):
    """``model(input_ids, labels=labels).loss`` of a Hugging Face causal LM, as a loss module; an
    ``attention_mask`` (a padded batch) is passed on when given."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, labels, attention_mask=None):
        return self.lm(input_ids=input_ids, labels=labels, attention_mask=attention_mask, use_cache=False).loss


def gpt2(small: bool = False) -> TorchWorkload:
    from transformers import GPT2Config, GPT2LMHeadModel

    vocab, d, h, n_layer, s, b = (64, 32, 4, 1, 16, 2) if small else (1024, 256, 4, 2, 128, 8)
    cfg = GPT2Config(vocab_size=vocab, n_positions=s, n_embd=d, n_layer=n_layer, n_head=h, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=vocab - 1, eos_token_id=vocab - 1,
                     use_cache=False, loss_type="ForCausalLM", attn_implementation="eager")

    def batch(seed: int) -> tuple:
        ids = torch.randint(0, vocab, (b, s), generator=_generator(1000 + seed))
        return ids, ids

    return TorchWorkload("gpt2", CausalLM(GPT2LMHeadModel(cfg)), batch,
                         f"HF GPT2LMHeadModel {n_layer} layers d{d} h{h} vocab {vocab}, seq {s}, batch {b}, LM loss")


WORKLOADS: dict[str, Callable[..., TorchWorkload]] = {
    "transformer": transformer, "bert": bert, "cnn": cnn, "resnet": resnet, "gpt2": gpt2}


# ------------------------------------------------------------------ the first models users bring


def mnist_mlp(small: bool = False) -> TorchWorkload:
    hidden, b = (16, 4) if small else (256, 64)
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    return TorchWorkload("mnist_mlp", LossOf(net, F.cross_entropy), _image_batch(b, 1, 28, 10),
                         f"MLP 784-{hidden}-10 on 28x28, batch {b}, cross-entropy")


class MNISTNet(nn.Module):
    """The network of PyTorch's MNIST example (pytorch/examples ``mnist/main.py``), its log-softmax included."""

    def __init__(self, c1: int = 32, c2: int = 64, size: int = 28, hidden: int = 128):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, c1, 3, 1), nn.Conv2d(c1, c2, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1, self.fc2 = nn.Linear(c2 * ((size - 4) // 2) ** 2, hidden), nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def mnist_cnn(small: bool = False) -> TorchWorkload:
    c1, c2, size, hidden, b = (4, 8, 12, 16, 4) if small else (32, 64, 28, 128, 64)
    return TorchWorkload("mnist_cnn", LossOf(MNISTNet(c1, c2, size, hidden), F.nll_loss), _image_batch(b, 1, size, 10),
                         f"PyTorch's MNIST example network ({c1}/{c2} channels, {size}x{size}), batch {b}, NLL")


class LSTMLanguageModel(nn.Module):
    """Embedding, a two-layer ``nn.LSTM`` and a linear head, cross-entropy over every position."""

    def __init__(self, vocab: int, d: int, hidden: int):
        super().__init__()
        self.embed, self.rnn, self.head = nn.Embedding(vocab, d), nn.LSTM(d, hidden, 2, batch_first=True), nn.Linear(hidden, vocab)

    def forward(self, ids, labels):
        return F.cross_entropy(self.head(self.rnn(self.embed(ids))[0]).flatten(0, 1), labels.flatten())


def lstm_lm(small: bool = False) -> TorchWorkload:
    vocab, d, hidden, s, b = (50, 16, 32, 6, 2) if small else (1000, 128, 256, 32, 16)

    def batch(seed: int) -> tuple:
        g = _generator(1000 + seed)
        return torch.randint(0, vocab, (b, s), generator=g), torch.randint(0, vocab, (b, s), generator=g)

    return TorchWorkload("lstm_lm", LSTMLanguageModel(vocab, d, hidden), batch,
                         f"LSTM LM: 2-layer nn.LSTM {d}->{hidden}, vocab {vocab}, seq {s}, batch {b}")


class ViT(nn.Module):
    """A small vision transformer: patch convolution, class token, learnt positions, pre-norm encoder layers."""

    def __init__(self, size: int, patch: int, d: int, heads: int, layers: int, classes: int = 10):
        super().__init__()
        n = (size // patch) ** 2
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls, self.pos = nn.Parameter(torch.zeros(1, 1, d)), nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, 0.1, activation="gelu", batch_first=True, norm_first=True)
        self.encoder, self.head = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(d, classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], 1) + self.pos
        return self.head(self.encoder(h)[:, 0])


def vit(small: bool = False) -> TorchWorkload:
    size, d, heads, layers, b = (8, 16, 2, 1, 2) if small else (32, 192, 3, 4, 32)
    return TorchWorkload("vit", LossOf(ViT(size, 4, d, heads, layers), F.cross_entropy), _image_batch(b, 3, size, 10),
                         f"ViT d{d} h{heads} {layers} layers, patches 4x4 of {size}x{size}, batch {b}, cross-entropy")


class UNet(nn.Module):
    """A two-level U-Net: group and instance norms, SiLU and Mish, a transposed-convolution upsampling and a skip
    connection, a bilinear resize."""

    def __init__(self, c: int):
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(4, c), nn.SiLU())
        self.down2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.InstanceNorm2d(2 * c, affine=True), nn.SiLU())
        self.up = nn.ConvTranspose2d(2 * c, c, 2, 2)
        self.fuse = nn.Sequential(nn.Conv2d(2 * c, c, 3, padding=1), nn.Mish())
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        a = self.down1(x)
        u = self.fuse(torch.cat([self.up(self.down2(F.max_pool2d(a, 2))), a], 1))
        return self.out(F.interpolate(u, scale_factor=0.5, mode="bilinear", align_corners=True))


def unet(small: bool = False) -> TorchWorkload:
    c, size, b = (4, 8, 2) if small else (8, 32, 16)

    def batch(seed: int) -> tuple:
        g = _generator(1000 + seed)
        return torch.randn(b, 3, size, size, generator=g), (torch.rand(b, 1, size // 2, size // 2, generator=g) > 0.5).float()

    return TorchWorkload("unet", LossOf(UNet(c), F.binary_cross_entropy_with_logits), batch,
                         f"U-Net {c}/{2 * c} channels, {size}x{size}, batch {b}, BCE with logits")


# models users try first (bench/torch_train.py --first): not the five, measured beside them
FIRST_MODELS: dict[str, Callable[..., TorchWorkload]] = {
    "mnist_mlp": mnist_mlp, "mnist_cnn": mnist_cnn, "lstm_lm": lstm_lm, "vit": vit, "unet": unet}


def make_workload(name: str, small: bool = False, seed: int = 0) -> TorchWorkload:
    """The workload ``name`` (one of ``WORKLOADS`` or ``FIRST_MODELS``) with its weights drawn from
    ``torch.manual_seed(seed)``."""
    known = {**WORKLOADS, **FIRST_MODELS}
    if name not in known:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(known)}")
    torch.manual_seed(seed)
    return known[name](small)


__all__ = ["TorchWorkload", "LossOf", "BNCNN", "BasicBlock", "ResNet", "CausalLM", "WORKLOADS", "make_workload",
           "transformer", "bert", "cnn", "resnet", "gpt2", "FIRST_MODELS", "MNISTNet", "LSTMLanguageModel", "ViT", "UNet",
           "mnist_mlp", "mnist_cnn", "lstm_lm", "vit", "unet"]
