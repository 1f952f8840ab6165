"""The ``pullback`` command, run as ``python -m pullback`` on real files in tmp_path."""

from __future__ import annotations

import re
import select
import subprocess
import sys

import numpy as np
import pytest

import pullback as pb
from pullback import op


def _pb(tmp_path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "pullback", *args], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def _error_line(r: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command (no traceback)."""
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pullback: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path):
    """``m.pb``: sum(tanh(dense(x, w))); ``in.npz``: its inputs; and the arrays themselves."""
    x = pb.var("x", pb.TensorType((2, 3), "float32"))
    w = pb.var("w", pb.TensorType((4, 3), "float32"))
    mod = pb.IRModule.from_expr(pb.Function([x, w], op.sum(op.tanh(op.nn.dense(x, w)))))
    (tmp_path / "m.pb").write_text(pb.astext(mod))
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((2, 3)).astype("float32")
    wv = rng.standard_normal((4, 3)).astype("float32")
    np.savez(tmp_path / "in.npz", x=xv, w=wv)
    return tmp_path, xv, wv


def _expected(xv, wv):
    t = np.tanh(xv.astype("float64") @ wv.T.astype("float64"))
    d = 1 - t * t
    return t.sum(), d @ wv, d.T @ xv


def test_grad_opt_run_stats(files):
    tmp, xv, wv = files
    _pb(tmp, "grad", "m.pb", "-o", "g.pb")
    g = pb.parse((tmp / "g.pb").read_text())
    assert set(g) == {"main", "main_grad"}

    r = _pb(tmp, "opt", "g.pb", "--pipeline", "fuse", "--time-passes", "-o", "o.pb")
    assert r.stdout == ""
    for name in ("standard_cleanup", "SimplifyExpr", "FuseOps", "total"):
        assert name in r.stderr
    text = (tmp / "o.pb").read_text()
    assert "Primitive=1" in text and "_like(" not in text

    loss, dx, dw = _expected(xv, wv)
    _pb(tmp, "run", "o.pb", "--inputs", "in.npz", "--func", "main_grad", "-o", "out.npz")
    with np.load(tmp / "out.npz") as out:
        assert sorted(out.files) == ["out.0", "out.1.0", "out.1.1"]
        np.testing.assert_allclose(out["out.0"], loss, rtol=1e-5)
        np.testing.assert_allclose(out["out.1.0"], dx, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["out.1.1"], dw, rtol=1e-5, atol=1e-6)

    r = _pb(tmp, "run", "g.pb", "--inputs", "in.npz", "--func", "main_grad", "--profile")
    assert "out.1.1: float32[4, 3]" in r.stdout
    # the forward's and the data gradient's GEMMs; the weight gradient's dense(g^T, x^T) runs as the matmul g^T x
    assert re.search(r"^nn\.dense\s+2\s", r.stdout, re.M) and re.search(r"^nn\.matmul\s+1\s", r.stdout, re.M)
    assert "peak intermediate memory" in r.stdout

    r = _pb(tmp, "stats", "g.pb", "--func", "main_grad")
    assert re.search(r"^\s+nn\.dense\s+3$", r.stdout, re.M)
    like = int(re.search(r"like-operators:\s+(\d+)", r.stdout).group(1))
    assert like >= 1  # AD leaves broadcast_to_like behind
    for key in ("identity arithmetic:", "FLOPs:", "static peak memory:", "fusion groups (FuseOps):"):
        assert key in r.stdout
    r = _pb(tmp, "stats", "o.pb", "--func", "main_grad")
    assert re.search(r"like-operators:\s+0$", r.stdout, re.M)
    assert re.search(r"fusion groups \(FuseOps\): \d+ \(\d+ fused, \d+ single, [1-9]\d* already primitive\)", r.stdout)


def test_grad_to_stdout_wrt_vjp_and_opt_passes(files):
    tmp, _, _ = files
    r = _pb(tmp, "grad", "m.pb", "--wrt", "w", "--mode", "vjp")
    assert r.stderr == ""  # no progress line when stderr is not a terminal
    g = pb.parse(r.stdout)["main_grad"]
    assert len(g.params) == 3  # x, w and the cotangent
    (tmp / "g.pb").write_text(r.stdout)
    r = _pb(tmp, "opt", "g.pb", "--passes", "ConcretizeLike, DeadCodeElimination", "--print-after-all")
    assert "# IR after ConcretizeLike" in r.stderr and "# IR after DeadCodeElimination" in r.stderr
    out = pb.parse(r.stdout)
    assert "broadcast_to_like" not in pb.astext(out)


def test_errors_are_one_line(files, tmp_path):
    tmp, xv, wv = files
    (tmp / "bad.pb").write_text("def @main(%x: Tensor[(2), float32]) {\n  tanh(%x,, )\n}\n")
    line = _error_line(_pb(tmp, "stats", "bad.pb", ok=False))
    assert "ParseError" in line and re.search(r"bad\.pb:2:\d+:", line)

    line = _error_line(_pb(tmp, "opt", "m.pb", "--passes", "SimplifyExpr,NoSuchPass", ok=False))
    assert "NoSuchPass" in line and "SimplifyExpr" in line and "DeadCodeElimination" in line

    np.savez(tmp / "missing.npz", x=xv, v=wv)
    line = _error_line(_pb(tmp, "run", "m.pb", "--inputs", "missing.npz", ok=False))
    assert "missing w" in line and "unexpected v" in line

    np.savez(tmp / "shape.npz", x=xv, w=wv[:3])
    line = _error_line(_pb(tmp, "run", "m.pb", "--inputs", "shape.npz", ok=False))
    assert "%w" in line and "(4, 3)" in line and "(3, 3)" in line

    line = _error_line(_pb(tmp, "grad", "nothere.pb", ok=False))
    assert "nothere.pb" in line

    line = _error_line(_pb(tmp, "grad", "m.pb", "--wrt", "z", ok=False))
    assert "'z' is not a parameter" in line

    for args in (("--debug", "stats", "bad.pb"), ("stats", "bad.pb", "--debug")):
        r = _pb(tmp, *args, ok=False)
        assert r.returncode != 0 and "Traceback" in r.stderr and "ParseError" in r.stderr


def test_viz_dot(files):
    tmp, _, _ = files
    _pb(tmp, "grad", "m.pb", "-o", "g.pb")
    _pb(tmp, "opt", "g.pb", "--pipeline", "fuse", "-o", "o.pb")
    _pb(tmp, "viz", "o.pb", "--func", "main_grad", "-o", "fused.dot")
    _pb(tmp, "viz", "m.pb", "-o", "fwd.dot")
    dot = (tmp / "fused.dot").read_text()
    assert dot.startswith('digraph "@main_grad"') and dot.rstrip().endswith("}")
    for name in ("nn.dense", "tanh", "transpose", "%x", "%w", "(2, 3) float32"):
        assert name in dot
    assert "subgraph cluster_1" in dot
    from pullback.viz import BACKWARD_COLOR, FORWARD_COLOR

    assert f"fillcolor={FORWARD_COLOR}" in dot and f"fillcolor={BACKWARD_COLOR}" in dot
    # every node an edge names is declared
    declared = set(re.findall(r"^\s*(n\d+) \[", dot, re.M))
    used = set(re.findall(r"(n\d+) -> (n\d+)", dot))
    assert used and {a for e in used for a in e} <= declared
    fwd = (tmp / "fwd.dot").read_text()
    assert "tanh" in fwd and "cluster" not in fwd and FORWARD_COLOR not in fwd

    line = _error_line(_pb(tmp, "viz", "m.pb", "-o", "graph.txt", ok=False))
    assert ".dot" in line


def test_viz_svg(files):
    tmp, _, _ = files
    try:
        import graphviz  # noqa: F401
    except ImportError:
        line = _error_line(_pb(tmp, "viz", "m.pb", "-o", "g.svg", ok=False))
        assert "graphviz" in line and ".dot" in line
        assert not (tmp / "g.svg").exists()
        return
    import shutil

    r = _pb(tmp, "viz", "m.pb", "-o", "g.svg", ok=shutil.which("dot") is not None)
    if shutil.which("dot") is None:
        assert "dot" in _error_line(r)
    else:
        svg = (tmp / "g.svg").read_text()
        assert "<svg" in svg and "nn.dense" in svg and "tanh" in svg


def test_help_lists_subcommands(tmp_path):
    r = _pb(tmp_path, "--help")
    for cmd in ("grad", "opt", "run", "stats", "viz", "demo"):
        assert cmd in r.stdout


def test_progress_line_on_a_terminal(files):
    pty = pytest.importorskip("pty")
    import os

    tmp, _, _ = files
    leader, follower = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "pullback", "grad", "m.pb", "-o", "g.pb"], cwd=tmp,
                           stdout=subprocess.DEVNULL, stderr=follower, timeout=300)
        os.close(follower)
        shown = b""
        # read what the child wrote; never block: some kernels (gVisor) keep a drained leader open without EIO
        while select.select([leader], [], [], 5.0)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO on Linux once the follower side is closed and drained
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert r.returncode == 0
    assert b"\rpullback: differentiating @main..." in shown


def test_import_torch_then_run(tmp_path):
    torch = pytest.importorskip("torch")
    (tmp_path / "cli_model_fixture.py").write_text(
        "import torch\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))\n")
    r = _pb(tmp_path, "import-torch", "cli_model_fixture:make", "--input-shape", "2,3", "-o", "t.pb",
            "--params", "p.npz")
    assert r.stderr == ""
    main = pb.parse((tmp_path / "t.pb").read_text())["main"]
    data_name = main.params[0].name_hint
    xv = np.random.default_rng(1).standard_normal((2, 3)).astype("float32")
    np.savez(tmp_path / "x.npz", **{data_name: xv})
    _pb(tmp_path, "run", "t.pb", "--inputs", "x.npz", "--inputs", "p.npz", "-o", "y.npz")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    want = model(torch.from_numpy(xv)).detach().numpy()
    with np.load(tmp_path / "y.npz") as y:
        np.testing.assert_allclose(y["out"], want, rtol=1e-5, atol=1e-6)

    line = _error_line(_pb(tmp_path, "import-torch", "cli_model_fixture", "--input-shape", "2,3", ok=False))
    assert "MODULE:FACTORY" in line


@pytest.mark.parametrize("target", ["jax", "torch"])
def test_run_on_other_targets_matches_numpy(files, target):
    pytest.importorskip(target)
    tmp, xv, wv = files
    _pb(tmp, "run", "m.pb", "--inputs", "in.npz", "--target", target, "-o", "j.npz")
    with np.load(tmp / "j.npz") as out:
        np.testing.assert_allclose(out["out"], _expected(xv, wv)[0], rtol=1e-5)
