"""Training through ``pullback.integrations.torch.compile(..., policy="min_cut")`` matches eager PyTorch and the
forward hands fewer activation bytes to the backward than ``save_all`` (the cut priced for the compile target)."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("networkx")  # min_cut's max-flow

from pullback import analysis  # noqa: E402
from pullback.integrations.torch import check_side_by_side, train_side_by_side  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402
from pullback.testing.torch_models import make_workload  # noqa: E402
from pullback.transform import PartitionForwardBackward  # noqa: E402

STEPS = 3
TARGETS = ["numpy", "torch"] + (["jax"] if importlib.util.find_spec("jax") else [])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["transformer", "bert", "cnn", "resnet", "gpt2"])
def test_min_cut_training_tracks_eager(name, target):
    wl = make_workload(name, small=True)
    batches = [(wl.batch(step), None) for step in range(STEPS)]
    result = train_side_by_side(wl.model, batches, lambda loss, _: loss, lr=0.01, target=target, policy="min_cut",
                                verbose=False)
    check_side_by_side(result, rtol=1e-5, atol=1e-5, verbose=False)


@pytest.mark.parametrize("target", TARGETS)
def test_min_cut_saves_fewer_activation_bytes(target):
    wl = make_workload("transformer", small=True)
    (tp,) = pb_compile(wl.model, wl.example_inputs, target=target, policy="min_cut")._programs.values()
    save_all = PartitionForwardBackward("main_grad", policy="save_all")(tp.mod)
    assert analysis.saved_bytes(tp.mod, inputs=False) <= 0.6 * analysis.saved_bytes(save_all, inputs=False)


def _activation_bytes(tensors, held: set) -> int:
    """Bytes of the distinct storages of ``tensors``, leaving out those of ``held`` (alive anyway)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(n for ptr, n in storages.items() if ptr not in held)


@pytest.mark.parametrize("name", ["transformer", "bert", "cnn", "resnet", "gpt2"])
def test_min_cut_keeps_less_memory_for_the_backward_than_eager(name):
    """Counted as the bench counts them: eager's saved tensors (autograd's hooks) against the tensors the torch
    target's autograd Function keeps for its backward (``ctx.residuals``), by storage, parameters, buffers and inputs left out. Layer and batch norm
    outputs are rebuilt from their statistics, not saved; ``save_all`` keeps no more than eager either (a
    ResNet's centre taps, copies of its weights, are rebuilt in the backward)."""
    wl = make_workload(name, small=True)
    inputs = wl.example_inputs
    held = {t.untyped_storage().data_ptr() for t in [*wl.model.parameters(), *wl.model.buffers(), *inputs]}
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        wl.model(*inputs).backward()
    eager = _activation_bytes(packed, held)
    saved = {}
    for policy in ("save_all", "min_cut"):
        out = pb_compile(wl.model, inputs, target="torch", policy=policy)(*inputs)
        saved[policy] = _activation_bytes(out.grad_fn.residuals, held)
        out.backward()
    assert saved["min_cut"] < min(eager, saved["save_all"]), (saved, eager)
    assert saved["save_all"] <= eager, (saved, eager)  # the default keeps no more than eager either


def test_attention_keeps_no_probabilities_for_the_backward():
    """``scaled_dot_product_attention`` is one operator (``nn.attention``) whose gradient recomputes the (B, H, L, S)
    probabilities from q, k and the rows' log-sum-exp, as flash attention's backward does: on the bench's
    TransformerEncoderLayer (issue 14's sizes) no residual has that shape, and min_cut keeps at most 60% of
    save_all's activation bytes (63% while the probabilities, a GEMM's softmax, had to be saved)."""
    from pullback.ir.expr import Call
    from pullback.ir.traversal import post_order

    wl = make_workload("transformer", small=False)
    (tp,) = pb_compile(wl.model, wl.example_inputs, target="torch", policy="min_cut")._programs.values()
    fwd = tp.mod["main_fwd"]
    assert any(isinstance(n, Call) and getattr(n.op, "name", "") == "nn.attention" for n in post_order(fwd.body))
    batch, length = wl.example_inputs[0].shape[:2]
    residuals = fwd.checked_type.ret_type.fields[1].fields
    assert not [t for t in residuals if tuple(t.shape[-2:]) == (length, length)]
    save_all = PartitionForwardBackward("main_grad", policy="save_all")(tp.mod)
    assert analysis.saved_bytes(tp.mod, inputs=False) <= 0.6 * analysis.saved_bytes(save_all, inputs=False)


def test_masked_attention_keeps_no_probabilities_for_the_backward():
    """Hugging Face's sdpa attention over a padded batch passes a boolean mask: it is ``nn.attention``'s bias, so
    a Llama trained on a left-padded batch keeps no per-head (L, S) probabilities for the backward (only the
    (B, 1, L, S) mask, under save_all) and trains as eager does, on every target."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pullback.ir.expr import Call
    from pullback.ir.traversal import post_order
    from pullback.testing.torch_models import CausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=100, attn_implementation="sdpa")
    batches = []
    for _ in range(STEPS):
        ids, mask = torch.randint(0, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
        mask[1, :4] = 0
        batches.append(((ids, ids, mask), None))
    model = CausalLM(LlamaForCausalLM(cfg))
    for target in TARGETS:
        for policy in ("save_all", "min_cut"):
            (tp,) = pb_compile(model, batches[0][0], target=target, policy=policy)._programs.values()
            fwd = tp.mod["main_fwd"]
            calls = [n for n in post_order(fwd.body) if isinstance(n, Call) and getattr(n.op, "name", "") == "nn.attention"]
            assert len(calls) == 2 and all(len(c.args) == 4 for c in calls)
            residuals = fwd.checked_type.ret_type.fields[1].fields
            assert not [t for t in residuals if len(t.shape) == 4 and tuple(t.shape[1:]) == (4, 12, 12)], residuals
        result = train_side_by_side(model, batches, lambda loss, _: loss, lr=0.05, target=target, verbose=False)
        check_side_by_side(result, rtol=1e-5, atol=1e-5, verbose=False)
