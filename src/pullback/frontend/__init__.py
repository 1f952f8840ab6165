"""Importers: PyTorch modules through ``torch.export`` (torch is imported only when used)."""

from .torch_importer import (DropoutMask, RandomInput, TorchProgram, UnsupportedOperatorError, from_torch, import_exported,
                             import_torch, main_inputs)

__all__ = ["from_torch", "import_torch", "import_exported", "main_inputs", "TorchProgram", "RandomInput", "DropoutMask",
           "UnsupportedOperatorError"]
