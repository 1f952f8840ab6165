"""Every workload of ``bench/torch_train.py`` trains through ``pullback.integrations.torch.compile`` like eager
PyTorch: five SGD steps at small sizes, losses and final weights (buffers included), on each registered target."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pullback.integrations.torch import compile as pb_compile  # noqa: E402
from pullback.runtime.build import TARGETS  # noqa: E402
from pullback.testing.torch_models import FIRST_MODELS, WORKLOADS, make_workload  # noqa: E402

# workloads the importer cannot import yet: name -> (exception, reason)
NOT_IMPORTED: dict = {}
STEPS = 5


def _cases():
    """(workload, target) pairs, every target of the integration on every workload; a pair expected to fail
    says why."""
    for t in ("numpy", "jax", "torch"):
        if t not in TARGETS:
            continue
        for name in (*WORKLOADS, *FIRST_MODELS):
            marks = [pytest.mark.skipif(t == "jax" and not _has("jax"), reason="jax not installed")]
            if name in NOT_IMPORTED:
                exc, reason = NOT_IMPORTED[name]
                marks.append(pytest.mark.xfail(strict=True, raises=exc, reason=reason))
            yield pytest.param(name, t, marks=marks, id=f"{name}-{t}")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("name, target", list(_cases()))
def test_five_sgd_steps_track_eager(name, target):
    wl = make_workload(name, small=True)
    eager, model = wl.model, copy.deepcopy(wl.model)
    compiled = pb_compile(model, wl.example_inputs, target=target)
    assert list(compiled.parameters()) == list(model.parameters())
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (eager, model)]
    for step in range(STEPS):
        losses = []
        for m, opt in zip((eager, compiled), opts):
            torch.manual_seed(step)  # the same dropout masks (the MNIST example's network, the ViT)
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


def test_the_hugging_face_bench_builds_every_family_and_its_rows_compare_like_with_like():
    """``bench/hf_train.py`` stays runnable: every family builds and returns a finite loss; one row (Llama, one
    step each) gives both sides' first loss equal and positive times and saved bytes."""
    import importlib.util
    import math
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "hf_train.py"
    spec = importlib.util.spec_from_file_location("hf_train", path)
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    for name in hf.FAMILIES:
        model, inputs = hf.build(name, "float32")
        with torch.no_grad():
            assert math.isfinite(float(model(*inputs))), name
    row = hf.run("llama", "float32", reps=1, warmup=0, threads=torch.get_num_threads(), target="torch", tune_malloc=False)
    assert row["losses"][0] == row["losses"][1]
    assert row["eager_ms"] > 0 and row["pullback_ms"] > 0 and row["pullback_saved_mb"] > 0
