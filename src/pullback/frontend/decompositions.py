"""Decompositions the importer writes itself, for ATen operators PyTorch has none for.

Each is a function of torch tensors traced by ``run_decompositions`` (``torch_importer.decomposition_table``),
so the operators it calls are decomposed in turn: ``aten._trilinear`` (what ``nn.Bilinear`` and
``F.bilinear`` call) becomes one ``torch.einsum``, which torch lowers to permutes, reshapes and batched
matrix products (no ``(N, out, in1, in2)`` intermediate).
"""

from __future__ import annotations

from string import ascii_letters


def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``aten._trilinear``: each input gets unit dims at its ``expand`` positions (all three then have rank
    ``i1.dim() + len(expand1)``); the result is their broadcast product summed over ``sumdim``.
    ``unroll_dim`` only chooses ATen's loop order."""
    import torch

    rank = i1.dim() + len(expand1)

    def labels(skipped) -> str:  # the positions without a unit dim (an input's dims), or the result's
        return "".join(ascii_letters[d] for d in range(rank) if d not in set(skipped))

    spec = f"{labels(expand1)},{labels(expand2)},{labels(expand3)}->{labels(sumdim)}"
    return torch.einsum(spec, i1, i2, i3)


def own_decompositions() -> dict:
    """``{ATen overload: decomposition}`` for the operators above."""
    import torch

    return {torch.ops.aten._trilinear.default: trilinear}


__all__ = ["own_decompositions", "trilinear"]
