"""The Core ATen table: every core overload is converted, decomposed or an explained exception; the page is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pullback.frontend import core_aten  # noqa: E402
from pullback.frontend.aten_table import ATEN_TABLE  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_every_core_operator_is_converted_or_decomposed_or_explained():
    ops = core_aten.classify()
    assert len(ops) > 180  # the opset PyTorch tags core (193 overloads in torch 2.13)
    unsupported = {o.name: o.note for o in ops if o.status == "unsupported"}
    assert set(unsupported) <= set(core_aten.UNSUPPORTED), f"core operators without a converter or a reason: {unsupported}"
    assert all(note for note in unsupported.values())


def test_preserved_composites_have_converters():
    from pullback.frontend.torch_importer import PRESERVED

    for name in PRESERVED:
        assert f"aten.{name}" in ATEN_TABLE, name


def test_core_aten_page_is_up_to_date():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_core_aten_page.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
