"""``runtime.tuning.CoreHandover``: PyTorch's idle OpenMP workers and NumPy's OpenBLAS workers exit at the
crossings between PyTorch and pullback's kernels, come back at their next parallel call, and compute the
same; the PyTorch integration hands over around the numpy target's programs."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager

import numpy as np
import pytest

from pullback.runtime.tuning import CoreHandover, _pool_calls

torch = pytest.importorskip("torch")
threadpoolctl = pytest.importorskip("threadpoolctl")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
                                reason="thread pools of two workers on Linux (/proc/self/task)")

RNG = np.random.default_rng(3)


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _threads() -> int:
    return len(_tids())


def _settled(before: int) -> int:
    """The thread count once it stops falling below ``before`` (an exiting thread leaves the task list a little
    after the call that released it returns); at most one second."""
    deadline = time.monotonic() + 1.0
    n = _threads()
    while n >= before and time.monotonic() < deadline:
        time.sleep(0.01)
        n = _threads()
    return n


@contextmanager
def _two_workers_each():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threadpoolctl.threadpool_limits(2, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(old)


def _wake_both(a: np.ndarray, t):
    t.add_(1.0)  # a parallel ATen op: PyTorch's OpenMP pool has its worker
    return a @ a  # a threaded sgemm: OpenBLAS has its worker


def test_the_libraries_of_both_pools_are_found():
    pause, shutdown = _pool_calls()
    assert pause, "torch's OpenMP runtime (omp_pause_resource_all) was not found"
    assert shutdown, "NumPy's OpenBLAS (blas_thread_shutdown_) was not found"


def test_enter_and_leave_stop_the_idle_workers_and_they_come_back():
    a = RNG.standard_normal((512, 512)).astype(np.float32)
    want = a.astype(np.float64) @ a.astype(np.float64)
    t = torch.ones(1 << 20)
    h = CoreHandover()
    with _two_workers_each():
        _wake_both(a, t)
        n0 = _threads()
        h.enter()
        n1 = _settled(n0)
        h.leave()
        n2 = _settled(n1)
        assert n1 < n0, "the OpenMP worker did not exit"
        assert n2 < n1, "the OpenBLAS worker did not exit"
        idle = _tids()
        got = _wake_both(a, t)
        # both pools made their workers again: new thread ids, counted apart from any unrelated thread of the
        # process that exits meanwhile (a count alone failed once in CI: 26 >= 25 + 2)
        assert len(_tids() - idle) >= 2
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        assert torch.equal(t, torch.full((1 << 20,), 3.0))


def test_a_disabled_handover_leaves_the_workers_alone(monkeypatch):
    monkeypatch.setattr(CoreHandover, "enabled", False)
    a = RNG.standard_normal((512, 512)).astype(np.float32)
    t = torch.ones(1 << 20)
    with _two_workers_each():
        _wake_both(a, t)
        n0 = _threads()
        h = CoreHandover()
        h.enter()
        h.leave()
        time.sleep(0.05)
        assert _threads() == n0


def test_the_integration_stops_openblas_after_the_numpy_targets_forward():
    from pullback.integrations.torch import compile as pb_compile

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
    x = torch.randn(512, 256)
    m = pb_compile(model, (x,), target="numpy")
    a = RNG.standard_normal((512, 512)).astype(np.float32)
    with _two_workers_each():
        m(x)  # built and run once
        _wake_both(a, torch.ones(1 << 20))
        n0 = _threads()
        out = m(x)  # the GEMMs are ATen's (PyTorch's OpenMP worker stays); OpenBLAS's worker exits after them
        assert _settled(n0) <= n0 - 1
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
