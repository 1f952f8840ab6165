"""examples/finetune_hf.py runs: a tiny HF BERT fine-tuned through pullback tracks eager step by step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "finetune_hf.py"


def test_finetune_hf_example():
    spec = importlib.util.spec_from_file_location("finetune_hf", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    losses = mod.main(steps=8, verbose=False)  # asserts agreement and progress inside
    np.testing.assert_allclose(losses["pullback"], losses["eager"], rtol=1e-3)
    assert losses["pullback"][-1] < losses["pullback"][0]
