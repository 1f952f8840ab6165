"""``frontend.export_repairs``' helpers: the memoised ``Callable[...]`` aliases (no torch needed) and the composite
operators materialised once."""

from __future__ import annotations

import collections.abc

from pullback.frontend.export_repairs import memoised_callable_aliases

Callable = collections.abc.Callable


def test_memoised_callable_aliases_share_hashable_ones_and_restore_the_class():
    original = Callable.__dict__["__class_getitem__"]
    assert Callable[..., int] is not Callable[..., int]  # a new alias each time, as Python builds them
    with memoised_callable_aliases():
        a, b = Callable[..., int], Callable[..., int]
        assert a is b
        assert a == Callable[..., int] and a.__args__ == (Ellipsis, int)
        lists = Callable[[int, str], bytes], Callable[[int, str], bytes]  # unhashable: built each time, equal
        assert lists[0] == lists[1] and lists[0].__args__ == (int, str, bytes)
        assert Callable[[int], str] != Callable[[str], str]
    assert Callable.__dict__["__class_getitem__"] is original
    assert Callable[..., int] is not Callable[..., int]


def test_memoised_callable_aliases_nest_and_restore_after_an_error():
    original = Callable.__dict__["__class_getitem__"]
    try:
        with memoised_callable_aliases():
            with memoised_callable_aliases():
                assert Callable[[int], int] == Callable[[int], int]
            assert Callable[..., str] is Callable[..., str]
            raise KeyError("inside")
    except KeyError:
        pass
    assert Callable.__dict__["__class_getitem__"] is original


def test_memoised_callable_aliases_overlapping_in_two_threads_restore_the_class():
    """Thread A opens a block, B opens one, A closes, B closes: the class stays patched until B's block ends, and
    is the original after it (blocks that restored what they found would leave A's patch behind)."""
    import threading

    original = Callable.__dict__["__class_getitem__"]
    steps = [threading.Event() for _ in range(3)]
    seen = {}

    def a():
        with memoised_callable_aliases():
            steps[0].set()
            steps[1].wait()
        seen["a closed"] = Callable[..., bytes] is Callable[..., bytes]  # B's block is still open
        steps[2].set()

    def b():
        steps[0].wait()
        with memoised_callable_aliases():
            steps[1].set()
            steps[2].wait()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a closed": True}
    assert Callable.__dict__["__class_getitem__"] is original
    assert Callable[..., int] is not Callable[..., int]


def test_composite_ops_are_materialised_again_only_after_new_registrations(monkeypatch):
    """Inside the block torch's ``_materialize_cpp_cia_ops`` runs once per distinct set of C++ composite
    registrations (torch calls it once per operator namespace on every export); a new custom composite
    operator makes the next call run and materialise it; after the block torch's function is back."""
    import pytest

    torch = pytest.importorskip("torch")
    import torch._export.utils as utils

    from pullback.frontend import export_repairs

    original = utils._materialize_cpp_cia_ops
    calls = []

    def counted():
        calls.append(1)
        original()

    monkeypatch.setattr(utils, "_materialize_cpp_cia_ops", counted)
    monkeypatch.setattr(export_repairs, "_materialised_cia", None)
    lib = torch.library.Library("pullback_test_cia", "DEF")
    try:
        with export_repairs.composite_ops_materialised_once():
            for _ in range(3):
                utils._materialize_cpp_cia_ops()
            assert len(calls) == 1
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
            utils._materialize_cpp_cia_ops()
            assert len(calls) == 2
            assert "twice" in torch.ops.pullback_test_cia._dir
            utils._materialize_cpp_cia_ops()
            assert len(calls) == 2
        assert utils._materialize_cpp_cia_ops is counted
    finally:
        lib._destroy()


def test_narrowed_composite_overrides_decompose_to_the_same_graph_in_fewer_overrides(monkeypatch):
    """``run_decompositions`` inside ``composite_overrides_narrowed`` gives the graph it gives alone, on modules
    whose composites (linear, layer_norm, dropout, attention, an RNN, pooling, a custom composite operator)
    decompose through other composites, while overriding a few dozen operators instead of every composite one;
    torch's function is back after the block."""
    import pytest

    torch = pytest.importorskip("torch")
    import torch.export.exported_program as epm

    from pullback.frontend import export_repairs
    from pullback.frontend.torch_importer import decomposition_table

    lib = torch.library.Library("pullback_test_narrow", "DEF")
    lib.define("softsign(Tensor x) -> Tensor")
    lib.impl("softsign", lambda x: torch.nn.functional.softsign(x) * torch.nn.functional.glu(torch.cat([x, x], -1)),
             "CompositeImplicitAutograd")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
            self.rnn = torch.nn.GRU(8, 8, num_layers=2, batch_first=True)
            self.norm = torch.nn.GroupNorm(2, 8)

        def forward(self, x):
            h = torch.ops.pullback_test_narrow.softsign(self.layer(x))
            h = self.rnn(h)[0] + torch.nn.functional.adaptive_avg_pool1d(h, 8)
            return torch.nn.functional.pixel_shuffle(self.norm(h.transpose(1, 2)).unsqueeze(-1), 1).sum(-1)

    original = epm._override_composite_implicit_decomp
    sizes = []

    def counted(table):
        sizes.append(len(table))
        return original(table)

    monkeypatch.setattr(epm, "_override_composite_implicit_decomp", counted)
    try:
        ep = torch.export.export(Model().eval(), (torch.randn(2, 5, 8),))
        plain = ep.run_decompositions(decomposition_table()).graph_module.code
        everything, before = max(sizes), len(sizes)
        with export_repairs.composite_overrides_narrowed(ep):
            narrowed = ep.run_decompositions(decomposition_table()).graph_module.code
        assert epm._override_composite_implicit_decomp is counted
    finally:
        lib._destroy()
    assert narrowed == plain
    assert everything > 400 and 0 < max(sizes[before:]) < 60, (everything, sizes[before:])


def test_composite_ops_are_collected_again_only_after_new_registrations(monkeypatch):
    """Inside the block ``run_decompositions``' collection of composite operators runs once per set of C++
    composite registrations: a new custom composite operator is collected by the next call."""
    import pytest

    torch = pytest.importorskip("torch")
    import torch.export.exported_program as epm

    from pullback.frontend import export_repairs

    original = epm._collect_all_valid_cia_ops
    calls = []

    def counted():
        calls.append(1)
        return original()

    monkeypatch.setattr(epm, "_collect_all_valid_cia_ops", counted)
    monkeypatch.setattr(export_repairs, "_collected_cia", (None, frozenset()))
    lib = torch.library.Library("pullback_test_collect", "DEF")
    try:
        with export_repairs.composite_ops_materialised_once():
            first = epm._collect_all_valid_cia_ops()
            assert epm._collect_all_valid_cia_ops() == first and len(calls) == 1
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
            again = epm._collect_all_valid_cia_ops()
            assert len(calls) == 2 and torch.ops.pullback_test_collect.twice.default in again - first
        assert epm._collect_all_valid_cia_ops is counted
    finally:
        lib._destroy()


def test_the_decomposing_retrace_keeps_export_s_stack_traces(monkeypatch):
    """``run_decompositions`` records no stack traces of its own (``stack_traces_kept``: symbolising its frames was
    10-25% of its time): every node keeps the trace torch.export recorded, the user's line, the same strings as
    when it records them; fx's setting is restored after."""
    import contextlib

    import torch
    import torch.fx.config as fx_config
    from pullback.frontend import export_repairs
    from pullback.frontend.torch_importer import export

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.nn.functional.gelu(self.lin(x)).softmax(-1)  # the line each node's trace names

    def traces():
        ep = export(M(), [torch.randn(2, 4)])
        return {n.name: n.meta.get("stack_trace") for n in ep.graph.nodes if n.op == "call_function"}

    seen = []
    kept = export_repairs.stack_traces_kept

    @contextlib.contextmanager
    def watched():
        with kept():
            seen.append(fx_config.do_not_emit_stack_traces)
            yield

    monkeypatch.setattr(export_repairs, "stack_traces_kept", watched)
    quiet = traces()
    assert seen == [True] and fx_config.do_not_emit_stack_traces is False
    monkeypatch.setattr(export_repairs, "stack_traces_kept", contextlib.nullcontext)
    assert quiet == traces()
    assert quiet and all("the line each node's trace names" in (t or "") for t in quiet.values()), quiet


def test_export_compiles_only_the_graph_code_it_runs(monkeypatch):
    """The graph modules torch.export and its retrace make compile their Python code when run or read
    (``graph_code_made_lazily``), not each time one is made: fewer compilations than with the switch off, the same
    imported program, and FX's setting restored after."""
    import contextlib

    import torch
    import torch.fx._lazy_graph_module as lazy
    import torch.fx.graph_module as gm

    import pullback as pb
    from pullback.frontend import export_repairs
    from pullback.frontend.torch_importer import from_torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    compiled = []
    real = gm._exec_with_source
    monkeypatch.setattr(gm, "_exec_with_source", lambda *a, **k: compiled.append(1) or real(*a, **k))

    def imported():
        compiled.clear()
        mod, _ = from_torch(model.train(), [torch.randn(5, 4)])
        return mod, len(compiled)

    lazily, n_lazy = imported()
    assert lazy._use_lazy_graph_module_flag is False
    monkeypatch.setattr(export_repairs, "graph_code_made_lazily", contextlib.nullcontext)
    eagerly, n_eager = imported()
    assert n_lazy < n_eager, (n_lazy, n_eager)
    pb.assert_structural_equal(lazily, eagerly)
