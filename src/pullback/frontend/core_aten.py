"""The Core ATen opset (PyTorch's contract for backends) and how the importer covers it.

Every ATen overload tagged ``torch.Tag.core`` is, for pullback, exactly one of:

- **converted**: ``aten_table.ATEN_TABLE`` has a converter for it;
- **decomposed**: the importer's decomposition table (``torch_importer.decomposition_table``,
  PyTorch's own decompositions) lowers it to other operators before conversion;
- **unsupported**: neither; ``UNSUPPORTED`` says why.

``scripts/gen_core_aten_page.py`` writes ``docs/core_aten.md`` from ``classify()``.
"""

from __future__ import annotations

from dataclasses import dataclass

# core overloads pullback does not convert, with the reason (shown on docs/core_aten.md)
UNSUPPORTED: dict[str, str] = {}


@dataclass(frozen=True)
class CoreOp:
    """One Core ATen overload and how the importer handles it."""

    name: str  # "aten.add.Tensor"
    status: str  # "converted" | "decomposed" | "unsupported"
    note: str = ""  # the reason when unsupported


def core_overloads() -> list:
    """Every ATen ``OpOverload`` tagged ``torch.Tag.core``, sorted by name."""
    import torch

    out = set()
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        packet, _, overload = full[len("aten::"):].partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.core in op.tags:
            out.add(op)
    return sorted(out, key=str)


def classify() -> list[CoreOp]:
    """Each core overload with its status (an overload in the decomposition table never reaches a converter)."""
    from .aten_table import ATEN_TABLE
    from .torch_importer import decomposition_table

    decomposed = {str(op) for op in decomposition_table()}
    out = []
    for op in core_overloads():
        name = str(op)
        if name in decomposed:
            out.append(CoreOp(name, "decomposed"))
        elif name in ATEN_TABLE:
            out.append(CoreOp(name, "converted"))
        else:
            out.append(CoreOp(name, "unsupported", UNSUPPORTED.get(name, "no converter yet")))
    return out


__all__ = ["CoreOp", "UNSUPPORTED", "classify", "core_overloads"]
