"""Tests of the PyTorch integration that take a ``target`` argument run on every target it supports that is
installed (``integrations.torch.TARGETS``: torch, numpy, jax)."""

from __future__ import annotations

import importlib.util

import pytest


def integration_targets() -> list[str]:
    from pullback.integrations.torch import TARGETS

    return [t for t in TARGETS if t != "jax" or importlib.util.find_spec("jax") is not None]


@pytest.fixture(params=integration_targets())
def target(request) -> str:
    return request.param
