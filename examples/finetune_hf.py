"""Fine-tune a tiny Hugging Face BERT classifier through pullback, side by side with eager PyTorch.

Run: ``python examples/finetune_hf.py`` (20 steps). The model is built from its config class (random
weights, no download); ``pullback.integrations.torch.compile(model, batch)`` imports it (``torch.export`` +
Core ATen), differentiates it with pullback's AD, and the compiled model is called as the original
(``model(**batch).loss``) and trained with ``torch.optim.AdamW``. Dropout is active: both sides
draw the same masks from the same seeds, so the losses agree step by step.
"""

from __future__ import annotations

import copy
import sys


def main(steps: int = 20, verbose: bool = True) -> dict:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from pullback.integrations.torch import compile as pb_compile

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=32, num_labels=2)

    model = BertForSequenceClassification(config).train()
    eager = copy.deepcopy(model)
    ids = torch.randint(1, 64, (8, 12))
    mask = torch.ones_like(ids)
    mask[::2, 9:] = 0  # padded sequences
    batch = {"input_ids": ids, "attention_mask": mask, "labels": (ids[:, 0] > 32).long()}  # a learnable rule
    compiled = pb_compile(model, batch)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, compiled)]
    losses: dict = {"eager": [], "pullback": []}
    for step in range(steps):
        for key, m, opt in (("eager", eager, opts[0]), ("pullback", compiled, opts[1])):
            torch.manual_seed(step)
            loss = m(**batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[key].append(loss.item())
        if verbose:
            print(f"step {step:2d}  eager {losses['eager'][-1]:.6f}  pullback {losses['pullback'][-1]:.6f}")
    for e, p in zip(losses["eager"], losses["pullback"]):
        assert abs(e - p) <= 1e-3 * abs(e), (e, p)
    assert losses["pullback"][-1] < losses["pullback"][0]
    return losses


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
