"""The error catalogue: every bad input gets a pullback error that says what and where.

Each row: a thunk doing something wrong, the exception class expected, and words
the message must contain. Then: nothing the user passed in is modified (arrays
given to executables; modules given to passes keep their structural hash and
node identities).
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest

import pullback as pb
from pullback import op
from pullback import transform as T
from pullback.ir.traversal import post_order
from pullback.ops import OpDef
from pullback.testing.programs import random_inputs, random_program

X = pb.var("x", shape=(2, 3))
F32 = np.ones((2, 3), "float32")


def _mod(body, *params):
    return pb.IRModule.from_expr(pb.Function(list(params) or [X], body))


def _infer(body, *params):
    return lambda: T.InferType()(_mod(body, *params))


def _run(*args):
    return lambda: pb.build(_mod(op.tanh(X)))["main"](*args)


def _grad(body, *params):
    return lambda: T.FirstOrderGradient()(_mod(body, *params))


def _exe(params, body, *args, **build_kwargs):
    return lambda: pb.build(pb.IRModule.from_expr(pb.Function(params, body)), **build_kwargs)["main"](*args)


def _endless():
    gv = pb.GlobalVar("endless")
    mod = pb.IRModule({gv: pb.Function([X], pb.Call(gv, [op.negative(X)]), ret_type=pb.TensorType((2, 3), "float32"))})
    return pb.build(mod, max_call_depth=100)["endless"](F32)


def _gradient_over(name: str):
    y = pb.var("y", shape=(2, 3))
    mod = _mod(op.tanh(X)).with_function(name, pb.Function([y], op.negative(y)))
    return lambda: T.FirstOrderGradient(name=name if name != "main_grad" else None)(mod)


def _closure_call():
    y = pb.var("y", shape=(2, 3))
    inner = pb.Function([y], op.multiply(y, X))
    return pb.IRModule.from_expr(pb.Function([X], pb.Call(inner, [X])))


def _parse_type(dims: str):
    return lambda: pb.parse(f"def @f(%x: Tensor[({dims},), float32]) {{ %x }}")


def _parse_body(body: str):
    return lambda: pb.parse(PARSE_HEAD + "  " + body + "\n}")


def _parse_meta(line: str):
    return lambda: pb.parse(PARSE_HEAD + "  meta[0]\n}\n#[metadata]\nmeta[0] = " + line + "\n")


def _infer_text(body: str):
    return lambda: T.InferType()(pb.parse(PARSE_HEAD + "  " + body + "\n}"))


def _cli_npy_inputs():
    from pullback import cli

    with tempfile.TemporaryDirectory() as d:
        np.save(f"{d}/x.npy", F32)
        cli._load_npz(f"{d}/x.npy")


def _cli_check_output(path, suffix=None):
    from pullback import cli

    cli._check_output(path, suffix)


class _FakeXlaError(Exception):  # what a JAX out-of-memory looks like to the CLI
    __module__ = "jaxlib.xla_extension"


def _cli_out_of_memory():
    from pullback import cli

    with cli._backend_errors("running @main on the jax target"):
        raise _FakeXlaError("RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes.")


B = pb.var("b", shape=(4,))
I3 = pb.var("i", shape=(3,), dtype="int32")
J3 = pb.var("j", shape=(3,), dtype="int32")
INTS = np.array([4, 5, 6], "int32")
# an operator without a gradient rule (not registered: nothing global changes)
NO_GRAD = OpDef("test.no_grad", 1, lambda types, attrs: types[0], lambda x, attrs: x)
PARSE_HEAD = "def @main(%x: Tensor[(2, 3), float32]) {\n"

# (id, thunk, exception class, words the message must contain)
CATALOGUE = [
    # type errors
    ("broadcast", _infer(op.add(X, B), X, B), pb.TypeInferenceError, ["add", "broadcast", "(2, 3)", "(4,)"]),
    ("dense-shapes", _infer(op.nn.dense(X, B), X, B), pb.TypeInferenceError, ["nn.dense", "rank"]),
    ("reshape-size", _infer(op.reshape(X, (4, 2))), pb.TypeInferenceError, ["reshape", "(2, 3)", "(4, 2)"]),
    ("axis-range", _infer(op.sum(X, axis=5)), pb.TypeInferenceError, ["sum", "axis 5"]),
    ("if-cond", _infer(pb.If(X, X, X)), pb.TypeInferenceError, ["If", "bool"]),
    ("tuple-index", _infer(pb.TupleGetItem(pb.Tuple([X]), 3)), pb.TypeInferenceError, ["index 3", "out of range"]),
    ("every-type-error", _infer_text("%0 = sum(%x, axis=5);\n  %1 = (%x, %x);\n  (%0, %1.4)"), pb.TypeCheckError,
     ["2 problems", "axis 5", "@main at 2:8", "index 4", "@main at 4:10"]),
    # attrs, one row per attrs-bearing family
    ("attr-reshape", lambda: op.reshape(X, (-1, -1)), pb.AttrError, ["reshape", "newshape", "-1"]),
    ("attr-reduce", lambda: op.sum(X, axis="a"), pb.AttrError, ["sum", "axis"]),
    ("attr-reduce-name", lambda: op.mean(X, axes=1), pb.AttrError, ["mean", "axes", "axis"]),
    ("attr-transpose", lambda: op.transpose(X, axes=(0.5,)), pb.AttrError, ["transpose", "axes"]),
    ("attr-zeros-dtype", lambda: op.zeros((2,), "floaty"), pb.AttrError, ["zeros", "dtype", "floaty"]),
    ("attr-full-dtype", lambda: op.full(pb.const(1.0), (2,), "float8"), pb.AttrError, ["full", "dtype", "float8"]),
    ("attr-cast-dtype", lambda: op.cast(X, "str"), pb.AttrError, ["cast", "dtype"]),
    ("attr-conv-layout", lambda: op.nn.conv2d(X, X, data_layout="XYZW"), pb.AttrError, ["nn.conv2d", "data_layout", "XYZW"]),
    ("attr-conv-strides", lambda: op.nn.conv2d(X, X, strides=(0, 1)), pb.AttrError, ["nn.conv2d", "strides"]),
    ("attr-max-pool", lambda: op.nn.max_pool2d(X, pool_size=(0, 2)), pb.AttrError, ["nn.max_pool2d", "pool_size"]),
    ("attr-avg-pool", lambda: op.nn.avg_pool2d(X, pool_size=(-1, 2)), pb.AttrError, ["nn.avg_pool2d", "pool_size"]),
    ("attr-split", lambda: op.split(X, 0), pb.AttrError, ["split", "sections"]),
    ("attr-expand-dims", lambda: op.expand_dims(X, 0, -1), pb.AttrError, ["expand_dims", "num_newaxis"]),
    ("attr-softmax", lambda: op.nn.softmax(X, axis=1.5), pb.AttrError, ["nn.softmax", "axis"]),
    ("attr-dropout", lambda: op.nn.dropout(X, X, rate=1.5), pb.AttrError, ["nn.dropout", "rate"]),
    ("attr-strided-slice", lambda: op.strided_slice(X, begin=(0,), end=(1, 2)), pb.AttrError, ["strided_slice", "end", "begin"]),
    ("attr-tile", lambda: op.tile(X, reps=(-1,)), pb.AttrError, ["tile", "reps"]),
    ("attr-clip", lambda: op.clip(X, 2.0, 1.0), pb.AttrError, ["clip", "a_min", "a_max"]),
    ("attr-norm", lambda: op.nn.layer_norm(X, X, X, epsilon=float("inf")), pb.AttrError, ["nn.layer_norm", "epsilon"]),
    ("attr-pad", lambda: op.nn.pad(X, pad_width=((1,),)), pb.AttrError, ["nn.pad", "pad_width"]),
    ("attr-leaky-relu", lambda: op.nn.leaky_relu(X, alpha="a"), pb.AttrError, ["nn.leaky_relu", "alpha"]),
    # arity
    ("arity-builder", lambda: op.add(X), pb.PullbackError, ["add", "expects 2", "got 1"]),
    ("arity-infer", _infer(pb.Call(op.add, [X])), pb.TypeInferenceError, ["add", "expects 2", "got 1"]),
    ("arity-text", lambda: pb.parse(PARSE_HEAD + "  add(%x)\n}"), pb.PullbackError, ["add", "2"]),
    # text
    ("unknown-op-text", lambda: pb.parse(PARSE_HEAD + "  frobnicate(%x)\n}"), pb.ParseError, ["frobnicate", ":2:"]),
    ("malformed-text", lambda: pb.parse(PARSE_HEAD + "  %0 = tanh(%x;\n  %0\n}"), pb.ParseError, [":2:"]),
    ("unbound-var-text", lambda: pb.parse(PARSE_HEAD + "  tanh(%y)\n}"), pb.ParseError, ["%y", ":2:"]),
    # text: numbers bounded where they appear, whatever their digit count; unused bindings type-checked
    ("text-dim-digits", _parse_type("9" * 5000), pb.ParseError, ["1:20:", "dimension", "(5000 characters)", "out of range"]),
    ("text-dim-int64", _parse_type(str(10**23)), pb.ParseError, ["1:20:", "dimension", "out of range (0 to 9223372036854775807)"]),
    ("text-type-elements", _parse_type(f"{2**62}, {2**62}"), pb.ParseError, ["1:12:", "elements, more than 9223372036854775807"]),
    ("text-int-literal", _parse_body("(%x, const(" + "9" * 5000 + ", int64))"), pb.ParseError, [":2:14:", "integer literal", "out of range"]),
    ("text-float-literal", _parse_body("(%x, const(1e999, float64))"), pb.ParseError, [":2:14:", "1e999 overflows float64"]),
    ("text-const-overflow", _parse_body("(%x, const(1e10, float16))"), pb.ParseError, [":2:8:", "10000000000.0 overflows float16"]),
    ("text-tuple-index", _parse_body("%0 = (%x, %x);\n  %0." + "9" * 5000), pb.ParseError, [":3:6:", "tuple index", "out of range"]),
    ("text-meta-index", _parse_body("meta[" + "9" * 5000 + "]"), pb.ParseError, [":2:8:", "metadata index", "out of range"]),
    ("text-meta-rank", _parse_meta("float32 (" + ", ".join(["1"] * 100) + ") AAAAAA=="), pb.ParseError, [":5:1:", "100 dimensions", "at most 64"]),
    ("text-meta-size", _parse_meta(f"float32 (0, {2**62}, {2**62}) "), pb.ParseError, [":5:1:", "too large to exist"]),
    ("const-overflow", lambda: pb.const(1e10, "float16"), pb.PullbackError, ["10000000000.0", "float16", "overflows to inf"]),
    ("const-ragged", lambda: pb.const([[1], [2, 3]]), pb.PullbackError, ["const: [[1], [2, 3]] is not an array of numbers"]),
    ("var-dim-int64", lambda: pb.var("v", shape=(10**23,)), pb.PullbackError, ["too large", "a dimension is over 9223372036854775807"]),
    ("var-elements-int64", lambda: pb.var("v", shape=(2**31,) * 3), pb.PullbackError, ["number of elements is over 9223372036854775807"]),
    ("infer-elements-int64", _infer(op.zeros((2**40, 2**30), "float32")), pb.TypeInferenceError, ["zeros", "too large"]),
    ("const-int-range", lambda: pb.const(300, "int8"), pb.PullbackError, ["300", "int8 holds integers from -128 to 127"]),
    ("text-unused-ill-typed", _parse_body("%0 = sum(%x, axis=5);\n  %x"), pb.ParseError,
     [":2:3:", "%0 is never used and does not type-check", "axis 5", "at 2:8"]),
    # type errors say where (every parsed node has a span)
    ("tuple-index-where", _infer_text("%0 = (%x, %x);\n  %0.2"), pb.TypeInferenceError, ["index 2", "in @main at 3:5"]),
    ("if-branches-where", _infer_text("if (const(True)) { %x } else { sum(%x) }"), pb.TypeInferenceError,
     ["If branches", "in @main at 2:3"]),
    # the command line (each one line on stderr; argument errors are argparse's, see tests/cli)
    ("cli-npy-inputs", _cli_npy_inputs, pb.PullbackError, ["holds one array (.npy)", "--inputs takes an .npz"]),
    ("cli-output-dir", lambda: _cli_check_output("."), pb.PullbackError, ["-o . is a directory"]),
    ("cli-output-suffix", lambda: _cli_check_output("out", ".npz"), pb.PullbackError, ["-o out", "expected a .npz file name"]),
    ("cli-out-of-memory", _cli_out_of_memory, pb.PullbackError, ["out of memory running @main on the jax target", "RESOURCE_EXHAUSTED"]),
    # AD
    ("missing-gradient", _grad(op.add(pb.Call(NO_GRAD, [X]), pb.Call(NO_GRAD, [op.tanh(X)]))),
     pb.DiagnosticError, ["test.no_grad", "2 problems"]),
    ("closure-to-ad", lambda: T.FirstOrderGradient()(_closure_call()), pb.DiagnosticError, ["closure"]),
    ("ad-replaces-main-grad", _gradient_over("main_grad"), pb.PassError, ["already has a function @main_grad", "name="]),
    ("ad-replaces-named", _gradient_over("helper"), pb.PassError, ["already has a function @helper", "name="]),
    ("ad-unknown-function", lambda: T.FirstOrderGradient("nope")(_mod(op.tanh(X))), pb.PullbackError, ["@nope"]),
    # executables
    ("exe-count", _run(), pb.ExecutionError, ["@main", "1", "0"]),
    ("exe-count-more", _run(F32, F32), pb.ExecutionError, ["@main", "1", "2"]),
    ("exe-shape", _run(np.ones((3, 2), "float32")), pb.ExecutionError, ["%x", "(2, 3)", "(3, 2)"]),
    ("exe-dtype", _run(np.ones((2, 3), "int32")), pb.ExecutionError, ["%x", "float32", "int32"]),
    ("exe-not-an-array", _run("abc"), pb.ExecutionError, ["%x", "Tensor[(2, 3), float32]", "dtype str"]),
    ("exe-recursion", _endless, pb.ExecutionError, ["@endless", "max_call_depth=100", "without a base case"]),
    ("exe-call-depth-arg", lambda: pb.build(_mod(X), max_call_depth=0), pb.ExecutionError, ["max_call_depth", "positive int"]),
    ("exe-int-division-by-zero", _exe([I3, J3], op.floor_divide(I3, J3), INTS, np.array([1, 0, 2], "int32")),
     pb.ExecutionError, ["@main: floor_divide: integer division by zero"]),
    ("exe-index-range", _exe([X, I3], op.take(X, I3, axis=1, mode="fast"), F32, INTS), pb.ExecutionError,
     ["@main: take: index 4 out of range", "size 3"]),
]


def _torch_rows():
    try:
        from pullback.frontend import from_torch  # noqa: F401
    except ImportError:
        return []
    return [pytest.param(_torch_unsupported, pb.PullbackError, ["from_torch", "aten.special_airy_ai", "forward"], id="torch-unsupported-op"),
            pytest.param(_torch_int_input, pb.PullbackError, ["from_torch: example input 1 is an int (3)", "tensors only"],
                         id="torch-int-input"),
            pytest.param(_torch_meta_input, pb.PullbackError, ["example input 0 is on device meta", "CPU tensors with data"],
                         id="torch-meta-input"),
            pytest.param(_torch_meta_param, pb.PullbackError, ["parameter weight is on device meta", "load_state_dict"],
                         id="torch-meta-parameter"),
            pytest.param(_torch_double_backward, pb.PullbackError, ["gradient is not differentiable", "create_graph=True"],
                         id="torch-double-backward")]


class _Mul:
    def __new__(cls):
        import torch

        class Mul(torch.nn.Module):
            def forward(self, x, k):
                return x * k

        return Mul()


def _torch_int_input():
    import torch
    from pullback.frontend import from_torch

    return from_torch(_Mul(), (torch.ones(2), 3))


def _torch_meta_input():
    import torch
    from pullback.frontend import from_torch

    return from_torch(torch.nn.Linear(3, 2), (torch.ones(2, 3, device="meta"),))


def _torch_meta_param():
    import torch
    from pullback.frontend import from_torch

    return from_torch(torch.nn.Linear(3, 2, device="meta"), (torch.ones(2, 3),))


def _torch_double_backward():
    """A differentiable gradient of a call that writes buffers back (batch norm in training: the values it would
    recompute from are overwritten); other modules differentiate twice (tests/integrations/test_double_backward.py)."""
    import torch
    from pullback.integrations.torch import compile

    x = torch.randn(4, 3, requires_grad=True)
    compiled = compile(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)), (x,))
    (g,) = torch.autograd.grad(compiled(x).pow(2).sum(), x, create_graph=True)
    g.sum().backward()


def _torch_unsupported():
    import torch
    from pullback.frontend import from_torch

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.special.airy_ai(x)

    return from_torch(M(), (torch.ones(4),))


@pytest.mark.parametrize("thunk,exc,words", [pytest.param(t, e, w, id=i) for i, t, e, w in CATALOGUE] + _torch_rows())
def test_error_catalogue(thunk, exc, words):
    with pytest.raises(exc) as info:
        thunk()
    msg = str(info.value)
    missing = [w for w in words if w not in msg]
    assert not missing, f"message lacks {missing}: {msg}"
    assert isinstance(info.value, pb.PullbackError)


def test_parse_error_carries_line_and_column():
    with pytest.raises(pb.ParseError) as info:
        pb.parse(PARSE_HEAD + "  %0 = tanh(%x;\n  %0\n}")
    assert info.value.line == 2 and info.value.column > 1


# ------------------------------------------------------------------ inputs are never modified


def test_executable_does_not_modify_its_inputs():
    for seed in range(10):
        mod = random_program(seed, max_nodes=10)
        inputs = random_inputs(mod, seed)
        copies = [np.array(a, copy=True) for a in inputs]
        pb.build(mod)["main"](*inputs)
        for a, c in zip(inputs, copies):
            np.testing.assert_array_equal(a, c)


PASS_NAMES = ["InferType", "FirstOrderGradient", "ConcretizeLike", "EliminateIdentity", "SimplifyExpr",
              "DeadCodeElimination", "EliminateCommonSubexpr", "FoldConstant", "RemoveUnusedParameters",
              "standard_cleanup", "FuseOps"]


def _snapshot(mod):
    return [(name, fn, [id(n) for n in post_order(fn, into_functions=True)]) for name, fn in mod.items()]


@pytest.mark.parametrize("name", [n for n in PASS_NAMES if hasattr(T, n)])
def test_passes_do_not_modify_their_input(name):
    for seed in range(8):
        mod = random_program(seed, max_nodes=10, allow_if=False, allow_any=False)
        if name != "FirstOrderGradient":
            mod = T.FirstOrderGradient()(mod)
        before_hash, before_text, snap = pb.structural_hash(mod), pb.astext(mod), _snapshot(mod)
        getattr(T, name)()(mod)
        assert pb.structural_hash(mod) == before_hash
        assert pb.astext(mod) == before_text
        assert _snapshot(mod) == snap


def test_at_least_one_pass_checked():
    assert any(hasattr(T, n) for n in PASS_NAMES)
