"""analysis.CallGraph: callees, callers, order, recursion, reachability; iterative on long chains."""

import pytest

import pullback as pb
from pullback import op
from pullback.analysis import CallGraph, infer_module


def fn(*callees: str, value_of: tuple = ()) -> tuple:
    """A function calling ``callees`` in order (and using the GlobalVars ``value_of`` as values)."""
    return callees, value_of


def module(spec: dict) -> pb.IRModule:
    """``{name: fn(...)}`` as a module of ``(3,)`` float functions; callees are called in order."""
    gvars = {name: pb.GlobalVar(name) for name in spec}
    funcs = {}
    for name, (callees, values) in spec.items():
        x = pb.var("x", shape=(3,))
        body = x
        for c in callees:
            body = pb.Call(gvars.get(c) or pb.GlobalVar(c), [body])
        if values:
            body = pb.Tuple([body, *(gvars[v] for v in values)])[0]
        funcs[gvars[name]] = pb.Function([x], body, ret_type=pb.TensorType((3,), "float32"))
    return pb.IRModule(funcs)


def test_callees_callers_roots_and_reachability():
    mod = module({"main": fn("f", "g", "f"), "f": fn("h"), "g": fn(), "h": fn(), "dead": fn("h")})
    cg = CallGraph(mod)
    assert cg.callees("main") == ["f", "g"]  # first use first, once each
    assert cg.callees("f") == ["h"] and cg.callees("g") == []
    assert cg.callers("h") == ["f", "dead"] and cg.callers("main") == []
    assert cg.roots() == ["main", "dead"]
    assert cg.reachable(["main"]) == {"main", "f", "g", "h"}
    assert cg.reachable(["nope"]) == set()
    site = cg.site("main", "f")
    assert isinstance(site, pb.Call) and site.op.name_hint == "f" and site.args[0] is mod["main"].params[0]


def test_callees_first_order():
    mod = module({"main": fn("f", "g"), "f": fn("h"), "g": fn("h"), "h": fn()})
    order = CallGraph(mod).callees_first()
    assert order == ["h", "f", "g", "main"]
    for name in mod:
        assert all(order.index(c) < order.index(name) for c in CallGraph(mod).callees(name))
    assert CallGraph(mod).callees_first(["g"]) == ["h", "g"]


def test_value_uses_and_unknown_names():
    mod = module({"main": fn("f", "ghost", value_of=("g",)), "f": fn(), "g": fn()})
    cg = CallGraph(mod)
    assert cg.value_uses() == {"g"}
    assert cg.callees("main") == ["f", "g"]  # a value use is an edge too
    assert cg.unknown("main") == ["ghost"]
    assert isinstance(cg.site("main", "g"), pb.GlobalVar)


def test_recursion_cycles_and_sccs():
    mod = module({"main": fn("f"), "f": fn("g"), "g": fn("f", "h"), "h": fn("h"), "leaf": fn()})
    cg = CallGraph(mod)
    assert cg.cycles(["main"]) == [("f", "g", "f"), ("h", "h")]
    assert cg.cycles(["leaf"]) == []
    assert cg.recursive() == {"f", "g", "h"}
    sccs = cg.sccs()
    assert sorted(map(sorted, sccs)) == [["f", "g"], ["h"], ["leaf"], ["main"]]
    pos = {name: i for i, comp in enumerate(sccs) for name in comp}
    assert pos["h"] < pos["f"] < pos["main"]  # callees first
    assert cg.site(*cg.cycles(["main"])[0][-2:]).op.name_hint == "f"


def test_long_call_chains_are_walked_iteratively():
    n = 5000  # far deeper than Python's recursion limit
    mod = module({f"f{i}": fn(f"f{i + 1}") if i + 1 < n else fn() for i in range(n)})
    cg = CallGraph(mod)
    assert cg.callees_first() == [f"f{i}" for i in reversed(range(n))]
    assert len(cg.sccs()) == n and not cg.recursive()
    assert len(cg.reachable(["f0"])) == n
    infer_module(mod)  # type inference walks the same order
    assert mod["f0"].body.checked_type == pb.TensorType((3,), "float32")


def test_the_graph_of_each_function_is_scanned_once():
    mod = module({"main": fn("f"), "f": fn()})
    from pullback.analysis import callgraph

    first = callgraph.function_refs(mod["main"])
    assert CallGraph(mod)._refs["main"] is first
    x = pb.var("x", shape=(3,))
    changed = mod.with_function("main", pb.Function([x], op.exp(x)))
    assert CallGraph(changed).callees("main") == []


def test_recursion_without_annotations_is_a_type_error():
    x = pb.var("x", shape=(3,))
    gv = pb.GlobalVar("f")
    mod = pb.IRModule({gv: pb.Function([x], pb.Call(gv, [x]))})
    with pytest.raises(pb.TypeInferenceError, match="recursion needs a ret_type annotation"):
        infer_module(mod)
