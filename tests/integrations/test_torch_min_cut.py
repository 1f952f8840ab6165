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
TARGETS = ["numpy"] + (["jax"] if importlib.util.find_spec("jax") else [])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["transformer", "bert", "cnn"])
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
