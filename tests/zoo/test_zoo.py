"""The model zoo (tests/zoo/models.py): each model imports, differentiates and trains exactly like eager PyTorch.

For every model: the loss and every parameter gradient of the imported program (``FirstOrderGradient``) equal
eager autograd in float64 with dropout active (masks drawn as eager draws them); five SGD steps through
``pullback.integrations.torch.compile`` and through ``torch.compile(backend="pullback")`` track eager (float32).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import pullback as pb  # noqa: E402
from pullback.frontend import import_torch, main_inputs  # noqa: E402
from pullback.integrations.torch import draw_masks  # noqa: E402

from models import TORCH_COMPILE_ONLY, ZOO  # noqa: E402
from tracking import compare, compiled_tracks_eager, train  # noqa: E402

RNNS = ("lstm", "gru")
# models that compute part of a float64 forward in float32 on purpose (their float64 check has float32's tolerance)
FLOAT32_INSIDE = {"t5": "T5LayerNorm computes the variance in float32", "gpt2": "the LM loss upcasts logits to float32",
                  "bart": "the LM loss upcasts logits to float32"}


def make(name, dtype=torch.float32):
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    model = model.to(dtype).train()
    return model, tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)


def eager_params(model) -> dict:
    return dict(model.named_parameters())


@pytest.mark.parametrize("name", list(ZOO))
def test_loss_and_every_gradient_equal_eager_float64(name):
    model, inputs = make(name, torch.float64)
    prog = import_torch(model, inputs)
    mod = pb.transform.FirstOrderGradient(wrt=prog.trainable, mode="vjp")(prog.mod)
    out_type = prog.main.body.checked_type
    ct = np.ones((), out_type.dtype) if prog.single_output else tuple(
        np.ones(t.shape, t.dtype) if i == 0 else np.zeros(t.shape, t.dtype) for i, t in enumerate(out_type.fields))
    # tight in float64; HF's causal-LM and seq2seq losses upcast the logits to float32 (then float32's tolerance)
    loss_dtype = out_type.dtype if prog.single_output else out_type.fields[0].dtype
    rtol, atol = (1e-10, 1e-12) if loss_dtype == "float64" and name not in FLOAT32_INSIDE else (2e-6, 1e-7)
    torch.manual_seed(7)
    masks = [m.numpy() for m in draw_masks(prog)]
    out, grads = pb.build(mod)["main_grad"](*main_inputs(prog, inputs, masks), ct)
    torch.manual_seed(7)
    loss = model(*inputs)
    loss.backward()
    got_loss = out if prog.single_output else out[0]
    np.testing.assert_allclose(got_loss, loss.item(), rtol=rtol)
    params = eager_params(model)
    covered = set()
    for name_, g in zip(prog.trainable, grads):
        keys = prog.state_names[name_]
        p = model.get_parameter(keys[0])
        covered.update(keys)
        want = np.zeros(p.shape) if p.grad is None else p.grad.numpy()
        np.testing.assert_allclose(g, want, rtol=max(rtol, 1e-8) * 100, atol=atol * 100, err_msg=f"{name}: gradient of {keys}")
    missing = [k for k, p in params.items() if p.grad is not None and k not in covered]
    assert not missing, f"parameters with an eager gradient but no pullback parameter: {missing}"


@pytest.mark.parametrize("name", list(ZOO))
def test_five_sgd_steps_through_compile_track_eager(name):
    model, inputs = make(name)
    compiled_tracks_eager(name, model, inputs)


def torch_compile_tracks_eager(name, model, inputs, allow_rnn: bool = False) -> None:
    import torch._dynamo

    eager = copy.deepcopy(model)
    ref = train(eager, inputs)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=allow_rnn):
        compiled = torch.compile(model, backend="pullback", dynamic=False)
        got = train(compiled, inputs)
    torch._dynamo.reset()
    compare(name, eager, model, ref, got, prefix="_orig_mod.")


@pytest.mark.parametrize("name", list(ZOO))
def test_five_sgd_steps_through_torch_compile_track_eager(name):
    torch_compile_tracks_eager(name, *make(name), allow_rnn=name in RNNS)


@pytest.mark.parametrize("make_model, what", list(TORCH_COMPILE_ONLY.items()), ids=lambda v: getattr(v, "__name__", v))
def test_what_torch_export_cannot_trace_says_so_and_trains_through_torch_compile(make_model, what):
    """A CTC loss (its lengths tensors), an RNN over a PackedSequence, a sparse adjacency matrix, a matching
    computed in NumPy: from_torch's error names the cause and both ways out; through
    torch.compile(backend="pullback") (those parts run eagerly) five steps track eager."""
    torch.manual_seed(0)
    model, inputs = make_model()
    with pytest.raises(pb.PullbackError, match=rf"{what}.*torch.compile\(model, backend=\"pullback\"\)"):
        import_torch(model, inputs)
    torch_compile_tracks_eager(make_model.__name__, model, inputs)
