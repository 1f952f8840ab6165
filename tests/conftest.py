"""Suite-wide test configuration.

- Every pass run in the test suite is followed by ``WellFormedCheck`` (type
  inference + well-formedness; a pass that breaks a valid module raises
  ``PassError("after pass NAME: ...")``). It is installed with
  ``transform.set_default_instruments`` rather than an entered PassContext, so
  it stays on inside the tests' own ``with PassContext(...)`` blocks.
- Hypothesis profiles: ``ci`` (default: 50 examples, no deadline, derandomized, so that a run of the suite
  is reproducible: the same examples on every machine and every run) and ``long`` (5000 random examples, for
  exploring); pick one with ``--hypothesis-profile long``.
- A watchdog: a test still running after ``WATCHDOG_SECONDS`` ends its process (faulthandler's C thread, so
  it fires even when a hang holds the GIL; pytest-timeout's 900 s thread timeout catches the others first with
  a readable report). Under xdist the worker is replaced and the test reported as crashed.
- Every test starts from one random state: Python's ``random``, NumPy's global generator and torch's (when
  loaded) are seeded with 0 before it, so a test that draws unseeded inputs is the same test on every run and
  every xdist worker, whatever ran before it (unseeded, a dropout test compared in float32 failed one run in eight).
- Markers: ``fuzz`` (long-running randomized tests) and ``slow`` (run first, so that the xdist workers
  share them out, and with the cyclic GC paused); deselect them with ``-m "not fuzz and not slow"``.
"""

from __future__ import annotations

import faulthandler
import random
import sys

import numpy as np

import pytest
from hypothesis import settings

from pullback import transform
from pullback.ir.gc_pause import gc_paused

settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=5000, deadline=None)
settings.load_profile("ci")  # --hypothesis-profile overrides this in pytest_configure


WATCHDOG_SECONDS = 1200


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: long-running randomized (fuzz) tests")
    config.addinivalue_line("markers", "slow: slow tests (about 8 s or more of CPU each); they run first")


def pytest_collection_modifyitems(config, items):
    """Slow tests first (stable order otherwise): with ``--dist worksteal`` (``make test``) they head the first
    worker's queue while the other worker runs, then takes over, the short tests; no worker is left finishing a
    long test alone at the end of the run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _one_random_state():
    random.seed(0)
    np.random.seed(0)
    torch = sys.modules.get("torch")  # not imported here: the tests that use torch have loaded it
    if torch is not None:
        # the CPU generator (and CUDA's once initialised): ``torch.manual_seed`` also queues a lazy seeding per
        # uninitialised accelerator, each with a formatted stack, 2 ms under pytest's deep stacks: 25 s a suite
        torch.default_generator.manual_seed(0)
        if torch.cuda.is_initialized():
            torch.cuda.manual_seed_all(0)


@pytest.fixture(autouse=True)
def _gc_paused_in_slow_tests(request):
    """The slow tests build million-node programs in Python loops: the cyclic GC, rescanning every node at each
    full collection, would take about 40% of the building (passes, the parser and ``build`` pause it themselves)."""
    if request.node.get_closest_marker("slow") is None:
        yield
        return
    with gc_paused():
        yield


@pytest.fixture(autouse=True, scope="session")
def _well_formed_after_every_pass():
    previous = transform.set_default_instruments([transform.WellFormedCheck()])
    yield
    transform.set_default_instruments(previous)


@pytest.fixture
def onednn_calls(monkeypatch):
    """The calls that reach the torch kernels' oneDNN inner product (``ops.onednn``), float32 GEMMs sent there
    whatever the CPU's vendor; skips without torch or oneDNN. The size thresholds stay: tests that want small
    weights there lower them."""
    pytest.importorskip("torch")
    from pullback.ops import onednn

    real = onednn.linear()
    if real is None:
        pytest.skip("this torch has no oneDNN")
    calls = []
    monkeypatch.setattr(onednn, "linear", lambda: lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(onednn, "_float32_preferred", lambda: True)
    return calls
