"""``pullback run`` on a recursion without a base case: one error line, not a hang."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import pullback as pb
from pullback import op


def test_run_stops_an_endless_recursion(tmp_path):
    x = pb.var("x", pb.TensorType((2,), "float32"))
    gv = pb.GlobalVar("endless")
    mod = pb.IRModule({gv: pb.Function([x], pb.Call(gv, [op.negative(x)]), ret_type=x.type_annotation)})
    (tmp_path / "m.pb").write_text(pb.astext(mod))
    np.savez(tmp_path / "in.npz", x=np.ones(2, "float32"))
    r = subprocess.run([sys.executable, "-m", "pullback", "run", "m.pb", "--inputs", "in.npz", "--func", "endless"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines[0].startswith("pullback: error: ExecutionError: @endless: calls nested more than max_call_depth=100000 deep"), lines
