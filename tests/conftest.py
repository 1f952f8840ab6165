"""Suite-wide test configuration.

- Every pass run in the test suite is followed by ``WellFormedCheck`` (type
  inference + well-formedness; a pass that breaks a valid module raises
  ``PassError("after pass NAME: ...")``). It is installed with
  ``transform.set_default_instruments`` rather than an entered PassContext, so
  it stays on inside the tests' own ``with PassContext(...)`` blocks.
- Hypothesis profiles: ``ci`` (default, 50 examples, no deadline) and ``long``
  (5000 examples); pick one with ``--hypothesis-profile long``.
- Markers: ``fuzz`` (long-running randomized tests) and ``slow``; deselect them
  with ``-m "not fuzz and not slow"``.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from pullback import transform

settings.register_profile("ci", max_examples=50, deadline=None)
settings.register_profile("long", max_examples=5000, deadline=None)
settings.load_profile("ci")  # --hypothesis-profile overrides this in pytest_configure


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: long-running randomized (fuzz) tests")
    config.addinivalue_line("markers", "slow: slow tests")


@pytest.fixture(autouse=True, scope="session")
def _well_formed_after_every_pass():
    previous = transform.set_default_instruments([transform.WellFormedCheck()])
    yield
    transform.set_default_instruments(previous)
