"""The docs' code examples run, and the generated operator table is up to date.

Every ```python block of docs/*.md, docs/passes/*.md and README.md is executed;
a file's blocks run in order in one namespace (a later block may use names an
earlier one defined).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "passes").glob("*.md")) + [ROOT / "README.md"]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
TORCH_DOCS = {"training.md"}  # pages whose examples need PyTorch


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line number, source)`` of every ```python block in ``path``."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


def _run_as_script(src: str, where: str, tmp_path: Path) -> None:
    """A block the docs present as a script of its own (``torch.distributed``: "save this as train.py"), run
    as one: in-process, the gloo process group would outlive the example in this test's namespace, and its
    destructor, run with the GIL held, can wait forever on a worker thread that needs the GIL (PyTorch's
    ProcessGroupGloo teardown race)."""
    script = tmp_path / "example.py"
    script.write_text(src)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, f"{where} failed as a script:\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(path: Path, capsys, tmp_path):
    blocks = python_blocks(path)
    if path.name in TORCH_DOCS:
        pytest.importorskip("torch")
    ns: dict = {"__name__": f"doc_{path.stem}"}
    for line, src in blocks:
        where = f"{path.relative_to(ROOT)}:{line}"
        if "init_process_group" in src:
            pytest.importorskip("torch")
            _run_as_script(src, where, tmp_path)
            continue
        exec(compile(src, where, "exec"), ns)


def test_every_doc_page_has_examples_or_is_reference():
    """Pass pages and the tutorial are example-driven: each has at least one python block."""
    pages = list((ROOT / "docs" / "passes").glob("*.md")) + [ROOT / "docs" / "tutorial.md"]
    assert pages
    for p in pages:
        assert python_blocks(p), f"{p} has no ```python example"


def test_fence_extraction():
    blocks = python_blocks(ROOT / "docs" / "passes" / "fold_constant.md")
    assert blocks and "FoldConstant" in blocks[-1][1]


def test_operator_table_up_to_date():
    script = ROOT / "scripts" / "gen_op_table.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_operator_table_lists_every_op():
    from pullback.ops.registry import list_ops

    text = (ROOT / "docs" / "operators.md").read_text()
    for op in list_ops():
        assert f"| `{op.name}` |" in text


def test_every_page_in_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for p in sorted((ROOT / "docs").rglob("*.md")):
        rel = p.relative_to(ROOT / "docs").as_posix()
        assert f": {rel}" in nav, f"{rel} is not in the mkdocs.yml nav"


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "passes" / "fuse_ops" / "index.html").exists()
