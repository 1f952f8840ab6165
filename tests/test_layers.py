"""Imports go downward only (DESIGN.md, Layers): a static check over src/pullback.

Lazy imports inside functions count too, except the ones listed in ALLOWED with
the reason. (The parser finds operators through ``importlib`` by name, a
documented hook that this check does not see.)
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "src" / "pullback"
RANK = {"ir": 0, "ops": 1, "op": 1, "text": 2, "analysis": 2, "pattern": 2, "transform": 3, "testing": 4, "runtime": 4,
        "frontend": 5, "integrations": 5, "viz": 5, "cli": 6, "demo": 6, "__main__": 6, "__init__": 6}
# (importing package, imported package): why it is fine
ALLOWED = {
    ("testing", "runtime"): "gradient checks run programs (testing sits beside runtime)",
}


def _package(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0].removesuffix(".py")


def _target(node: ast.ImportFrom, path: pathlib.Path):
    if node.level == 0:
        mod = node.module or ""
        return mod.split(".")[1] if mod.startswith("pullback.") else None
    depth = len(path.relative_to(ROOT).parts) - 1  # folders below pullback/
    if node.level > depth:  # reaches pullback/ itself: the first part of the module names the package
        return (node.module or "").split(".")[0] or None
    return _package(path)


def test_imports_go_downward():
    bad = []
    for path in ROOT.rglob("*.py"):
        src_pkg = _package(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            tgt = _target(node, path)
            if tgt is None or tgt == src_pkg or tgt not in RANK:
                continue
            if RANK[tgt] > RANK[src_pkg] and (src_pkg, tgt) not in ALLOWED:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {tgt} ({src_pkg} is below it)")
    assert not bad, "\n".join(bad)
