"""FuseOps' post-dominator tree (jump pointers, O(E log N)) equals Relay's step-by-step walk.

The reference below is Relay's ``LeastCommonAncestor`` walk (graph_partitioner.cc),
quadratic when a value feeds many distant consumers; the partitioner must give
the same immediate post-dominators and the same combined path patterns on
generated programs, their gradients, and wide fan-out graphs.
"""

from __future__ import annotations

import pytest

import pullback as pb
from pullback import op
from pullback.analysis import infer_module
from pullback.analysis.fusion import ELEMWISE, OPAQUE, _Partitioner
from pullback.testing.programs import random_program
from pullback.transform import FirstOrderGradient


def reference_post_dominators(p: _Partitioner) -> tuple[list, list]:
    n = len(p.nodes)
    parent, depth, dpat = [-1] * n, [0] * n, [OPAQUE] * n
    for i in range(n - 1, -1, -1):
        outs = p.outputs[i]
        if p.extern[i] or not outs:
            depth[i] = 1
            continue
        pat, lca = ELEMWISE, -1
        for ci, epat in outs:
            pat = max(pat, epat)
            if lca == -1:
                lca = ci
                continue
            a, b = lca, ci
            while a != b:
                if a == -1 or b == -1:
                    a = -1
                    break
                if depth[a] < depth[b]:
                    pat, b = max(pat, dpat[b]), parent[b]
                elif depth[b] < depth[a]:
                    pat, a = max(pat, dpat[a]), parent[a]
                else:
                    pat = max(pat, dpat[a], dpat[b])
                    a, b = parent[a], parent[b]
            lca = a
            if lca == -1:
                break
        parent[i] = lca
        depth[i] = depth[lca] + 1 if lca != -1 else 1
        dpat[i] = pat if lca != -1 else OPAQUE
    return parent, dpat


def check_same(fn: pb.Function) -> None:
    p = _Partitioner(fn.body, 2, 256, 64)
    p._post_dominators()
    parent, dpat = reference_post_dominators(p)
    assert p.ipdom == parent
    assert [pat for i, pat in enumerate(p.dom_pattern) if parent[i] != -1] == [
        pat for i, pat in enumerate(dpat) if parent[i] != -1]


@pytest.mark.parametrize("seed", range(60))
def test_generated_programs_and_their_gradients(seed):
    mod = random_program(seed, max_nodes=25)
    infer_module(mod)
    check_same(mod["main"])
    try:
        grad = FirstOrderGradient()(mod)
    except pb.PullbackError:
        return
    infer_module(grad)
    check_same(grad["main_grad"])


def _fan_out(layers: int, with_grad: bool) -> pb.Function:
    """A value (sigmoid(p)) used by every layer: long, overlapping post-dominator paths."""
    x, p = pb.var("x", shape=(4, 8)), pb.var("p", shape=(4, 8))
    ws = [pb.var(f"w{i}", shape=(8, 8)) for i in range(layers)]
    s = op.sigmoid(p)
    h = x
    for i, w in enumerate(ws):
        h = op.multiply(op.nn.relu(op.nn.dense(h, w)), s)
        if i % 3 == 0:
            h = op.add(h, op.sum(s, axis=1, keepdims=True))
    mod = pb.IRModule.from_expr(pb.Function([x, p] + ws, op.sum(h)))
    infer_module(mod)
    if with_grad:
        mod = FirstOrderGradient()(mod)
        infer_module(mod)
        return mod["main_grad"]
    return mod["main"]


@pytest.mark.parametrize("layers", [1, 2, 7, 40, 130])
@pytest.mark.parametrize("with_grad", [False, True])
def test_wide_fan_out(layers, with_grad):
    check_same(_fan_out(layers, with_grad))


# ---------------------------------------------------------------- the path walk is bounded by max_depth


class _CountingOutputs(list):
    reads = 0

    def __getitem__(self, i):
        type(self).reads += 1
        return super().__getitem__(i)


def _tanh_chain_gradient(n: int) -> pb.Function:
    """Every forward value is read by the backward far away: its post-dominator is n nodes off."""
    x = pb.var("x", shape=(4, 8))
    h = x
    for _ in range(n):
        h = op.tanh(op.add(h, pb.const(0.1)))
    grad = FirstOrderGradient()(pb.IRModule.from_expr(pb.Function([x], op.sum(h))))
    infer_module(grad)
    return grad["main_grad"]


@pytest.mark.parametrize("max_depth", [4, 16])
def test_path_walk_stops_past_max_depth(max_depth):
    """Merging along a path longer than max_depth is refused without walking the whole path (it was
    walked whole: FuseOps quadratic on chain gradients), and the groups are those of a whole walk."""
    fn = _tanh_chain_gradient(300)
    p = _Partitioner(fn.body, 2, max_depth, 64)
    p.outputs = _CountingOutputs(p.outputs)
    _CountingOutputs.reads = 0
    part = p.run()
    assert _CountingOutputs.reads < 2 * max_depth * len(p.nodes)  # a whole walk: ~ nodes**2 / 4 reads

    whole = _Partitioner(fn.body, 2, max_depth, 64)
    whole.max_depth = len(whole.nodes) + 1  # the walk never stops early ...
    limit = max_depth

    def capped_size_check(src, sink, fcond, _try=whole._try_fuse):
        path = _Partitioner._path(whole, src, sink)
        roots = {whole._find(src), *(whole._find(i) for i in path)}
        if sum(whole.size[r] for r in roots) > limit:  # ... and the size cap is applied after it
            return "too big"
        return _try(src, sink, fcond)

    whole._try_fuse = capped_size_check
    assert whole.run().group_of == part.group_of
