"""Training through ``pullback.integrations.torch.compile(..., policy="min_cut")`` matches eager PyTorch and the
forward hands fewer activation bytes to the backward than ``save_all`` (the cut priced for the compile target)."""

from __future__ import annotations

import copy
import importlib.util

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("networkx")  # min_cut's max-flow

from pullback import analysis  # noqa: E402
from pullback.integrations.torch import compile as pb_compile  # noqa: E402
from pullback.testing.torch_models import make_workload  # noqa: E402
from pullback.transform import PartitionForwardBackward  # noqa: E402

STEPS = 3
TARGETS = ["numpy"] + (["jax"] if importlib.util.find_spec("jax") else [])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["transformer", "bert", "cnn"])
def test_min_cut_training_tracks_eager(name, target):
    wl = make_workload(name, small=True)
    eager, model = wl.model, copy.deepcopy(wl.model)
    compiled = pb_compile(model, wl.example_inputs, target=target, policy="min_cut")
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (eager, model)]
    for step in range(STEPS):
        losses = []
        for m, opt in zip((eager, compiled), opts):
            loss = m(*wl.batch(step))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), f"step {step}"
    ref = eager.state_dict()
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, ref[key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
        else:  # batch norm's num_batches_tracked
            assert torch.equal(value, ref[key]), key
    (tp,) = compiled._programs.values()
    save_all = PartitionForwardBackward("main_grad", policy="save_all")(tp.mod)
    assert analysis.saved_bytes(tp.mod, inputs=False) < analysis.saved_bytes(save_all, inputs=False)
