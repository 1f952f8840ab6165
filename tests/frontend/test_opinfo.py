"""PyTorch's OpInfo samples through export -> import -> numpy target, against eager PyTorch and autograd.

A bounded subset: per operator of the Core ATen table, the first float32 sample and the last float64 one
(integer/bool samples for bitwise operators). ``make opinfo`` runs every sample and writes docs/opinfo.md,
where every skipped sample is listed with its reason.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's op_db imports it

from pullback.frontend import opinfo  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    INFOS = opinfo.opinfos()

# OpInfos whose bounded samples may all be skipped, with the reason (everything else must pass at least one)
ALL_SKIPPED = {"item": "a Python number, not a tensor"}


def _bounded(info) -> list:
    out = []
    for dtype in opinfo.dtypes_for(info):
        first = dtype in ("float32", "int64")
        pairs = opinfo.samples(info, dtype, limit=1 if first else None)
        if pairs:
            out.append((dtype, *(pairs[0] if first else pairs[-1])))
    return out


@pytest.mark.parametrize("info", INFOS, ids=opinfo.full_name)
def test_opinfo_samples_match_pytorch(info):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [opinfo.run_sample(info, s, dtype, i) for dtype, i, s in _bounded(info)]
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n".join(f"{r.dtype} sample {r.index}: {r.reason}" for r in failed)
    for r in results:
        if r.status == "skipped":
            print(f"skipped {r.opinfo} {r.dtype} sample {r.index}: {r.reason}")
    name = opinfo.full_name(info)
    if results and name not in ALL_SKIPPED:
        assert any(r.status == "passed" for r in results), "every sample skipped: " + "; ".join(r.reason for r in results)


def test_the_table_covers_every_core_operator_with_opinfo_samples():
    covered = {info.aten_name for info in INFOS} | {k for k, names in opinfo.ALIASES.items()
                                                      if any(opinfo.full_name(i) in names or i.name in names for i in INFOS)}
    for packet in ("add", "convolution", "scaled_dot_product_attention", "index", "cumsum", "sort", "upsample_bilinear2d",
                   "_fft_r2c", "_fft_c2r"):
        assert packet in covered


def test_units_cover_every_sample_and_share_the_budget():
    infos = [i for i in INFOS if opinfo.full_name(i) in ("cumsum", "atan2")]
    work = opinfo.units(infos, chunk=3, budget=10.0)
    for info in infos:
        name = opinfo.full_name(info)
        mine = [u for u in work if u.opinfo == name]
        for dtype in opinfo.dtypes_for(info):
            want = [i for i, _ in opinfo.samples(info, dtype)]
            assert sorted(i for u in mine if u.dtype == dtype for i in u.indices) == want
        assert all(len(u.indices) <= 3 for u in mine)
        assert abs(sum(u.budget for u in mine) - 10.0) < 1e-9


def test_the_first_sample_alone_is_the_first_of_all_samples():
    import torch

    for info in [i for i in INFOS if opinfo.full_name(i) in ("cumsum", "atan2", "nn.functional.conv2d")]:
        (i, one), = opinfo.samples(info, "float32", limit=1)
        j, first = opinfo.samples(info, "float32")[0]
        assert i == j == 0
        assert all(torch.equal(a, b) for a, b in zip(opinfo._leaves([one.input, one.args, one.kwargs]),
                                                      opinfo._leaves([first.input, first.args, first.kwargs]), strict=True))


def test_samples_past_the_budget_are_counted_as_not_run():
    done = opinfo.run_unit(opinfo.Unit("cumsum", "float32", (0,)))
    late = opinfo.run_unit(opinfo.Unit("cumsum", "float32", (1, 2), budget=0.0))
    assert done[0].status == "passed"
    assert [r.status for r in late] == ["unrun", "unrun"] and "budget" in late[0].reason
    s = opinfo.summary(done + late)
    assert (s["samples"], s["passed"], s["unrun"]) == (3, 1, 2)
    page = opinfo.report(done + late, "python scripts/opinfo_report.py --budget 0", 0.0)
    assert "| 1 | 3 | 1 | 1 | 0 | 0 | 2 |" in page and "time budget of 0 s" in page


def test_a_float32_gradient_passes_only_as_close_to_float64_as_eagers():
    """The rounding criterion: within twice eager's own float32 error of the float64 result, never beyond."""
    import numpy as np

    exact = np.array([0.630085, 1.0])
    eager = np.array([0.630015, 1.0])  # off by 7e-5
    assert opinfo._no_further(np.array([0.630216, 1.0]), eager, exact)  # 1.3e-4: within 2x
    assert not opinfo._no_further(np.array([0.6305, 1.0]), eager, exact)  # 4e-4: beyond
    assert not opinfo._no_further(np.array([np.nan, 1.0]), eager, exact)


def test_samples_are_drawn_as_seeded_by_torch_manual_seed_without_touching_it(monkeypatch):
    """Drawing samples seeds the CPU generator alone (no call queued per uninitialised accelerator) and finds no
    test method without reading the stack's source, draws the values torch's own functions would, and leaves
    ``torch.manual_seed`` and ``extract_test_fn`` as they were."""
    import contextlib

    import torch
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    info = next(i for i in INFOS if opinfo.full_name(i) == "nn.functional.max_pool2d")
    seeded, found = torch.manual_seed, (common_utils.extract_test_fn, core.extract_test_fn)
    fast = opinfo.samples(info, "float64")
    assert torch.manual_seed is seeded and (common_utils.extract_test_fn, core.extract_test_fn) == found
    monkeypatch.setattr(opinfo, "_quick_sampling", contextlib.nullcontext)
    slow = opinfo.samples(info, "float64")
    assert len(fast) == len(slow) > 100
    for (i, a), (j, b) in zip(fast, slow):
        la, lb = opinfo._leaves([a.input, a.args, a.kwargs]), opinfo._leaves([b.input, b.args, b.kwargs])
        assert i == j and all(torch.equal(x, y) for x, y in zip(la, lb))


def test_the_stack_search_finds_the_test_method_torchs_finds():
    """``_stack_test_fn`` (no source read) finds the running ``unittest.TestCase`` method as torch's
    ``extract_test_fn`` does, and nothing outside one."""
    import io
    import unittest

    from torch.testing._internal.common_utils import extract_test_fn

    found = {}

    class Case(unittest.TestCase):
        def test_here(self):
            found["ours"], found["torch"] = opinfo._stack_test_fn(), extract_test_fn()

    assert unittest.TextTestRunner(stream=io.StringIO()).run(Case("test_here")).wasSuccessful()
    assert found["ours"] is found["torch"] is Case.test_here
    assert opinfo._stack_test_fn() is None and extract_test_fn() is None
