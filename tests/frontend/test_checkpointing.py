"""Activation checkpointing (``torch.utils.checkpoint``, Hugging Face's ``gradient_checkpointing_enable``) trains
like eager: the checkpointed function runs as plain code (export_repairs.checkpoints_as_plain_calls; the
torch.compile backend inlines Dynamo's ``tag_activation_checkpoint``). The reentrant form used to train with no
gradient at all: its autograd Function runs the function under no_grad."""

import copy

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from pullback.integrations.torch import check_side_by_side, compile as pb_compile, train_side_by_side


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.drop = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Dropout(0.3)

    def forward(self, x):
        return self.b(self.drop(torch.tanh(self.a(x))))


class _Checkpointed(torch.nn.Module):
    """Two checkpointed blocks with dropout inside (eager recomputes them with the same draws), then a head."""

    def __init__(self, reentrant: bool):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])
        self.head = torch.nn.Linear(4, 1)
        self.reentrant = reentrant

    def forward(self, x):
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=self.reentrant)
        return self.head(x).pow(2).mean()


def _batches():
    # the reentrant form needs an input that requires grad for eager to differentiate the block at all
    return [((torch.randn(5, 4).requires_grad_(True),), None) for _ in range(3)]


@pytest.mark.parametrize("target", ["torch", "numpy"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_a_checkpointed_model_trains_like_eager(reentrant, target):
    torch.manual_seed(0)
    batches = _batches()
    result = train_side_by_side(_Checkpointed(reentrant).train(), batches, lambda loss, _: loss, target=target,
                                verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-6, verbose=False)


def _same_step(eager, compiled, trained, *inputs):
    """One step eagerly and compiled, with the same draws: every parameter of ``trained`` (the module
    ``compiled`` trains) gets eager's gradient."""
    for m in (eager, compiled):
        torch.manual_seed(1)
        m(*inputs).backward()
    for p, q in zip(eager.parameters(), trained.parameters()):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_torch_compile_backend_inlines_checkpoints(reentrant):
    import pullback.integrations.dynamo_backend  # noqa: F401  (registers the backend)

    torch.manual_seed(0)
    model = _Checkpointed(reentrant).train()
    eager = copy.deepcopy(model)
    _same_step(eager, torch.compile(model, backend="pullback"), model, torch.randn(5, 4, requires_grad=True))


class _LMLoss(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids, labels=ids, use_cache=False).loss


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_hugging_face_activation_checkpointing_trains_like_eager(reentrant):
    """``activation_checkpointing_enable`` on a GPT-2 with dropout; reentrant is what older transformers used by
    default and what recipes still pass."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": reentrant})
    trained = _LMLoss(model.train())
    eager = copy.deepcopy(trained)
    ids = torch.randint(0, 64, (2, 8))
    _same_step(eager, pb_compile(trained, (ids,)), trained, ids)
