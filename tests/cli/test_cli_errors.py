"""Bad arguments to every subcommand: one readable stderr line, a non-zero exit, nothing written.

Table-driven and in-process (``cli.main``) so that every row is cheap; a few rows
run ``python -m pullback`` for real (argument errors, the JAX out-of-memory).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import pullback as pb
from pullback import cli, op

GOOD_ROWS = "good"  # marker: the fixture files below


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A folder with a module, inputs in every wrong shape, and a torch model factory."""
    x = pb.var("x", pb.TensorType((2, 3), "float32"))
    (tmp_path / "m.pb").write_text(pb.astext(pb.IRModule.from_expr(pb.Function([x], op.sum(op.tanh(x))))))
    (tmp_path / "bad.pb").write_text("def @main(%x: Tensor[(2, 3), float32]) {\n  tanh(%x,, )\n}\n")
    (tmp_path / "illtyped.pb").write_text("def @main(%x: Tensor[(2, 3), float32]) {\n  sum(%x, axis=5)\n}\n")
    (tmp_path / "bin.pb").write_bytes(b"\xff\xfe\x00\x81 not text")
    big = pb.var("x", pb.TensorType((2, 3), "float32"))
    (tmp_path / "big.pb").write_text(pb.astext(pb.IRModule.from_expr(
        pb.Function([big], op.broadcast_to(op.sum(big), (2**38,))))))  # 1 TiB result
    i = pb.var("i", pb.TensorType((2,), "int32"))
    (tmp_path / "idiv.pb").write_text(pb.astext(pb.IRModule.from_expr(pb.Function([i], op.floor_divide(i, i)))))
    np.savez(tmp_path / "izero.npz", i=np.zeros(2, "int32"))
    ones = np.ones((2, 3), "float32")
    np.savez(tmp_path / "in.npz", x=ones)
    np.save(tmp_path / "x.npy", ones)
    np.savez(tmp_path / "names.npz", y=ones)
    np.savez(tmp_path / "shape.npz", x=np.ones((3, 2), "float32"))
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    (tmp_path / "trunc.npz").write_bytes((tmp_path / "in.npz").read_bytes()[:40])
    (tmp_path / "outdir").mkdir()
    (tmp_path / "clierr_fixture.py").write_text(
        "import torch\n\n"
        "def make():\n    return torch.nn.Linear(3, 2)\n\n"
        "def raises():\n    raise ValueError('no model today')\n\n"
        "def not_module():\n    return 42\n\n"
        "NOT_CALLABLE = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _files(root) -> set:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if "__pycache__" not in p.parts}


def _fail(work, capsys, argv) -> str:
    """Run ``pullback ARGV`` in-process; the single stderr line of its failure."""
    before = _files(work)
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    assert code not in (0, None), f"exit {code}: {out} {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pullback: error: "), err
    assert out == "", out
    assert _files(work) == before, "a failed command wrote files"
    return lines[0]


# (id, argv, words the line must contain); every subcommand, and the command itself
CASES = [
    ("no-command", [], ["required", "command"]),
    ("unknown-command", ["frobnicate"], ["invalid choice", "frobnicate"]),
    ("unknown-option", ["grad", "m.pb", "--bogus"], ["unrecognized arguments", "--bogus"]),
    # grad
    ("grad-no-input", ["grad"], ["required", "IN.pb"]),
    ("grad-missing-file", ["grad", "nothere.pb"], ["nothere.pb"]),
    ("grad-directory", ["grad", "outdir"], ["cannot read outdir"]),
    ("grad-binary", ["grad", "bin.pb"], ["not a text file"]),
    ("grad-parse-error", ["grad", "bad.pb"], ["ParseError", "bad.pb:2:"]),
    ("grad-ill-typed", ["grad", "illtyped.pb"], ["axis 5", "@main at 2:3"]),
    ("grad-func", ["grad", "m.pb", "--func", "nope"], ["@nope", "@main"]),
    ("grad-wrt", ["grad", "m.pb", "--wrt", "z"], ["'z' is not a parameter"]),
    ("grad-wrt-empty", ["grad", "m.pb", "--wrt", ","], ["comma-separated"]),
    ("grad-mode", ["grad", "m.pb", "--mode", "hessian"], ["invalid choice", "hessian"]),
    ("grad-out-dir", ["grad", "m.pb", "-o", "outdir"], ["outdir is a directory"]),
    ("grad-out-folder", ["grad", "m.pb", "-o", "nodir/g.pb"], ["nodir", "does not exist"]),
    # opt
    ("opt-no-passes", ["opt", "m.pb"], ["--passes", "--pipeline", "required"]),
    ("opt-unknown-pass", ["opt", "m.pb", "--passes", "SimplifyExpr,NoSuchPass"], ["NoSuchPass"]),
    ("opt-pipeline", ["opt", "m.pb", "--pipeline", "fast"], ["invalid choice", "fast"]),
    ("opt-level-negative", ["opt", "m.pb", "--pipeline", "standard", "--opt-level", "-5"], ["--opt-level", "0 to 3", "-5"]),
    ("opt-level-high", ["opt", "m.pb", "--pipeline", "standard", "--opt-level", "99"], ["--opt-level", "0 to 3"]),
    ("opt-level-text", ["opt", "m.pb", "--pipeline", "standard", "--opt-level", "two"], ["--opt-level", "integer"]),
    ("opt-level-huge", ["opt", "m.pb", "--pipeline", "standard", "--opt-level", "9" * 5000], ["--opt-level", "integer"]),
    ("opt-ill-typed", ["opt", "illtyped.pb", "--pipeline", "standard"], ["axis 5"]),
    ("opt-out-dir", ["opt", "m.pb", "--pipeline", "standard", "-o", "outdir"], ["outdir is a directory"]),
    # run
    ("run-no-inputs", ["run", "m.pb"], ["--inputs", "required"]),
    ("run-npy", ["run", "m.pb", "--inputs", "x.npy"], ["x.npy", "one array (.npy)", ".npz"]),
    ("run-missing-npz", ["run", "m.pb", "--inputs", "none.npz"], ["cannot read none.npz"]),
    ("run-text-as-npz", ["run", "m.pb", "--inputs", "m.pb"], ["m.pb is not an .npz"]),
    ("run-truncated-npz", ["run", "m.pb", "--inputs", "trunc.npz"], ["trunc.npz is not an .npz"]),
    ("run-object-npz", ["run", "m.pb", "--inputs", "objects.npz"], ["objects.npz is not an .npz"]),
    ("run-dir-as-npz", ["run", "m.pb", "--inputs", "outdir"], ["outdir"]),
    ("run-names", ["run", "m.pb", "--inputs", "names.npz"], ["missing x", "unexpected y"]),
    ("run-twice", ["run", "m.pb", "--inputs", "in.npz", "--inputs", "in.npz"], ["also given"]),
    ("run-shape", ["run", "m.pb", "--inputs", "shape.npz"], ["%x", "(2, 3)", "(3, 2)"]),
    ("run-func", ["run", "m.pb", "--inputs", "in.npz", "--func", "nope"], ["@nope"]),
    ("run-target", ["run", "m.pb", "--inputs", "in.npz", "--target", "tpu"], ["invalid choice", "tpu"]),
    ("run-out-dir", ["run", "m.pb", "--inputs", "in.npz", "-o", "outdir"], ["outdir is a directory"]),
    ("run-out-suffix", ["run", "m.pb", "--inputs", "in.npz", "-o", "res"], ["-o res", ".npz", "res.npz"]),
    ("run-out-stdout", ["run", "m.pb", "--inputs", "in.npz", "-o", "-"], ["-o -", ".npz"]),
    ("run-out-folder", ["run", "m.pb", "--inputs", "in.npz", "-o", "nodir/r.npz"], ["nodir", "does not exist"]),
    ("run-ill-typed", ["run", "illtyped.pb", "--inputs", "in.npz"], ["axis 5"]),
    ("run-torch-shape", ["run", "m.pb", "--inputs", "shape.npz", "--target", "torch"], ["%x", "(2, 3)", "(3, 2)"]),
    ("run-torch-names", ["run", "m.pb", "--inputs", "names.npz", "--target", "torch"], ["missing x"]),
    ("run-torch-ill-typed", ["run", "illtyped.pb", "--inputs", "in.npz", "--target", "torch"], ["axis 5"]),
    ("run-torch-div-zero", ["run", "idiv.pb", "--inputs", "izero.npz", "--target", "torch"], ["division by zero"]),
    ("run-numpy-div-zero", ["run", "idiv.pb", "--inputs", "izero.npz"], ["division by zero"]),
    ("run-too-big-for-disk", ["run", "big.pb", "--inputs", "in.npz", "-o", "out.npz"], ["-o out.npz", "bytes free"]),
    # stats / viz
    ("stats-no-input", ["stats"], ["required"]),
    ("stats-missing-file", ["stats", "nothere.pb"], ["nothere.pb"]),
    ("stats-func", ["stats", "m.pb", "--func", "nope"], ["@nope"]),
    ("stats-ill-typed", ["stats", "illtyped.pb"], ["axis 5"]),
    ("viz-no-output", ["viz", "m.pb"], ["-o", "required"]),
    ("viz-format", ["viz", "m.pb", "-o", "graph.txt"], [".dot"]),
    ("viz-out-dir", ["viz", "m.pb", "-o", "outdir"], ["outdir is a directory"]),
    ("viz-func", ["viz", "m.pb", "-o", "g.dot", "--func", "nope"], ["@nope"]),
    # import-torch
    ("torch-no-shape", ["import-torch", "clierr_fixture:make"], ["--input-shape", "required"]),
    ("torch-spec", ["import-torch", "clierr_fixture", "--input-shape", "2,3"], ["MODULE:FACTORY"]),
    ("torch-module", ["import-torch", "no_such_module_xyz:make", "--input-shape", "2,3"], ["cannot import no_such_module_xyz"]),
    ("torch-factory", ["import-torch", "clierr_fixture:missing", "--input-shape", "2,3"], ["no callable missing"]),
    ("torch-not-callable", ["import-torch", "clierr_fixture:NOT_CALLABLE", "--input-shape", "2,3"], ["no callable"]),
    ("torch-raises", ["import-torch", "clierr_fixture:raises", "--input-shape", "2,3"], ["raised ValueError", "no model today"]),
    ("torch-not-module", ["import-torch", "clierr_fixture:not_module", "--input-shape", "2,3"], ["returned int", "torch.nn.Module"]),
    ("torch-shape-negative", ["import-torch", "clierr_fixture:make", "--input-shape", "2,-3"], ["--input-shape", "2,-3"]),
    ("torch-shape-text", ["import-torch", "clierr_fixture:make", "--input-shape", "a,b"], ["--input-shape", "a,b"]),
    ("torch-shape-huge", ["import-torch", "clierr_fixture:make", "--input-shape", "99999,99999,99999"], ["elements"]),
    ("torch-shape-mismatch", ["import-torch", "clierr_fixture:make", "--input-shape", "2,5"], ["torch.export failed"]),
    ("torch-params-suffix", ["import-torch", "clierr_fixture:make", "--input-shape", "2,3", "--params", "p.txt"], ["--params", ".npz"]),
    ("torch-params-dir", ["import-torch", "clierr_fixture:make", "--input-shape", "2,3", "--params", "outdir"], ["directory"]),
    ("torch-out-dir", ["import-torch", "clierr_fixture:make", "--input-shape", "2,3", "-o", "outdir"], ["directory"]),
    # demo
    ("demo-steps-zero", ["demo", "--steps", "0"], ["--steps", "1 to 10000", "0"]),
    ("demo-steps-negative", ["demo", "--steps", "-2"], ["--steps"]),
    ("demo-steps-text", ["demo", "--steps", "many"], ["--steps", "integer"]),
    ("demo-option", ["demo", "--gpu"], ["unrecognized arguments", "--gpu"]),
]


def _needs(case_id: str):
    if case_id.startswith("run-torch"):
        return [pytest.mark.skipif(cli._torch_frontend() is None, reason="needs torch")]
    if case_id.startswith("torch-") and case_id not in ("torch-no-shape", "torch-shape-negative", "torch-shape-text",
                                                         "torch-shape-huge", "torch-spec", "torch-params-suffix",
                                                         "torch-params-dir", "torch-out-dir"):
        return [pytest.mark.skipif(cli._torch_frontend() is None, reason="needs torch")]
    return []


@pytest.mark.parametrize("argv,words", [pytest.param(a, w, id=i, marks=_needs(i)) for i, a, w in CASES])
def test_bad_arguments(work, capsys, argv, words):
    line = _fail(work, capsys, argv)
    missing = [w for w in words if w not in line]
    assert not missing, f"line lacks {missing}: {line}"
    assert "internal error" not in line and "Traceback" not in line
    assert len(line) < 600


def test_every_subcommand_has_rows():
    commands = set(cli.build_parser()._subparsers._group_actions[0].choices)
    covered = {argv[0] for _, argv, _ in CASES if argv}
    assert commands <= covered, commands - covered


def test_jax_out_of_memory_is_one_line(work, capsys):
    pytest.importorskip("jax")
    line = _fail(work, capsys, ["run", "big.pb", "--inputs", "in.npz", "--target", "jax", "-o", "out.npz"])
    assert "out of memory running @main on the jax target" in line and "RESOURCE_EXHAUSTED" in line


def test_out_of_memory_on_numpy_is_one_line(work, capsys, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 1.00 TiB")

    monkeypatch.setattr(cli, "_output_leaves", no_memory)
    line = _fail(work, capsys, ["run", "m.pb", "--inputs", "in.npz", "-o", "out.npz"])
    assert "out of memory running @main on the numpy target: Unable to allocate" in line


def test_an_unexpected_exception_is_still_one_line(work, capsys, monkeypatch):
    def bug(args):
        raise KeyError("oops")

    monkeypatch.setattr(cli, "_cmd_stats", bug)
    monkeypatch.setattr(cli, "build_parser", _parser_with(bug))
    before = _files(work)
    assert cli.main(["stats", "m.pb"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pullback: internal error: KeyError: 'oops'"), err
    assert "--debug" in lines[0] and _files(work) == before
    with pytest.raises(KeyError):
        cli.main(["--debug", "stats", "m.pb"])


def _parser_with(cmd):
    build = cli.build_parser

    def parser():
        p = build()
        p._subparsers._group_actions[0].choices["stats"].set_defaults(func_=cmd)
        return p

    return parser


def test_outputs_are_written_whole(work, capsys):
    assert cli.main(["run", "m.pb", "--inputs", "in.npz", "-o", "out.npz"]) == 0
    with np.load(work / "out.npz") as out:
        np.testing.assert_allclose(out["out"], np.tanh(np.ones((2, 3))).sum(), rtol=1e-6)
    assert cli.main(["grad", "m.pb", "-o", "g.pb"]) == 0
    assert "main_grad" in pb.parse((work / "g.pb").read_text())
    assert not [p for p in _files(work) if p.endswith(".tmp")]


@pytest.mark.parametrize("argv", [["opt", "m.pb", "--pipeline", "standard", "--opt-level", "-5"],
                                  ["run", "m.pb", "--inputs", "x.npy"], ["demo", "--steps", "0"]])
def test_real_command_line(work, argv):
    r = subprocess.run([sys.executable, "-m", "pullback", *argv], cwd=work, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("pullback: error: "), r.stderr
    assert r.stdout == ""
