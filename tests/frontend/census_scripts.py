"""The census scripts of ``scripts/`` loaded as modules, for the tests that run their cases."""

from __future__ import annotations

import importlib.util
import pathlib

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    """``scripts/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
