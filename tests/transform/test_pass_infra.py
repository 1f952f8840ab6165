"""Pass infrastructure: decorators, PassContext, Sequential, registry, instruments, InferType."""

from __future__ import annotations

import dataclasses
import io
import logging
from dataclasses import FrozenInstanceError, dataclass

import numpy as np
import pytest

import pullback as pb
from pullback import op, transform
from pullback.ir.errors import PassError
from pullback.transform import pass_infra
from pullback.analysis import infer_module
from pullback.transform.instruments import PassInstrument, _astext


# ---------------------------------------------------------------- helpers


def make_mod() -> pb.IRModule:
    x = pb.var("x", shape=(2, 3))
    y = pb.var("y", shape=(2, 3))
    helper = pb.Function([y], op.tanh(y))
    main = pb.Function([x], op.add(op.exp(x), x))
    return pb.IRModule({"main": main, "helper": helper})


class Recorder(PassInstrument):
    """Records every hook call as (hook, pass name)."""

    def __init__(self, veto=()):
        self.events: list[tuple] = []
        self.veto = set(veto)

    def enter_pass_ctx(self):
        self.events.append(("enter", None))

    def exit_pass_ctx(self):
        self.events.append(("exit", None))

    def should_run(self, mod, info):
        return info.name not in self.veto

    def run_before_pass(self, mod, info):
        self.events.append(("before", info.name))

    def run_after_pass(self, mod, info):
        self.events.append(("after", info.name))

    def on_skip(self, mod, info, reason):
        self.events.append(("skip", info.name, reason))

    def on_error(self, mod, info, exc):
        self.events.append(("error", info.name))

    def ran(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "before"]


def noop_pass(name: str, opt_level: int = 0, required=()) -> transform.ModulePass:
    return transform.module_pass(lambda mod, ctx: mod, opt_level=opt_level, name=name, required=required)


def rename_main_pass(name: str = "Rebuild") -> transform.FunctionPass:
    """Rebuilds @main with fresh nodes (a change), leaves other functions alone."""

    def f(func, mod, ctx):
        if func is not mod["main"]:
            return func
        return pb.Function(func.params, op.add(func.body, func.params[0]))

    return transform.function_pass(f, name=name)


# ---------------------------------------------------------------- decorators


def test_module_pass_decorator_forms():
    @transform.module_pass
    def bare(mod, ctx):
        return mod

    @transform.module_pass(opt_level=2, name="Named", required="InferType")
    def with_args(mod, ctx):
        return mod

    called = transform.module_pass(lambda mod, ctx: mod, opt_level=1, name="Lam")

    assert isinstance(bare, transform.ModulePass) and bare.info == transform.PassInfo("bare", 0, ())
    assert with_args.info == transform.PassInfo("Named", 2, ("InferType",))
    assert called.info.name == "Lam" and called.info.opt_level == 1
    mod = make_mod()
    assert bare(mod) is mod and with_args(mod) is mod


def test_function_pass_decorator_on_function_applies_to_each_function():
    seen = []

    @transform.function_pass(opt_level=1)
    def visit(func, mod, ctx):
        seen.append(func)
        assert isinstance(ctx, transform.PassContext)
        return func

    mod = make_mod()
    assert isinstance(visit, transform.FunctionPass) and visit.info.name == "visit"
    assert visit(mod) is mod
    assert seen == [mod["main"], mod["helper"]]


def test_module_pass_decorator_on_class(registry):
    @transform.module_pass(opt_level=1, name="AddFn")
    class AddFunction:
        """Adds a copy of @main under a new name."""

        def __init__(self, new_name):
            self.new_name = new_name

        def transform_module(self, mod, ctx):
            return mod.with_function(self.new_name, mod["main"])

    p = AddFunction("copy")
    assert isinstance(p, transform.ModulePass) and isinstance(p, AddFunction)
    assert p.info == transform.PassInfo("AddFn", 1)
    assert p.new_name == "copy"  # attributes of the wrapped instance are reachable
    assert AddFunction.__doc__.startswith("Adds a copy")
    mod = make_mod()
    out = p(mod)
    assert list(out) == ["main", "helper", "copy"] and out["copy"] is mod["main"]
    assert list(mod) == ["main", "helper"]  # input untouched


def test_function_pass_decorator_on_bare_class(registry):
    @transform.function_pass
    class Counter:
        def __init__(self):
            self.count = 0

        def transform_function(self, func, mod, ctx):
            self.count += 1
            return func

    p = Counter()
    assert p.info.name == "Counter" and isinstance(p, transform.FunctionPass)
    p(make_mod())
    assert p.count == 2


def test_decorated_class_without_method_is_an_error():
    with pytest.raises(PassError, match="transform_module"):
        @transform.module_pass
        class Nope:
            pass


# ---------------------------------------------------------------- context checks


def test_opt_level_skip_is_logged_and_reported(caplog):
    caplog.set_level(logging.INFO, logger="pullback.transform")
    rec = Recorder()
    heavy = noop_pass("Heavy", opt_level=3)
    mod = make_mod()
    with transform.PassContext(opt_level=2, instruments=[rec]) as ctx:
        assert heavy(mod) is mod
    reason = "opt_level 3 > PassContext opt_level 2"
    assert ctx.skipped == [("Heavy", reason)]
    assert ("skip", "Heavy", reason) in rec.events and rec.ran() == []
    assert any(r.name == "pullback.transform" and r.levelno == logging.INFO and "Heavy" in r.getMessage()
               and reason in r.getMessage() for r in caplog.records)


def test_disabled_pass_is_skipped_even_if_required():
    rec = Recorder()
    with transform.PassContext(disabled=["A", "NotInPipeline"], required=["A"], instruments=[rec]) as ctx:
        transform.Sequential([noop_pass("A"), noop_pass("B")])(make_mod())
    assert rec.ran() == ["sequential", "B"]
    assert ctx.skipped == [("A", "disabled by PassContext")]


def test_required_overrides_opt_level():
    rec = Recorder()
    with transform.PassContext(opt_level=0, required=("Heavy", "Unknown"), instruments=[rec]) as ctx:
        transform.Sequential([noop_pass("Heavy", opt_level=3), noop_pass("Other", opt_level=3)])(make_mod())
    assert rec.ran() == ["sequential", "Heavy"]
    assert [name for name, _ in ctx.skipped] == ["Other"]


def test_should_run_false_is_reported():
    rec = Recorder(veto={"A"})
    with transform.PassContext(instruments=[rec]) as ctx:
        noop_pass("A")(make_mod())
    assert ctx.skipped == [("A", "Recorder.should_run returned False")]
    assert rec.events[-2:] == [("skip", "A", "Recorder.should_run returned False"), ("exit", None)]


def test_nested_contexts_and_enter_exit_hooks():
    outer_rec, inner_rec = Recorder(), Recorder()
    default = transform.PassContext.current()
    assert default.opt_level == 2
    with transform.PassContext(opt_level=1, instruments=[outer_rec]) as outer:
        assert transform.PassContext.current() is outer
        with transform.PassContext(opt_level=3, instruments=[inner_rec], config={"k": 1}) as inner:
            assert transform.PassContext.current() is inner
            noop_pass("P", opt_level=3)(make_mod())
            assert inner.config["k"] == 1
            with pytest.raises(TypeError):
                inner.config["k"] = 2
        assert transform.PassContext.current() is outer
        noop_pass("P", opt_level=3)(make_mod())
    assert transform.PassContext.current() is default
    assert inner_rec.events == [("enter", None), ("before", "P"), ("after", "P"), ("exit", None)]
    assert outer_rec.events[0] == ("enter", None) and outer_rec.events[-1] == ("exit", None)
    assert outer_rec.ran() == [] and outer.skipped == [("P", "opt_level 3 > PassContext opt_level 1")]


def test_context_argument_errors():
    with pytest.raises(PassError, match="opt_level"):
        transform.PassContext(opt_level="2")
    with pytest.raises(PassError, match="PassInstrument"):
        transform.PassContext(instruments=[object()])
    with pytest.raises(PassError, match="pass names"):
        transform.PassContext(disabled=[3])


# ---------------------------------------------------------------- Sequential


def test_sequential_order_and_nesting():
    order = []

    def mark(name, opt_level=0):
        return transform.module_pass(lambda mod, ctx: (order.append(name), mod)[1], name=name, opt_level=opt_level)

    inner = transform.Sequential([mark("b"), mark("c")], name="inner")
    skipped_block = transform.Sequential([mark("never")], opt_level=3, name="o3")
    pipeline = transform.Sequential([mark("a"), inner, skipped_block, mark("d")], name="outer")
    rec = Recorder()
    with transform.PassContext(opt_level=2, instruments=[rec]) as ctx:
        pipeline(make_mod())
    assert order == ["a", "b", "c", "d"]
    assert [e[:2] for e in rec.events if e[0] in ("before", "after")] == [
        ("before", "outer"), ("before", "a"), ("after", "a"),
        ("before", "inner"), ("before", "b"), ("after", "b"), ("before", "c"), ("after", "c"), ("after", "inner"),
        ("before", "d"), ("after", "d"), ("after", "outer"),
    ]
    assert ctx.skipped == [("o3", "opt_level 3 > PassContext opt_level 2")]


def test_sequential_threads_the_module_through():
    mod = make_mod()
    out = transform.Sequential([rename_main_pass("R1"), rename_main_pass("R2")])(mod)
    assert out is not mod
    assert out["main"].body.args[0].args[0] is mod["main"].body  # two wrappers, innermost is the original
    assert out["helper"] is mod["helper"]


def test_sequential_resolves_required_through_registry(monkeypatch):
    made = []

    def factory():
        made.append(1)
        return noop_pass("Prep")

    monkeypatch.setitem(pass_infra._REGISTRY, "Prep", factory)
    rec = Recorder()
    with transform.PassContext(opt_level=0, instruments=[rec]):
        # Prep is not in the pipeline: it is made from the registry and run first,
        # even though its user's opt_level is not an obstacle for it.
        transform.Sequential([noop_pass("User", required=["Prep"])])(make_mod())
        assert rec.ran()[-2:] == ["Prep", "User"]
        rec.events.clear()
        # ran earlier on the same module: not run again
        transform.Sequential([noop_pass("Prep"), noop_pass("User", required=["Prep"])])(make_mod())
        assert rec.ran() == ["sequential", "Prep", "User"]
        rec.events.clear()
        # the module changed since Prep ran: Prep runs again
        transform.Sequential([noop_pass("Prep"), rename_main_pass(), noop_pass("User", required=["Prep"])])(make_mod())
        assert rec.ran() == ["sequential", "Prep", "Rebuild", "Prep", "User"]
    assert len(made) == 2  # the second Sequential did not need the registry


def test_sequential_required_unknown_name():
    seq = transform.Sequential([noop_pass("User", required=["NoSuchPass"])])
    with pytest.raises(PassError, match="User requires NoSuchPass"):
        seq(make_mod())
    # an unregistered requirement is fine when it ran earlier in the Sequential
    mod = make_mod()
    assert transform.Sequential([noop_pass("NoSuchPass"), noop_pass("User", required=["NoSuchPass"])])(mod) is mod


def test_sequential_accepts_registered_names():
    seq = transform.Sequential(["InferType"])
    assert [p.info.name for p in seq.passes] == ["InferType"]
    with pytest.raises(PassError, match="unknown pass 'Bogus'.*InferType"):
        transform.Sequential(["Bogus"])
    with pytest.raises(PassError, match="entry 0 is not a Pass"):
        transform.Sequential([lambda m: m])


# ---------------------------------------------------------------- registry


def test_registry(monkeypatch):
    assert "InferType" in transform.list_passes()
    p = transform.get_pass("InferType")
    assert p.info.name == "InferType" and p is not transform.get_pass("InferType")
    monkeypatch.setattr(pass_infra, "_REGISTRY", dict(pass_infra._REGISTRY))
    transform.register_pass("Mine", lambda: noop_pass("Mine"))
    with pytest.raises(PassError, match="already registered"):
        transform.register_pass("Mine", lambda: noop_pass("Mine"))
    transform.register_pass("Bad", lambda: 42)
    with pytest.raises(PassError, match="not a Pass"):
        transform.get_pass("Bad")


# ---------------------------------------------------------------- FunctionPass / identity


def test_function_pass_skips_primitive_functions():
    x = pb.var("x", shape=(2,))
    prim = pb.Function([x], op.exp(x), attrs={"Primitive": 1})
    mod = make_mod().with_function("fused", prim)
    seen = []

    @transform.function_pass
    def visit(func, mod, ctx):
        seen.append(func)
        return pb.Function(func.params, op.negative(func.body))

    out = visit(mod)
    assert prim not in seen and len(seen) == 2
    assert out["fused"] is prim and out["main"] is not mod["main"]


def test_no_op_pass_preserves_identity():
    mod = make_mod()
    ident = transform.function_pass(lambda f, m, c: f, name="Ident")
    assert ident(mod) is mod
    assert transform.Sequential([ident, transform.InferType(), ident])(mod) is mod
    out = rename_main_pass()(mod)
    assert out is not mod and out["helper"] is mod["helper"] and out["main"].params == mod["main"].params


def test_pass_result_errors():
    with pytest.raises(PassError, match="Broken returned NoneType"):
        transform.module_pass(lambda mod, ctx: None, name="Broken")(make_mod())
    with pytest.raises(PassError, match="BadFn returned Var for @main"):
        transform.function_pass(lambda f, m, c: f.params[0], name="BadFn")(make_mod())
    with pytest.raises(PassError, match="expects an IRModule"):
        noop_pass("N")(make_mod()["main"])


# ---------------------------------------------------------------- instruments


def test_pass_timing_table():
    timing = transform.PassTiming()
    seq = transform.Sequential([noop_pass("First"), transform.Sequential([noop_pass("Inner")], name="block"),
                                noop_pass("Late", opt_level=9)], name="pipe")
    with transform.PassContext(instruments=[timing]):
        seq(make_mod())
    rows = [(t.name, t.depth) for t in timing.timings]
    assert rows == [("pipe", 0), ("First", 1), ("block", 1), ("Inner", 2), ("Late", 1)]
    assert all(t.seconds is not None and t.seconds >= 0 for t in timing.timings[:4])
    assert timing.timings[4].seconds is None and "skipped: opt_level 9" in timing.timings[4].note
    lines = timing.render().splitlines()
    assert lines[0].split() == ["pass", "ms", "%"]
    assert lines[2].startswith("pipe ") and lines[3].startswith("  First ") and lines[5].startswith("    Inner ")
    assert "skipped: opt_level 9 > PassContext opt_level 2" in lines[6]
    assert lines[-1].startswith("total")


def test_pass_timing_survives_a_failing_pass():
    timing = transform.PassTiming()

    def boom(mod, ctx):
        raise PassError("boom")

    seq = transform.Sequential([transform.module_pass(boom, name="Boom")], name="s")
    with transform.PassContext(instruments=[timing]):
        with pytest.raises(PassError, match="boom"):
            seq(make_mod())
        noop_pass("After")(make_mod())
    assert [(t.name, t.depth, t.note) for t in timing.timings] == [
        ("s", 0, "failed: PassError"), ("Boom", 1, "failed: PassError"), ("After", 0, "")]


def test_print_ir():
    # the printer shows types where they are known: type both modules so the text is fixed
    rebuild = rename_main_pass()
    typed_rebuild = transform.module_pass(lambda m, ctx: infer_module(rebuild.transform_module(m, ctx)), name="Rebuild")
    buf = io.StringIO()
    mod = transform.InferType()(make_mod())
    with transform.PassContext(instruments=[transform.PrintIR(before=True, after=True, stream=buf, passes=["Rebuild"])]):
        out = transform.Sequential([noop_pass("Quiet"), typed_rebuild])(mod)
    assert out is not mod
    assert buf.getvalue() == f"# IR before Rebuild\n{_astext(mod)}\n# IR after Rebuild\n{_astext(out)}\n"
    assert "def @helper(%y: Tensor[(2, 3), float32])" in buf.getvalue()


def test_print_ir_defaults_to_current_stdout(capsys):
    with transform.PassContext(instruments=[transform.PrintIR()]):
        noop_pass("Shown")(make_mod())
    out = capsys.readouterr().out
    assert out.startswith("# IR after Shown\n") and "@main" in out


def _ill_typed_main(mod, ctx):
    main = mod["main"]
    bad = op.add(main.params[0], pb.const(np.zeros((4, 5), "float32")))
    return mod.with_function("main", pb.Function(main.params, bad))


def test_well_formed_check_names_the_pass():
    breaker = transform.module_pass(_ill_typed_main, name="Breaker")
    seq = transform.Sequential([noop_pass("Fine"), breaker, noop_pass("Never")])
    rec = Recorder()
    with transform.PassContext(instruments=[transform.WellFormedCheck(), rec]):
        with pytest.raises(PassError, match=r"after pass Breaker: TypeCheckError: .*add"):
            seq(make_mod())
    assert "Never" not in rec.ran()
    assert ("error", "Breaker") in rec.events  # instruments after the failing check are closed


def test_well_formed_check_is_on_in_the_test_suite():
    assert any(isinstance(i, transform.WellFormedCheck) for i in transform.get_default_instruments())
    with pytest.raises(PassError, match="after pass Breaker"):
        transform.module_pass(_ill_typed_main, name="Breaker")(make_mod())


def test_well_formed_check_does_not_blame_a_pass_for_its_input():
    bad = _ill_typed_main(make_mod(), None)
    assert noop_pass("Innocent")(bad) is bad
    out = rename_main_pass("AlsoInnocent")(bad)  # changes a module that was already ill-typed
    assert out is not bad
    with pytest.raises(pb.TypeInferenceError):
        transform.InferType()(bad)  # the pass's own error, not a PassError


# ---------------------------------------------------------------- InferType


def test_infer_type_annotates_and_returns_same_module():
    mod = make_mod()
    assert not mod["main"].body.has_type
    out = transform.InferType()(mod)
    assert out is mod
    assert mod["main"].body.checked_type == pb.TensorType((2, 3), "float32")
    assert mod["helper"].checked_type == pb.FuncType((pb.TensorType((2, 3), "float32"),), pb.TensorType((2, 3), "float32"))


def test_infer_type_on_a_deep_chain():
    x = pb.var("x", shape=(2,))
    body = x
    for _ in range(20000):
        body = op.negative(body)
    mod = pb.IRModule.from_expr(pb.Function([x], body))
    assert transform.InferType()(mod) is mod and body.checked_type == pb.TensorType((2,), "float32")


def test_infer_type_skips_modules_that_are_already_typed(monkeypatch):
    from pullback.analysis import type_infer

    mod = transform.InferType()(make_mod())

    def fail(*args):
        raise AssertionError("infer_module should not run again")

    monkeypatch.setattr(type_infer, "infer_types", fail)
    assert transform.InferType()(mod) is mod
    fresh = make_mod()
    with pytest.raises(AssertionError, match="should not run"):
        transform.InferType()(fresh)


def test_unexpected_errors_name_the_pass():
    def crash(mod, ctx):
        raise ZeroDivisionError("oops")

    with pytest.raises(ZeroDivisionError) as info:
        transform.Sequential([transform.module_pass(crash, name="Crash")], name="pipe")(make_mod())
    assert info.value.__notes__ == ["(while running pass Crash)", "(while running pass pipe)"]


# ---------------------------------------------------------------- the one way: frozen dataclass subclasses


@pytest.fixture
def registry(monkeypatch):
    """Passes defined by a test are registered into a copy of the registry."""
    monkeypatch.setattr(pass_infra, "_REGISTRY", dict(pass_infra._REGISTRY))


def _exp_main(mod, times: int = 1):
    main = mod["main"]
    body = main.body
    for _ in range(times):
        body = op.exp(body)
    return mod.with_function("main", pb.Function(main.params, body))


def test_a_named_subclass_is_registered_by_being_defined(registry):
    @dataclass(frozen=True)
    class ExpMain(transform.ModulePass):
        """Wraps @main's result in ``times`` exps."""

        name = "ExpMain"
        opt_level = 1
        times: int = 1

        def transform_module(self, mod, ctx):
            return _exp_main(mod, self.times)

    assert "ExpMain" in transform.list_passes()
    p = transform.get_pass("ExpMain")
    assert isinstance(p, ExpMain) and p == ExpMain() and p.info == transform.PassInfo("ExpMain", 1)
    assert ExpMain(times=2) != ExpMain() and repr(ExpMain(times=2)).endswith("ExpMain(times=2)")
    out = transform.Sequential(["ExpMain", ExpMain(times=2)])(make_mod())
    assert out["main"].body.op is op.exp and out["main"].body.args[0].args[0].op is op.exp


def test_options_are_frozen():
    p = transform.FoldConstant(max_new_elements=8)
    with pytest.raises(FrozenInstanceError):
        p.max_new_elements = 9
    with pytest.raises(FrozenInstanceError):
        transform.InferType().anything = 1
    with pytest.raises(FrozenInstanceError):
        del transform.standard_cleanup().max_rounds

    @dataclass  # not frozen: the options cannot be set
    class Mutable(transform.ModulePass):
        k: int = 0

        def transform_module(self, mod, ctx):
            return mod

    with pytest.raises(FrozenInstanceError, match="passes are immutable"):
        Mutable()


def test_unnamed_subclasses_are_bases_named_after_the_class(registry):
    class Base(transform.ModulePass):
        def transform_module(self, mod, ctx):
            return mod

    assert "Base" not in transform.list_passes() and Base().info.name == "Base"

    @dataclass(frozen=True)
    class Derived(Base):
        name = "DerivedPass"

    assert isinstance(transform.get_pass("DerivedPass"), Derived)


def test_names_are_unique_and_a_redefinition_replaces(registry):
    def define():
        @dataclass(frozen=True)
        class Twice(transform.ModulePass):
            name = "Twice"

            def transform_module(self, mod, ctx):
                return mod

        return Twice

    define()
    second = define()  # the same class defined again (a reloaded module, a notebook cell)
    assert type(transform.get_pass("Twice")) is second
    with pytest.raises(PassError, match="a pass named Twice is already registered.*another name"):
        class Other(transform.ModulePass):
            name = "Twice"

            def transform_module(self, mod, ctx):
                return mod
    with pytest.raises(PassError, match="InferType is already registered"):
        class Mine(transform.ModulePass, name="InferType"):
            def transform_module(self, mod, ctx):
                return mod


def test_a_named_pass_implements_its_method(registry):
    with pytest.raises(PassError, match=r"must implement transform_module"):
        class NoModule(transform.ModulePass):
            name = "NoModule"
    with pytest.raises(PassError, match=r"must implement transform_function"):
        class NoFunction(transform.FunctionPass):
            name = "NoFunction"
    with pytest.raises(PassError, match=r"must implement rules"):
        class NoRules(transform.RewritePass):
            name = "NoRules"


def test_an_option_called_name_takes_the_pass_name_from_the_class_keyword(registry):
    @dataclass(frozen=True)
    class AddCopy(transform.ModulePass, name="AddCopy"):
        name: str = "copy"

        def transform_module(self, mod, ctx):
            return mod.with_function(self.name, mod["main"])

    p = AddCopy(name="twin")
    assert p.info.name == "AddCopy" and p.name == "twin"
    assert list(p(make_mod())) == ["main", "helper", "twin"]
    assert transform.get_pass("AddCopy") == AddCopy()


def test_get_pass_needs_options_with_defaults(registry):
    @dataclass(frozen=True)
    class NeedsK(transform.ModulePass):
        name = "NeedsK"
        k: int

        def transform_module(self, mod, ctx):
            return mod

    with pytest.raises(PassError, match="NeedsK has options without defaults"):
        transform.get_pass("NeedsK")
    assert NeedsK(3).k == 3


def test_function_pass_subclasses_inherit_the_loop():
    x = pb.var("x", shape=(2,))
    prim = pb.Function([x], op.exp(x), attrs={"Primitive": 1})
    mod = make_mod().with_function("fused", prim)
    seen = []

    @dataclass(frozen=True)
    class Negate(transform.FunctionPass):
        def transform_function(self, func, mod, ctx):
            seen.append(func)
            return pb.Function(func.params, op.negative(func.body))

    out = Negate()(mod)
    assert seen == [mod["main"], mod["helper"]] and out["fused"] is prim
    assert out["main"].body.op is op.negative


def test_built_in_passes_are_frozen_dataclasses_with_their_constructors():
    for name in ["InferType", "ConcretizeLike", "EliminateIdentity", "SimplifyExpr", "DeadCodeElimination",
                 "EliminateCommonSubexpr", "FoldConstant", "RemoveUnusedParameters", "FuseOps", "standard_cleanup"]:
        p = transform.get_pass(name)
        assert dataclasses.is_dataclass(p) and type(p).__dataclass_params__.frozen and p.info.name == name
    assert isinstance(transform.FuseOps(), transform.FunctionPass) and isinstance(transform.FoldConstant(), transform.FunctionPass)
    assert transform.FuseOps(fuse_opt_level=1).fuse_opt_level == 1
    assert transform.FuseOps().info == transform.PassInfo("FuseOps", 0, ("InferType",))
    assert transform.DeadCodeElimination(entry="main").entry == ("main",)
    clean = transform.standard_cleanup(max_rounds=3, entry="main")
    assert clean.fixed_point.max_rounds == 3 and [p.info.name for p in clean.passes] == [
        "SimplifyExpr", "FoldConstant", "EliminateCommonSubexpr", "DeadCodeElimination"]
    with pytest.raises(PassError, match="max_rounds"):
        transform.standard_cleanup(max_rounds=0)
    with pytest.raises(PassError, match="max_new_elements"):
        transform.FoldConstant(-1)
    with pytest.raises(PassError, match="entry"):
        transform.DeadCodeElimination(entry=[3])


def test_fuse_ops_and_fold_constant_run_per_function_and_skip_primitive_ones():
    x = pb.var("x", shape=(2,))
    prim = pb.Function([x], op.exp(op.add(pb.const(np.ones(2, "float32")), pb.const(np.ones(2, "float32")))),
                       attrs={"Primitive": 1})
    mod = make_mod().with_function("fused", prim)
    assert transform.FoldConstant()(mod)["fused"] is prim
    out = transform.FuseOps()(mod)
    assert out["fused"] is prim and out["main"].body.op.is_primitive  # exp + add of @main fused


def test_decorators_are_sugar_over_the_same_classes(registry):
    @transform.module_pass(opt_level=1)
    def fn_pass(mod, ctx):
        """Does nothing."""
        return mod

    assert isinstance(fn_pass, transform.ModulePass) and fn_pass.info == transform.PassInfo("fn_pass", 1)
    assert fn_pass.__doc__ == "Does nothing." and "fn_pass" not in transform.list_passes()  # an object, not a class

    @transform.function_pass(name="DecoratedClass", opt_level=2)
    class Decorated:
        def transform_function(self, func, mod, ctx):
            return func

    assert issubclass(Decorated, transform.FunctionPass) and "DecoratedClass" in transform.list_passes()
    p = transform.get_pass("DecoratedClass")
    assert isinstance(p, Decorated) and p.info == transform.PassInfo("DecoratedClass", 2)
    mod = make_mod()
    assert p(mod) is mod


def test_a_skipped_subclass_pass_is_reported_never_silent(caplog):
    caplog.set_level(logging.INFO, logger="pullback.transform")

    @dataclass(frozen=True)
    class Heavy(transform.ModulePass):
        opt_level = 3

        def transform_module(self, mod, ctx):
            raise AssertionError("skipped passes do not run")

    rec = Recorder()
    mod = make_mod()
    with transform.PassContext(opt_level=2, disabled=["FoldConstant"], instruments=[rec]) as ctx:
        assert transform.Sequential([Heavy(), transform.FoldConstant()])(mod) is mod
    reasons = [("Heavy", "opt_level 3 > PassContext opt_level 2"), ("FoldConstant", "disabled by PassContext")]
    assert ctx.skipped == reasons
    assert [e[1:] for e in rec.events if e[0] == "skip"] == reasons
    logged = [r.getMessage() for r in caplog.records if r.name == "pullback.transform"]
    assert all(any(n in m and why in m for m in logged) for n, why in reasons)


def test_fixed_point_stops_once_each_pass_in_a_row_returned_its_input(registry):
    """Passes run in turn; after the last change every pass (the changing one too) runs once more, no more."""
    log = []

    @dataclass(frozen=True)
    class Shrink(transform.ModulePass, register=False):
        """Drops one function per run until only main is left (changes twice on make_mod + a copy)."""

        name: str = "shrink"

        def transform_module(self, mod, ctx):
            log.append(self.name)
            extra = [n for n in mod if n != "main"]
            return mod.without_function(extra[0]) if extra else mod

    @dataclass(frozen=True)
    class Look(transform.ModulePass, register=False):
        name: str = "look"

        def transform_module(self, mod, ctx):
            log.append(self.name)
            return mod

    inner = transform.Sequential([Look("a"), Shrink("s"), Look("b")])
    mod = make_mod().with_function("twin", make_mod()["helper"])
    out = transform.FixedPoint(inner, max_rounds=8)(mod)
    assert list(out) == ["main"]
    # s changes twice (rounds 1 and 2); then b, a, and s itself must each see the result unchanged
    assert log == ["a", "s", "b", "a", "s", "b", "a", "s"]
    log.clear()
    assert transform.FixedPoint(inner, max_rounds=1)(mod) is not mod and log == ["a", "s", "b"]
