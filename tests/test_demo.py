"""The README's main job runs and its checks pass (`make demo` = `python -m pullback demo`)."""

import subprocess
import sys

import pytest


def test_demo_runs_and_all_checks_pass():
    out = subprocess.run([sys.executable, "-m", "pullback", "demo", "--steps", "2"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "all checks passed" in text
    assert text.count("cleaned+fused gradient equals the raw AD gradient: True") == 2
    assert "after FuseOps" in text and "gradient vs central finite differences" in text


def test_demo_from_torch_checks_against_autograd():
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-m", "pullback", "demo", "--torch", "--steps", "1"], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "torch.nn.TransformerEncoderLayer" in out.stdout and "gradients vs PyTorch autograd" in out.stdout
    assert "all checks passed" in out.stdout
