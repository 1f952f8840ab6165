"""What the PyTorch importer accepts, checked before ``torch.export`` runs.

``check_inputs``: every example input is a CPU tensor of a supported dtype (not
an ``int``, a list, a NumPy array or a meta tensor); ``check_module_state``:
parameters and buffers hold data on the CPU (not meta tensors), and no module has
backward hooks (``tensor_hooks_refused``: nor does forward register tensor hooks).
Each failure is
one ``PullbackError`` that names the value and says what is supported.
``quiet_torch_logs``: torch's own log lines about a failing export stay quiet
(the ``PullbackError`` carries torch's reason).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator, Sequence

from ..ir.errors import PullbackError
from ..ir.types import ALL_DTYPES

__all__ = ["check_inputs", "keyword_labels", "keyword_arguments", "check_module_state", "check_backward_hooks", "tensor_hooks_refused", "attribute_writes_warned", "quiet_torch_logs"]


def _describe(value) -> str:
    name = type(value).__name__
    text = " ".join(repr(value).split())
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({text if len(text) <= 40 else text[:37] + '...'})"


def _device_problem(t, meta_hint: str = "") -> str:
    if t.device.type == "cpu":
        return ""
    why = f"meta tensors have a shape but no data{meta_hint}" if t.device.type == "meta" else "move it with .cpu()"
    return f"is on device {t.device}; pullback needs CPU tensors with data ({why})"


def _supported(t) -> bool:
    """Is the tensor's dtype one pullback computes in?"""
    return str(t.dtype).removeprefix("torch.") in ALL_DTYPES


def keyword_labels(keywords: Sequence) -> list:
    """One name per value passed by keyword: a keyword is a name, or ``(name, spec)`` for a tuple, list or dict of
    tensors (``spec``: its ``torch.utils._pytree`` structure, one value per leaf, named ``name[i]``)."""
    out: list = []
    for k in keywords:
        out += [k] if isinstance(k, str) else [f"{k[0]}[{i}]" for i in range(k[1].num_leaves)]
    return out


def keyword_arguments(keywords: Sequence, values: Sequence) -> dict:
    """The keyword arguments ``keywords`` (``keyword_labels``) and their leaves ``values`` stand for."""
    from torch.utils._pytree import tree_unflatten

    out, i = {}, 0
    for k in keywords:
        if isinstance(k, str):
            out[k], i = values[i], i + 1
        else:
            n = k[1].num_leaves
            out[k[0]], i = tree_unflatten(list(values[i: i + n]), k[1]), i + n
    return out


def check_inputs(values: Sequence, who: str, what: str = "example input", keywords: Sequence = ()) -> None:
    """Raise ``PullbackError`` unless every value is a CPU tensor with a supported dtype; the last values were
    passed by these keywords (``keyword_labels``: named so in the message)."""
    import torch

    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    names = keyword_labels(keywords)
    first_keyword = len(values) - len(names)
    for i, v in enumerate(values):
        label = f"{what} {i}" if i < first_keyword else f"keyword {what} {names[i - first_keyword]!r}"
        if not isinstance(v, torch.Tensor):
            raise PullbackError(
                f"{who}: {label} is {_describe(v)}; pullback takes tensors only (a number: pass "
                f"torch.tensor(value); a fixed setting: make it an attribute of the module)")
        problem = _device_problem(v)
        if problem:
            raise PullbackError(f"{who}: {label} {problem}")
        if wrapped(v):
            raise PullbackError(
                f"{who}: {label} is a tensor of a torch.func transform (vmap, grad, jacrev, ...); these transforms "
                "do not reach pullback's programs: differentiate with autograd (loss.backward(), torch.autograd.grad, "
                "create_graph=True for higher orders) and batch with a batch dimension")
        if v.layout != torch.strided:
            raise PullbackError(
                f"{who}: {label} is a {str(v.layout).removeprefix('torch.')} tensor; pullback computes on dense "
                "tensors: pass it .to_dense() (a graph's adjacency: or its edges as index tensors, with index_add), "
                "or train through torch.compile(model, backend=\"pullback\"), which runs the sparse operators eagerly")
        if not _supported(v):
            raise PullbackError(f"{who}: {label} has dtype {v.dtype}; supported: {', '.join(ALL_DTYPES)}")


def check_module_state(module, who: str) -> None:
    """Raise ``PullbackError`` if a parameter or buffer of ``module`` is not a CPU tensor with data, or has a dtype
    pullback does not compute in (float8 and the like: the module converted with ``.float()`` keeps its values exactly)."""
    for kind, items in (("parameter", getattr(module, "named_parameters", None)),
                        ("buffer", getattr(module, "named_buffers", None))):
        if items is None:
            continue
        for name, t in items():
            problem = _device_problem(t, ": load real values first, e.g. module.to_empty(device='cpu') "
                                         "then load_state_dict")
            if problem:
                raise PullbackError(f"{who}: {kind} {name} {problem}")
            if not _supported(t):
                hint = (f": convert the module with module.float() first (every {t.dtype} value is exact in float32)"
                        if t.is_floating_point() else "")
                raise PullbackError(f"{who}: {kind} {name} has dtype {t.dtype}, which pullback does not compute in "
                                    f"(supported: {', '.join(ALL_DTYPES)}){hint}")
    if hasattr(module, "named_modules"):
        check_backward_hooks(module, who)


HOOKS_HINT = ("pullback runs the backward as one compiled program and cannot call them: a hook that changes a "
              "gradient would be ignored and one that records it would not run. Remove them or train this module "
              "eagerly; hooks on parameters (p.register_hook) and forward hooks run as usual")


def check_backward_hooks(module, who: str) -> None:
    """Raise ``PullbackError`` if ``module`` or a submodule has backward hooks (``register_full_backward_hook``,
    ``register_full_backward_pre_hook``, the legacy ``register_backward_hook``), or global ones."""
    import torch.nn.modules.module as mm

    found = [name or "the module itself" for name, m in module.named_modules()
             if getattr(m, "_backward_hooks", None) or getattr(m, "_backward_pre_hooks", None)]
    if mm._global_backward_hooks or mm._global_backward_pre_hooks:
        found.append("every module (torch.nn.modules.module.register_module_full_backward_hook)")
    if found:
        raise PullbackError(f"{who}: backward hooks on {', '.join(found)} (handle.remove() removes one); {HOOKS_HINT}")


GRAD_IN_FORWARD_HINT = (
    "a gradient taken inside the forward (a gradient penalty, a meta-learning inner step), which torch.export "
    "cannot trace: train it through torch.compile(model, backend=\"pullback\"), which runs that part eagerly "
    "between the graphs it compiles")


@contextmanager
def tensor_hooks_refused(who: str) -> Iterator[None]:
    """While the block runs (``torch.export``), ``Tensor.register_hook`` and ``torch.autograd.grad`` calls from
    outside torch are recorded; when the block ends, a ``PullbackError`` names each hook (the trace keeps none: it
    would silently not run), and an export that fails after a gradient was taken in forward says so."""
    import sys

    import torch

    root = torch.__file__.rsplit("/", 1)[0]
    hooks: list = []
    grads: list = []

    def recording(original, calls: list):
        def call(*args, **kwargs):
            caller = sys._getframe(1)
            if not caller.f_code.co_filename.startswith(root):
                calls.append(f"{caller.f_code.co_filename}:{caller.f_lineno}")
            return original(*args, **kwargs)

        return call

    register_hook, grad = torch.Tensor.__dict__["register_hook"], torch.autograd.grad
    torch.Tensor.register_hook = recording(register_hook, hooks)
    torch.autograd.grad = recording(grad, grads)
    try:
        yield
    except Exception as e:
        if grads and not isinstance(e, PullbackError):
            raise PullbackError(f"{who}: forward calls torch.autograd.grad (at {', '.join(dict.fromkeys(grads))}): "
                                f"{GRAD_IN_FORWARD_HINT}; torch.export's error: {type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}") from e
        raise
    finally:
        torch.Tensor.register_hook, torch.autograd.grad = register_hook, grad
    if hooks:
        raise PullbackError(f"{who}: forward registers a gradient hook on a tensor (Tensor.register_hook at "
                            f"{', '.join(dict.fromkeys(hooks))}); {HOOKS_HINT}; or train it through "
                            "torch.compile(model, backend=\"pullback\"), which runs the graph registering it eagerly")


@contextmanager
def attribute_writes_warned(who: str) -> Iterator[None]:
    """While the block runs (``torch.export``), attributes that forward assigns on a module (not its parameters,
    buffers or submodules; from code outside torch) are recorded; when it ends, a warning names each with its line:
    the exported program keeps no such side effect, so a compiled call leaves them as they were."""
    import sys
    import warnings

    import torch

    root = torch.__file__.rsplit("/", 1)[0]
    original = torch.nn.Module.__setattr__
    writes: dict = {}

    def setattr_(self, name, value):
        caller = sys._getframe(1)
        state = self.__dict__
        if ("_parameters" in state and caller.f_code.co_name != "__init__"
                and not caller.f_code.co_filename.startswith(root)
                and not any(name in state.get(k, ()) for k in ("_parameters", "_buffers", "_modules"))
                and not isinstance(value, torch.nn.Module)):
            writes.setdefault(f"{type(self).__name__}.{name}", f"{caller.f_code.co_filename}:{caller.f_lineno}")
        return original(self, name, value)

    torch.nn.Module.__setattr__ = setattr_
    try:
        yield
    finally:
        torch.nn.Module.__setattr__ = original
    if writes:
        where = "; ".join(f"{k} at {v}" for k, v in writes.items())
        warnings.warn(f"{who}: forward assigns module attributes ({where}); a compiled call does not (the exported "
                      "program computes tensors only): later calls read them as they were before compiling. State "
                      "that changes at each step belongs in a buffer updated in place (register_buffer, copy_) or an "
                      "input; torch.compile(model, backend=\"pullback\") replays such assignments", stacklevel=3)


@contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """torch's loggers at CRITICAL while the block runs (restored afterwards)."""
    logger = logging.getLogger("torch")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)
