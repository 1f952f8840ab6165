"""Buffer reuse in plans (``runtime.plan.buffer_reuse``): an elementwise result takes the buffer of an operand
that dies at it, on the numpy and torch targets; never an input's, a returned value's, or one a live view
still reads; results are exactly those without reuse."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import Function, IRModule, Tuple, op, var
from pullback.runtime.plan import buffer_reuse
from pullback.runtime.values import leaves, to_output
from pullback.testing.programs import random_inputs, random_program

TARGETS = ["numpy"] + (["torch"] if pytest.importorskip("torch") is not None else [])
N = 6


def _numpy(value):
    return to_output(value, lambda t: t.detach().cpu().numpy() if type(t).__module__.startswith("torch") else np.asarray(t))


def _build(f, target, reuse):
    mod = f if isinstance(f, IRModule) else IRModule.from_expr(f)
    opts = {"reuse": reuse} if target == "numpy" else {"fast": reuse}
    return pb.build(mod, target=target, check_outputs=True, **opts)


def _reused(f, target) -> dict:
    exe = _build(f, target, True)
    fn = exe.mod["main"]
    order = pb.ir.traversal.post_order(fn.body)
    return {n.op.name: i for n in order if n in (r := buffer_reuse(order, fn.body, exe.target))
            for i in [r[n][0]]}


def _same_with_and_without_reuse(f, inputs, target):
    keep = [np.array(x, copy=True) for x in inputs]
    got = _numpy(_build(f, target, True)["main"](*inputs))
    want = _numpy(_build(f, target, False)["main"](*inputs))
    for g, w in zip(leaves(got), leaves(want)):
        np.testing.assert_array_equal(g, w)
    for x, k in zip(inputs, keep):
        np.testing.assert_array_equal(x, k)  # inputs are never written


def _x():
    return np.linspace(-1.0, 1.0, N * N, dtype="float32").reshape(N, N)


@pytest.mark.parametrize("target", TARGETS)
def test_a_chain_runs_in_one_buffer_and_inputs_stay_intact(target):
    x = var("x", shape=(N, N))
    f = Function([x], op.negative(op.exp(op.multiply(x, x))))
    assert _reused(f, target) == {"exp": 0, "negative": 0}  # multiply reads the input: a new buffer
    _same_with_and_without_reuse(f, [_x()], target)


@pytest.mark.parametrize("target", TARGETS)
def test_a_live_view_keeps_its_buffer(target):
    x = var("x", shape=(N, N))
    a = op.exp(x)
    v = op.transpose(a, (1, 0))  # a view of a's buffer, used after a's last direct use
    b = op.negative(a)
    f = Function([x], op.add(b, v))
    assert "negative" not in _reused(f, target)  # would overwrite what v reads
    _same_with_and_without_reuse(f, [_x()], target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("like", ["collapse_sum_like", "reshape_like", "broadcast_to_like", "cast_like"])
def test_a_like_operators_template_is_not_aliased_by_its_result(target, like):
    """``like(y, a)`` shares memory with ``y`` at most, never with its template ``a``: ``a``'s buffer is free at
    ``a``'s last use (AD's gradients are full of such calls; taking the template as aliased made planning a
    chain of n of them O(n^2))."""
    x, y = var("x", shape=(N, N)), var("y", shape=(N, N))
    a = op.exp(x)
    t = getattr(op, like)(y, a)  # evaluated before negative(a), used after it
    f = Function([x, y], op.add(t, op.negative(a)))
    assert _reused(f, target).get("negative") == 0
    _same_with_and_without_reuse(f, [_x(), _x() + 1], target)


@pytest.mark.parametrize("target", TARGETS)
def test_an_operand_aliased_by_the_other_is_not_written(target):
    x = var("x", shape=(N, N))
    a = op.exp(x)
    f = Function([x], op.add(a, op.transpose(a, (1, 0))))  # partial overlap: torch would refuse out=a
    assert "add" not in _reused(f, target)
    _same_with_and_without_reuse(f, [_x()], target)


@pytest.mark.parametrize("target", TARGETS)
def test_returned_values_are_never_overwritten(target):
    x = var("x", shape=(N, N))
    a = op.exp(x)
    f = Function([x], Tuple([a, op.negative(a), op.negative(op.tanh(a))]))
    assert _reused(f, target) == {"negative": 0}  # only the last negative, into tanh's buffer
    _same_with_and_without_reuse(f, [_x()], target)


@pytest.mark.parametrize("target", TARGETS)
def test_broadcast_operand_is_not_a_destination(target):
    x, r = var("x", shape=(N, N)), var("r", shape=(N,))
    small = op.exp(r)
    f = Function([x, r], op.multiply(small, op.exp(x)))  # small dies here but is smaller than the result
    assert _reused(f, target) == {"multiply": 1}
    _same_with_and_without_reuse(f, [_x(), np.arange(N, dtype="float32")], target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seed", range(25))
def test_generated_programs_give_the_same_results(target, seed):
    mod = random_program(seed, max_nodes=16, dtypes=("float32", "float64"), allow_any=False, smooth=True, allow_if=False)
    if target == "torch":
        from pullback.runtime.torch_target import TorchTarget

        if TorchTarget().missing_kernels(mod):
            pytest.skip("an operator without a torch kernel")
    inputs = random_inputs(mod, seed)
    _same_with_and_without_reuse(mod, inputs, target)


def test_slice_assignments_into_a_dying_buffer_run_in_place_on_torch():
    """A loop of slice assignments (``attn[..., i, :i] = ...`` after functionalization: a chain of ``strided_set``)
    writes into the buffer the chain owns instead of copying it at every step; an input's, a live value's and a
    returned value's are copied."""
    x, v = var("x", shape=(N, N)), var("v", shape=(1, N))
    base = op.multiply(x, x)  # owned by the plan
    y = base
    for i in range(3):
        y = op.strided_set(y, op.add(v, float(i)), (i, 0), (i + 1, N))
    f = Function([x, v], y)
    assert _reused(f, "torch") == {"strided_set": 0}  # every one of the chain's writes (by op name)
    exe = _build(f, "torch", True)
    order = pb.ir.traversal.post_order(exe.mod["main"].body)
    assert sum(n.op.name == "strided_set" for n in buffer_reuse(order, exe.mod["main"].body, exe.target)) == 3
    vv = np.full((1, N), 7.0, "float32")
    _same_with_and_without_reuse(f, [_x(), vv], "torch")
    live = Function([x, v], Tuple([op.strided_set(base, v, (0, 0), (1, N)), base]))  # base is returned too
    read = Function([x, v], op.strided_set(x, v, (0, 0), (1, N)))  # an input
    for g in (live, read):
        assert "strided_set" not in _reused(g, "torch")
        _same_with_and_without_reuse(g, [_x(), vv], "torch")


def _aten_calls_on_torch(f, inputs, names: tuple, record) -> list:
    """``record(func, args)`` of each call of the ATen operators ``names`` while the torch target runs ``f``; and
    checks its results are those of the torch target without buffer reuse."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    packets = tuple(getattr(torch.ops.aten, n) for n in names)
    calls = []

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in packets:
                calls.append(record(func, args))
            return func(*args, **(kwargs or {}))

    exe = _build(f, "torch", True)
    with Calls():
        got = _numpy(exe["main"](*inputs))
    want = _numpy(_build(f, "torch", False)["main"](*inputs))
    for g, w in zip(leaves(got), leaves(want)):
        np.testing.assert_array_equal(g, w)
    return calls


def _copies_on_torch(f, inputs) -> list:
    """The shapes of the tensors ATen clones while the torch target runs ``f`` (``_aten_calls_on_torch``)."""
    return _aten_calls_on_torch(f, inputs, ("clone",), lambda func, args: tuple(args[0].shape))


def _forward_substitution(keep: str) -> Function:
    """Hugging Face's gated-delta-rule forward substitution as torch.export unrolls it: row ``i`` of ``u`` becomes
    ``row + sum(row^T * u[:i, :i])`` (``u[i, :i] = ...``), for i = 1..N-1. ``keep="reads"`` also returns every row
    and block read, as the forward of a training step saves them for the backward; ``keep="blocks"`` returns two
    overlapping blocks of ``u`` larger together than ``u``."""
    x = var("x", shape=(N, N))
    u = op.exp(x)
    kept = []
    for i in range(1, N):
        row, block = op.strided_slice(u, (i, 0), (i + 1, i)), op.strided_slice(u, (0, 0), (i, i))
        new = op.add(row, op.sum(op.multiply(op.transpose(row, (1, 0)), block), axis=0, keepdims=True))
        if keep == "blocks" and i == N - 1:
            kept = [op.strided_slice(u, (0,), (N - 1,)), op.strided_slice(u, (1,), (N,))]
        elif keep == "reads":
            kept += [row, block]
        u = op.strided_set(u, new, (i, 0), (i + 1, i))
    return Function([x], Tuple([u] + kept) if kept else u)


def test_slices_still_read_after_a_write_are_copied_instead_of_the_whole_tensor():
    """Each write of the loop above runs in place although the rows and blocks it read before are still needed
    (returned, as a forward's residuals are): the plan copies those (smaller) views and never the whole tensor;
    all values are those without reuse. Views larger together than the tensor keep it whole: one copy of it."""
    xs = _x()
    assert _copies_on_torch(_forward_substitution("none"), [xs]) == []
    copies = _copies_on_torch(_forward_substitution("reads"), [xs])
    assert (N, N) not in copies and len(copies) == 2 * (N - 1)
    assert _copies_on_torch(_forward_substitution("blocks"), [xs]) == [(N, N)]


@pytest.mark.parametrize("keep", ["none", "reads"])
def test_a_loop_of_row_writes_runs_in_one_buffer_on_numpy(keep):
    """On the numpy target too every write of the loop goes into the buffer the chain owns (its slices are copies,
    so rows kept for later do not pin it), with the values of the plan without reuse."""
    f = _forward_substitution(keep)
    exe = _build(f, "numpy", True)
    order = pb.ir.traversal.post_order(exe.mod["main"].body)
    reuse = buffer_reuse(order, exe.mod["main"].body, exe.target)
    assert sum(n.op.name == "strided_set" for n in reuse) == N - 1
    _same_with_and_without_reuse(f, [_x()], "numpy")


def test_a_row_read_after_it_is_overwritten_in_the_order_is_read_first():
    """``(strided_set(u, v, row i), strided_slice(u, row i))``: the post-order writes before it reads, which would
    copy all of ``u``; the plan reads (copies) the row first and writes in place, and the row read is the old one."""
    x, v = var("x", shape=(N, N)), var("v", shape=(1, N))
    u = op.exp(x)
    f = Function([x, v], Tuple([op.strided_set(u, v, (2,), (3,)), op.tanh(op.strided_slice(u, (2,), (3,)))]))
    assert _copies_on_torch(f, [_x(), np.full((1, N), 7.0, "float32")]) == [(1, N)]


def test_a_relu_of_a_dying_sum_runs_in_place_on_torch():
    """ResNet's ``relu(out + identity)``: the relu writes into the sum's buffer (ATen's ``clamp_min_``, what eager's
    ``ReLU(inplace=True)`` runs), with the values of ``torch.relu``, NaN and signed zeros included; a relu of an
    input gets a new tensor."""
    torch = pytest.importorskip("torch")
    x, y = var("x", shape=(N, N)), var("y", shape=(N, N))
    f = Function([x, y], op.nn.relu(op.add(x, y)))
    assert _reused(f, "torch") == {"nn.relu": 0}
    xs = _x()
    xs[0, :3] = [np.nan, -0.0, 0.0]
    ys = np.zeros_like(xs)
    _same_with_and_without_reuse(f, [xs, ys], "torch")
    got = _build(f, "torch", True)["main"](xs, ys)
    want = torch.relu(torch.from_numpy(xs) + torch.from_numpy(ys))
    assert torch.equal(torch.signbit(got), torch.signbit(want)) and torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert "nn.relu" not in _reused(Function([x], op.nn.relu(x)), "torch")


def _bn_relu(training: bool, returned: str = "stats"):
    x, g, b, mm, mv = (var("x", shape=(2, 3, 4, 4)), var("g", shape=(3,)), var("b", shape=(3,)), var("mm", shape=(3,)),
                       var("mv", shape=(3,)))
    bn = op.nn.native_batch_norm(op.exp(x), g, b, mm, mv, training=training)
    y = op.nn.relu(pb.TupleGetItem(bn, 0))
    out = {"stats": Tuple([y, pb.TupleGetItem(bn, 1), pb.TupleGetItem(bn, 2)]),
           "output too": Tuple([y, pb.TupleGetItem(bn, 0)]), "tuple": Tuple([y, bn])}[returned]
    return Function([x, g, b, mm, mv], out)


def _bn_inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, 3, 4, 4)).astype("float32") - 1.0, rng.random(3).astype("float32") + 0.5,
            rng.standard_normal(3).astype("float32"), rng.standard_normal(3).astype("float32"),
            rng.random(3).astype("float32") + 0.5]


@pytest.mark.parametrize("training", [True, False])
def test_a_relu_after_a_batch_norm_runs_in_its_output_on_torch(training):
    """A batch norm's output is a buffer of its own (its statistics may be the moving ones given to it): the relu
    after it writes there, as eager's ``ReLU(inplace=True)``; not when the output or the whole tuple is returned."""
    pytest.importorskip("torch")
    f = _bn_relu(training)
    assert _reused(f, "torch") == {"nn.relu": 0}
    _same_with_and_without_reuse(f, _bn_inputs(), "torch")
    for returned in ("output too", "tuple"):
        g = _bn_relu(training, returned)
        assert "nn.relu" not in _reused(g, "torch"), returned
        _same_with_and_without_reuse(g, _bn_inputs(), "torch")


def _index_adds_on_torch(f, inputs) -> list:
    """The ATen ``index_add`` overloads (``index_add`` copies its data operand, ``index_add_`` adds into it) the torch
    target calls running ``f`` (``_aten_calls_on_torch``)."""
    return _aten_calls_on_torch(f, inputs, ("index_add", "index_add_"), lambda func, args: func.overloadpacket.__name__)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_embedding_gradient_adds_into_its_dying_zeros_on_torch(dtype):
    """``index_add(zeros, ids, g)`` (an embedding's gradient; copying the zeros first took 15 ms a step for
    BERT-base's vocabulary) adds into the zeros the plan owns, with repeated ids summed; data that is an input,
    is read again or is returned is copied first."""
    ids, g, w = var("ids", shape=(7,), dtype="int64"), var("g", shape=(7, N), dtype=dtype), var("w", shape=(5, N), dtype=dtype)
    grad = op.index_add(op.zeros((5, N), dtype), ids, g, axis=0)
    inputs = [np.array([0, 3, 3, 1, 0, 4, 3]), np.linspace(-2, 2, 7 * N, dtype=dtype).reshape(7, N),
              np.ones((5, N), dtype)]
    f = Function([ids, g, w], op.add(grad, w))
    assert _reused(f, "torch")["index_add"] == 0
    assert _index_adds_on_torch(f, inputs) == ["index_add_"]
    dense = np.zeros((5, N), dtype)
    np.add.at(dense, inputs[0], inputs[1])
    np.testing.assert_array_equal(_numpy(_build(f, "torch", True)["main"](*inputs)), dense + 1)
    base = op.multiply(w, w)
    for keep in (Function([ids, g, w], op.index_add(w, ids, g, axis=0)),  # an input
                 Function([ids, g, w], Tuple([op.index_add(base, ids, g, axis=0), base])),  # returned too
                 Function([ids, g, w], op.add(op.index_add(base, ids, g, axis=0), base))):  # read after it
        assert "index_add" not in _reused(keep, "torch")
        assert _index_adds_on_torch(keep, inputs) == ["index_add"]
        _same_with_and_without_reuse(keep, inputs, "torch")


def test_a_sequential_bfloat16_embedding_gradient_adds_into_its_zeros_as_it_rounds_on_torch():
    """The bfloat16 sums ``sequential`` asks for are rounded after each addition, as eager's embedding backward
    (``index_put_`` with ``accumulate``) rounds them, also added into the dying zeros."""
    torch = pytest.importorskip("torch")
    ids, g = var("ids", shape=(9,), dtype="int64"), var("g", shape=(9, N), dtype="bfloat16")
    f = Function([ids, g], op.index_add(op.zeros((3, N), "bfloat16"), ids, g, axis=0, sequential=True))
    assert _reused(f, "torch")["index_add"] == 0
    inputs = [torch.tensor([0, 2, 2, 2, 1, 0, 2, 2, 1]), torch.linspace(-3, 3, 9 * N).reshape(9, N).to(torch.bfloat16)]
    got = _build(f, "torch", True)["main"](*inputs)
    want = torch.zeros(3, N, dtype=torch.bfloat16).index_put_((inputs[0],), inputs[1], accumulate=True)
    assert torch.equal(got, want)


def test_a_cross_entropy_gradient_runs_in_its_nll_gradient_on_torch():
    """``log_softmax_grad(nll_loss_grad(g, y, t, w), y)`` (a cross-entropy's gradient) writes into the NLL gradient
    it reads last (two tensors of the logits' size at once instead of three: 196 MiB less at GPT-2's vocabulary and
    1024 tokens), with eager's bits: ``F.cross_entropy``'s gradient through autograd, ignored targets included."""
    torch = pytest.importorskip("torch")
    n, c = 9, 37
    x, t, g = var("x", shape=(n, c)), var("t", shape=(n,), dtype="int64"), var("g", shape=())
    y = op.nn.log_softmax(x, axis=1)
    dx = op.nn.log_softmax_grad(op.nn.nll_loss_grad(g, y, t, op.ones((c,), "float32")), y, axis=1)
    f = Function([x, t, g], dx)
    assert _reused(f, "torch") == {"nn.log_softmax_grad": 0}
    xs = torch.randn(n, c, generator=torch.Generator().manual_seed(0))
    ts = torch.randint(0, c, (n,), generator=torch.Generator().manual_seed(1))
    ts[::4] = -100
    got = _build(f, "torch", True)["main"](xs, ts, torch.tensor(1.7))
    leaf = xs.clone().requires_grad_()
    (torch.nn.functional.cross_entropy(leaf, ts) * 1.7).backward()
    assert torch.equal(got, leaf.grad)
    _same_with_and_without_reuse(f, [xs.numpy(), ts.numpy(), np.float32(1.7)], "torch")


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_a_softmax_gradient_runs_in_a_dying_output_gradient_along_the_last_axis_on_torch(name):
    """A softmax's (or log-softmax's) gradient writes into its output gradient's tensor when that dies there and
    the rows lie along the innermost axis (ATen reads each row before writing it); otherwise into a new one."""
    pytest.importorskip("torch")
    x, a = var("x", shape=(4, 5, 6)), var("a", shape=(4, 5, 6))
    forward, backward = getattr(op.nn, name), getattr(op.nn, name + "_grad")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((4, 5, 6)).astype("float32") for _ in range(2)]
    for axis, in_place in ((-1, True), (2, True), (1, False)):
        y = forward(x, axis=axis)
        dy = op.multiply(a, a)  # owned, dies at the gradient
        f = Function([x, a], backward(dy, y, axis=axis))
        assert _reused(f, "torch").get(f"nn.{name}_grad") == (0 if in_place else None)
        _same_with_and_without_reuse(f, inputs, "torch")
    y = forward(x, axis=-1)
    dy = op.multiply(a, a)
    read_again = Function([x, a], op.add(backward(dy, y, axis=-1), dy))
    assert f"nn.{name}_grad" not in _reused(read_again, "torch")
    _same_with_and_without_reuse(read_again, inputs, "torch")


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_a_softmax_gradient_of_a_strided_output_gradient_gets_a_new_tensor_on_torch(name):
    """An output gradient that owns its memory but is not row-major (a product of transposed views keeps their
    order: Longformer's chunked attention) cannot be written in place: ATen writes its output as a dense array.
    Its gradient is a new tensor, equal to the one without buffer reuse."""
    pytest.importorskip("torch")
    x, a = var("x", shape=(4, 5, 6)), var("a", shape=(6, 5, 4))
    t = op.transpose(a, (2, 1, 0))
    dy = op.multiply(t, t)  # owned, dies at the gradient, strided like the transposed view
    forward, backward = getattr(op.nn, name), getattr(op.nn, name + "_grad")
    f = Function([x, a], backward(dy, forward(x, axis=-1), axis=-1))
    assert _reused(f, "torch").get(f"nn.{name}_grad") == 0
    rng = np.random.default_rng(1)
    _same_with_and_without_reuse(f, [rng.standard_normal((4, 5, 6)).astype("float32"),
                                     rng.standard_normal((6, 5, 4)).astype("float32")], "torch")
