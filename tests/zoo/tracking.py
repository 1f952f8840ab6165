"""Training side by side with eager PyTorch: SGD steps with seeded dropout, compared step by step.

Shared by the zoo's tests: ``inputs`` are a loss module's positional inputs, or a Hugging Face batch of keywords
(then the step's loss is ``model(**batch).loss``, the model called as users call it).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from pullback.integrations.torch import compile as pb_compile

STEPS, LR = 5, 0.05


def train(model, inputs, steps: int = STEPS):
    """Per-step losses, the first step's gradients, and the final state, with SGD and seeded dropout."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, first = [], None
    for step in range(steps):
        torch.manual_seed(100 + step)
        loss = model(**inputs).loss if isinstance(inputs, dict) else model(*inputs)
        opt.zero_grad()
        loss.backward()
        if first is None:
            first = {k: (None if p.grad is None else p.grad.clone()) for k, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, first


def compare(name, eager, trained, ref, got, prefix: str = ""):
    """``got`` (from ``train`` of a wrapper of ``trained`` whose parameter names start with ``prefix``) tracks
    ``ref`` (from ``train`` of ``eager``): losses, first gradients, final state."""
    (ref_losses, ref_grads), (losses, grads) = ref, got
    grads = {k.removeprefix(prefix): v for k, v in grads.items()}
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4, atol=1e-6, err_msg=f"{name}: losses")
    for k, g in ref_grads.items():
        if g is None:
            assert grads[k] is None or not grads[k].abs().max() > 0, f"{name}: {k} has a gradient only through pullback"
            continue
        torch.testing.assert_close(grads[k], g, rtol=1e-3, atol=2e-5, msg=lambda m, k=k: f"{name}: gradient of {k}: {m}")
    for k, v in eager.state_dict().items():
        w = trained.state_dict()[k]
        if v.is_floating_point():
            torch.testing.assert_close(w, v, rtol=1e-3, atol=1e-4, msg=lambda m, k=k: f"{name}: final {k}: {m}")


def compiled_tracks_eager(name, model, inputs, steps: int = STEPS) -> None:
    """``steps`` SGD steps through ``pullback.integrations.torch.compile`` track eager's on a copy of ``model``."""
    eager = copy.deepcopy(model)
    ref = train(eager, inputs, steps)
    got = train(pb_compile(model, inputs), inputs, steps)
    compare(name, eager, model, ref, got, prefix="module.")
