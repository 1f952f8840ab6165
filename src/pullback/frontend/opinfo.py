"""The importer checked against PyTorch's own operator tests (OpInfo, ``op_db``).

For every OpInfo that exercises a Core ATen operator (``OPINFOS``), each sample
input (float32 and float64) goes through ``torch.export`` -> ``import_exported``
-> the numpy target, and its values and gradients (``FirstOrderGradient`` in
``vjp`` mode, a random cotangent) are compared with eager PyTorch and autograd.
Each sample ends ``passed``, ``skipped`` (with the reason: torch.export refused
it, a dtype pullback lacks, a limit the importer reports) or ``failed`` (a wrong
value or gradient, or a crash). ``scripts/opinfo_report.py`` runs every sample
and writes ``docs/opinfo.md``; the test suite runs a few samples per operator.

A developer tool: needs torch (and ``expecttest``, which ``op_db`` imports).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from ..ir.errors import PullbackError
from ..ir.types import ALL_DTYPES, real_of

# core packet (or converted composite) -> OpInfo names (``name`` or ``name.variant``) beyond the ones whose
# ``aten_name`` already names it
ALIASES: dict[str, tuple] = {
    "_softmax": ("softmax",), "_log_softmax": ("log_softmax",),
    "convolution": ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d", "nn.functional.conv_transpose1d",
                    "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d"),
    "embedding": ("nn.functional.embedding",), "native_dropout": ("nn.functional.dropout",),
    "upsample_nearest2d": ("nn.functional.interpolate.nearest", "nn.functional.upsample_nearest"),
    "upsample_bilinear2d": ("nn.functional.interpolate.bilinear", "nn.functional.upsample_bilinear"),
    "_adaptive_avg_pool2d": ("nn.functional.adaptive_avg_pool2d",), "_adaptive_avg_pool3d": ("nn.functional.adaptive_avg_pool3d",),
    "adaptive_avg_pool1d": ("nn.functional.adaptive_avg_pool1d",),
    "max_pool2d_with_indices": ("nn.functional.max_pool2d", "nn.functional.max_pool1d"),
    "max_pool3d_with_indices": ("nn.functional.max_pool3d",), "elu": ("nn.functional.elu",),
    "reflection_pad2d": ("nn.functional.pad.reflect",), "replication_pad2d": ("nn.functional.pad.replicate",),
    "_cdist_forward": ("cdist",), "_pdist_forward": ("nn.functional.pdist",), "_embedding_bag": ("nn.functional.embedding_bag",),
    "_fft_r2c": ("fft.rfft", "fft.rfft2", "fft.rfftn", "fft.ihfft", "fft.ihfft2", "fft.ihfftn", "fft.fft", "fft.fft2",
                 "fft.fftn", "fft.ifft", "fft.ifft2", "fft.ifftn"),
    "_fft_c2r": ("fft.irfft", "fft.irfft2", "fft.irfftn", "fft.hfft", "fft.hfft2", "fft.hfftn"),
    "col2im": ("nn.functional.fold",),
    "native_group_norm": ("nn.functional.group_norm",), "native_layer_norm": ("nn.functional.layer_norm",),
    "_native_batch_norm_legit_no_training": ("nn.functional.batch_norm",), "index": ("__getitem__",),
    "_local_scalar_dense": ("item",), "avg_pool2d": ("nn.functional.avg_pool2d",),
    "scaled_dot_product_attention": ("nn.functional.scaled_dot_product_attention",),
    "linear": ("nn.functional.linear",), "cross_entropy_loss": ("nn.functional.cross_entropy",),
    "matmul": ("matmul",), "silu": ("nn.functional.silu",), "mse_loss": ("nn.functional.mse_loss",),
    "mish": ("nn.functional.mish",), "binary_cross_entropy_with_logits": ("nn.functional.binary_cross_entropy_with_logits",),
    "multilabel_margin_loss": ("nn.functional.multilabel_margin_loss",), "linalg_vector_norm": ("linalg.vector_norm",),
    "histc": ("histc",), "index_fill": ("index_fill",), "_safe_softmax": ("torch.ops.aten._safe_softmax.default",),
    "var_mean": ("var_mean", "var_mean.unbiased"), "lgamma": ("lgamma",), "digamma": ("digamma",),
    "unfold": ("unfold", "unfold_copy"), "erfc": ("erfc",), "exp2": ("exp2",),
    "polygamma": ("polygamma.polygamma_n_0", "polygamma.polygamma_n_1", "polygamma.polygamma_n_2",
                  "polygamma.polygamma_n_3", "polygamma.polygamma_n_4"),
    "tril": ("tril",), "triu": ("triu",), "linalg_cholesky_ex": ("linalg.cholesky", "linalg.cholesky_ex", "cholesky"),
    "linalg_solve_triangular": ("linalg.solve_triangular",), "cholesky_solve": ("cholesky_solve",),
    "_linalg_solve_ex": ("linalg.solve", "linalg.solve_ex"), "linalg_inv_ex": ("linalg.inv", "linalg.inv_ex"),
    "_linalg_slogdet": ("linalg.slogdet", "logdet"), "_linalg_det": ("linalg.det", "det"),
    "cholesky_inverse": ("cholesky_inverse",), "cumprod": ("cumprod", "linalg.vander"), "hypot": ("hypot",),
    "copysign": ("copysign",), "signbit": ("signbit",), "dist": ("dist",),
    "linalg_matrix_exp": ("linalg.matrix_exp", "matrix_exp"), "linalg_householder_product": ("linalg.householder_product",),
    "median": ("median",), "kthvalue": ("kthvalue",), "erfinv": ("erfinv",), "special_ndtri": ("special.ndtri",),
    "special_log_ndtr": ("special.log_ndtr",), "i0": ("i0",), "special_i0e": ("special.i0e",),
    "special_i1": ("special.i1",), "special_i1e": ("special.i1e",), "searchsorted": ("searchsorted",),
    "bucketize": ("bucketize",), "_linalg_eigh": ("linalg.eigvalsh",),  # eigh, svd: singular vector signs are pullback's
    "_linalg_svd": ("linalg.svdvals", "linalg.matrix_norm", "nuclear_norm"),
    "linalg_pinv": ("linalg.pinv", "linalg.pinv.hermitian", "pinverse"), "linalg_qr": ("linalg.qr", "qr"),
    "logcumsumexp": ("logcumsumexp",), "cummax": ("cummax",), "cummin": ("cummin",), "addmv": ("addmv",),
    "addbmm": ("addbmm",), "view_copy": ("view_copy",), "permute_copy": ("permute_copy",), "narrow_copy": ("narrow_copy",),
    "diagonal_scatter": ("diagonal_scatter",),  # as_strided_scatter: eager's input gradient is not the scatter's
    "masked_select": ("masked_select",), "complex": ("complex",), "polar": ("polar",), "angle": ("angle",),
    "ldexp": ("ldexp",), "nanmedian": ("nanmedian", "masked.median"),
    "adaptive_max_pool2d": ("nn.functional.adaptive_max_pool2d",), "adaptive_max_pool3d": ("nn.functional.adaptive_max_pool3d",),
    "exponential": ("exponential",), "uniform": ("uniform",), "cauchy": ("cauchy",), "geometric": ("geometric",),
    "log_normal": ("log_normal",), "grid_sampler_3d": ("grid_sampler_3d",),
    "put": ("put",), "rrelu_with_noise_functional": ("nn.functional.rrelu",),
    "index_reduce": ("index_reduce.prod", "index_reduce.mean", "index_reduce.amax", "index_reduce.amin"),
    "triangular_solve": ("triangular_solve",),
}
DTYPES_CHECKED = ("float32", "float64")
# value / gradient tolerances (rtol, atol) per dtype
VALUE_TOL = {"float32": (1e-4, 1e-5), "float64": (1e-7, 1e-7)}  # float32: reductions of many terms (conv3d, attention)
GRAD_TOL = {"float32": (1e-4, 1e-4), "float64": (1e-6, 1e-6)}


@dataclass
class SampleResult:
    """The outcome of one sample: ``status`` is passed | skipped | failed | unrun (its OpInfo's time budget ran out)."""

    opinfo: str
    dtype: str
    index: int
    status: str
    reason: str = ""
    grad_checked: bool = False


def full_name(info) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


def opinfos(names: Optional[Iterable[str]] = None) -> list:
    """The OpInfos of ``op_db`` that exercise a Core ATen operator or a converted composite, by full name."""
    from torch.testing._internal.common_methods_invocations import op_db

    from .core_aten import core_overloads

    packets = {str(o).split(".")[1] for o in core_overloads()}
    wanted = {n for names_ in ALIASES.values() for n in names_}
    picked = [o for o in op_db if o.aten_name in packets or full_name(o) in wanted or o.name in wanted]
    seen, out = set(), []
    for o in picked:
        if full_name(o) not in seen and (names is None or full_name(o) in names):
            seen.add(full_name(o))
            out.append(o)
    return out


def _leaves(value) -> list:
    """The tensors inside ``value`` (nested lists/tuples/dicts), in a fixed order."""
    import torch

    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            stack.extend(reversed(list(v.values())))
    return out


def _replace(value, tensors: list):
    """``value`` with its tensors replaced, in ``_leaves`` order, by ``tensors`` (consumed from the front)."""
    import torch

    if isinstance(value, torch.Tensor):
        return tensors.pop(0)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_replace(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _replace(v, tensors) for k, v in value.items()}
    return value


def _constraining_wrapper(info):
    """The OpInfo's gradcheck wrapper when it restricts an input to the matrices the operator is defined on
    (a triangle for ``cholesky_solve``'s factor, a symmetric part for ``cholesky``'s argument): PyTorch's
    gradients are specified through it, and outside that set they are not the derivative of the value."""
    import inspect

    wrapper = info.gradcheck_wrapper
    try:
        source = inspect.getsource(wrapper)
    except (OSError, TypeError):
        return None
    return wrapper if "triangular_input" in source or "hermitian_input" in source else None


def _call_module(fn, sample, wrapper=None):
    """An ``nn.Module`` whose inputs are the sample's tensors and whose forward calls ``fn`` on them (through
    ``wrapper(fn, input, *args, **kwargs)`` when given)."""
    import torch

    target = fn if wrapper is None else (lambda *a, **k: wrapper(fn, *a, **k))

    class Call(torch.nn.Module):
        fn = staticmethod(target)

        def forward(self, *tensors):
            ts = list(tensors)
            inp = _replace(sample.input, ts)
            args = _replace(sample.args, ts)
            kwargs = _replace(sample.kwargs, ts)
            out = target(inp, *args, **kwargs)
            return tuple(out) if isinstance(out, (tuple, list)) else out

    return Call()


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()[0]
    text = re.sub(r"0x[0-9a-f]+", "0x..", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Skip(Exception):
    pass


def run_sample(info, sample, dtype: str, index: int = 0, check_grad: bool = True) -> SampleResult:
    """Export, import and run one OpInfo sample; compare values (and gradients) with PyTorch."""
    res = SampleResult(full_name(info), dtype, index, "passed")
    try:
        res.grad_checked = _check(info, sample, check_grad)
    except _Skip as e:
        res.status, res.reason = "skipped", str(e)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        res.status, res.reason = "failed", " ".join(lines[:5])[:400] if lines else "assertion"
    except Exception as e:  # noqa: BLE001 - a crash of pullback is a failure, reported with its message
        res.status, res.reason = "failed", "crash: " + _first_line(e, 300)
    return res


def _check(info, sample, check_grad: bool) -> bool:
    import torch

    from ..runtime import build
    from ..transform import FirstOrderGradient
    from .torch_importer import UnsupportedOperatorError, export, import_exported

    leaves = _leaves([sample.input, sample.args, sample.kwargs])
    for t in leaves:
        name = str(t.dtype).replace("torch.", "")
        if name not in ALL_DTYPES:
            raise _Skip(f"input dtype {name} is not a pullback dtype")
    inputs = [t.detach().clone() for t in leaves]
    module = _call_module(info.op, sample, _constraining_wrapper(info))
    after = [t.clone() for t in inputs]  # eager mutates these in place (batch norm's running statistics, renorm)
    torch.manual_seed(0)
    try:
        expected = module(*after)
    except Exception as e:  # noqa: BLE001
        raise _Skip(f"eager PyTorch raises: {_first_line(e)}") from None
    outs = _outputs(expected)
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise _Skip("the result is not a tensor (or tuple of tensors)")
    for o in outs:
        if str(o.dtype).replace("torch.", "") not in ALL_DTYPES:
            raise _Skip(f"result dtype {o.dtype} is not a pullback dtype")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = export(module, [t.clone() for t in inputs])
    except PullbackError as e:
        raise _Skip(str(e).replace("from_torch: ", "")[:200]) from None
    try:
        prog = import_exported(ep)
    except UnsupportedOperatorError as e:
        raise _Skip("not converted: " + "; ".join(sorted({_problem(d) for d in e.diagnostics}))) from None
    args = [t.numpy() for t in inputs] + list(prog.params.values()) + _masks(prog, module, inputs)
    result = build(prog.mod)["main"](*args)
    got = [result] if prog.single_output else list(result)
    assert len(got) == len(outs) + len(prog.mutations), f"{len(got)} results, PyTorch gives {len(outs)}"
    mutated = [prog.inputs.index(name) for _, name in prog.mutations]  # a sample's module has inputs only
    dtype = str(outs[0].dtype).replace("torch.", "")
    rtol, atol = VALUE_TOL.get(real_of(dtype), (1e-5, 1e-5))
    for k, (g, o) in enumerate(zip(got, outs + [after[i] for i in mutated])):
        g = np.asarray(g)
        want = o.detach().resolve_conj().numpy()
        what = f"result {k}" if k < len(outs) else f"new value of input {mutated[k - len(outs)]}"
        assert g.dtype == want.dtype, f"{what}: dtype {g.dtype}, PyTorch {want.dtype}"
        assert g.shape == want.shape, f"{what}: shape {g.shape}, PyTorch {want.shape}"
        if _undefined_values(info):
            continue
        if not np.allclose(g, want, rtol=rtol, atol=atol, equal_nan=True) and _as_accurate_as_eager(module, inputs, k, g, want):
            continue
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    if not check_grad or not info.supports_autograd:
        return False
    return _check_grad(prog, inputs, outs, module, args, build, FirstOrderGradient, mutated)


def _as_accurate_as_eager(module, inputs, k: int, got, want) -> bool:
    """A float32 result ``k`` off by rounding: ours is no further from eager's float64 result (same inputs, upcast)
    than twice eager's own float32 error (long sums: a small entry of a large convolution output)."""
    import torch

    if want.dtype != np.float32:
        return False
    try:
        torch.manual_seed(0)
        exact = _outputs(module(*[t.double() if t.dtype == torch.float32 else t.clone() for t in inputs]))[k]
        exact = exact.detach().numpy()
    except Exception:  # noqa: BLE001 - no float64 reference: the plain comparison decides
        return False
    return exact.dtype == np.float64 and _no_further(got, want, exact)


def _problem(diagnostic: str) -> str:
    """``operator: reason`` of one importer diagnostic (no source lines, no counts)."""
    lines = diagnostic.splitlines()
    op = lines[0].split(" (")[0]
    details = sorted({ln.split("): ", 1)[1] if "): " in ln else "" for ln in lines[1:]} - {""})
    return op + (f": {details[0][:150]}" if details else "")


def _undefined_values(info) -> bool:
    """Operators whose values PyTorch leaves undefined (uninitialised memory)."""
    return info.name in ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")


def _masks(prog, module, inputs) -> list:
    """Random inputs drawn as eager draws them (the sample ran eagerly after ``manual_seed(0)``)."""
    import torch

    if not prog.masks:
        return []
    from ..integrations.torch import draw_masks

    torch.manual_seed(_seed_of(module))
    return [m.numpy() for m in draw_masks(prog)]


def _seed_of(module) -> int:
    """The seed eager's random draws used: OpInfo wraps random operators in ``wrapper_set_seed`` (seed 42)."""
    fn = module.fn
    code = getattr(fn, "__code__", None)
    return 42 if code is not None and "wrapper_set_seed" in code.co_names else 0


def _check_grad(prog, inputs, outs, module, args, build, FirstOrderGradient, mutated=()) -> bool:
    """Autograd against ``FirstOrderGradient`` (vjp) with respect to the float inputs (those eager differentiates:
    not batch norm's running statistics, nor a leaf the sample updates in place); new values of mutated inputs
    get a zero cotangent."""
    float_out = [k for k, o in enumerate(outs) if o.is_floating_point() or o.is_complex()]
    float_in = [i for i, t in enumerate(inputs) if t.is_floating_point() or t.is_complex()]
    rng = np.random.default_rng(0)
    cts = [_cotangent(rng, o) for o in outs]
    if not float_in or not float_out:
        return False
    try:
        wrt_in, want = float_in, _autograd(module, inputs, float_in, cts, float_out)
    except Exception as e:  # noqa: BLE001 - eager refuses some input (a mutated leaf, batch norm's running stats)
        wrt_in = [i for i in float_in if _differentiable_in_eager(module, inputs, i, cts, float_out)]
        if not wrt_in:
            raise _Skip(f"values equal; PyTorch autograd raises: {_first_line(e)}") from None
        want = _autograd(module, inputs, wrt_in, cts, float_out)
    if want is None:
        return False
    wrt = [prog.inputs[i] for i in wrt_in]
    try:
        mod = FirstOrderGradient("main", wrt=wrt, mode="vjp")(prog.mod)
    except PullbackError as e:
        raise _Skip(f"values equal; no gradient: {_first_line(e)}") from None
    cts += [np.zeros(tuple(inputs[i].shape), str(inputs[i].dtype).replace("torch.", "")) for i in mutated]
    ct = cts[0] if prog.single_output else tuple(cts)
    _, grads = build(mod)["main_grad"](*args, ct)
    dtype = str(inputs[wrt_in[0]].dtype).replace("torch.", "")
    rtol, atol = GRAD_TOL.get(dtype, (1e-4, 1e-4))
    exact = None
    for k, (i, g, w) in enumerate(zip(wrt_in, grads, want)):
        if w is not None and w._is_zerotensor():  # autograd's symbolic zero (sgn of a real input)
            w = None
        w = np.zeros(tuple(inputs[i].shape), dtype) if w is None else (w.to_dense() if w.is_sparse else w).resolve_conj().numpy()
        g = np.asarray(g)
        if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True) and w.dtype == np.float32:
            exact = _autograd64(module, inputs, wrt_in, cts, float_out) if exact is None else exact
            if exact is not None and _no_further(g, w, exact[k]):
                continue
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"gradient of input {i}")
    return True


def _autograd64(module, inputs, wrt_in, cts, float_out):
    """Eager's vjp with float32 inputs and cotangents upcast to float64 (None where eager refuses)."""
    import torch

    up = [t.double() if t.dtype == torch.float32 else t for t in inputs]
    try:
        got = _autograd(module, up, wrt_in, [c.astype(np.float64) if c.dtype == np.float32 else c for c in cts], float_out)
    except Exception:  # noqa: BLE001 - no float64 reference: the plain comparison decides
        return None
    return None if got is None else [np.zeros(up[i].shape) if w is None else w.numpy() for i, w in zip(wrt_in, got)]


def _no_further(got: np.ndarray, want: np.ndarray, exact: np.ndarray) -> bool:
    """A float32 result off by rounding: ``got`` is no further from the float64 result ``exact`` than twice eager's
    float32 result ``want`` is (ill-conditioned sums: bicubic sampling's grid gradient, long convolutions)."""
    if exact.shape != want.shape:
        return False
    eager_err = np.nanmax(np.abs(want - exact), initial=0.0)
    return bool(np.nanmax(np.abs(got - exact), initial=0.0) <= 2 * eager_err + 1e-6
                and np.array_equal(np.isnan(got), np.isnan(want)))


def _cotangent(rng, out) -> np.ndarray:
    """A random cotangent for ``out`` (complex parts both random), zeros for an integer or bool result."""
    dtype, shape = str(out.dtype).replace("torch.", ""), tuple(out.shape)
    if out.is_complex():
        return np.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape), dtype)  # 0-d: an array too
    return rng.standard_normal(shape).astype(dtype) if out.is_floating_point() else np.zeros(shape, dtype)


def _differentiable_in_eager(module, inputs, i: int, cts, float_out) -> bool:
    try:
        _autograd(module, inputs, [i], cts, float_out)
        return True
    except Exception:  # noqa: BLE001
        return False


def _autograd(module, inputs, wrt_in, cts, float_out):
    """Eager's vector-Jacobian product for the cotangents ``cts`` (None when no output depends on ``wrt_in``)."""
    import torch

    leaves = [t.clone().requires_grad_(i in wrt_in) for i, t in enumerate(inputs)]
    torch.manual_seed(0)
    eager = _outputs(module(*leaves))
    pairs = [(eager[k], torch.from_numpy(cts[k])) for k in float_out if eager[k].requires_grad]
    if not pairs:
        return None
    return torch.autograd.grad([p[0] for p in pairs], [leaves[i] for i in wrt_in], [p[1] for p in pairs],
                               allow_unused=True)


def _stack_test_fn():
    """``extract_test_fn`` of torch's test utilities without ``inspect.stack()``: the same frames searched
    for the same ``unittest.TestCase`` method, but no source lines read for each frame (``inspect.stack``
    took ~95 ms a call under pytest's deep stacks, twice per ``sample_inputs``: 40% of the sample runs)."""
    import unittest

    frame = sys._getframe(1)
    while frame is not None:
        self_val = frame.f_locals.get("self")
        if isinstance(self_val, unittest.TestCase):
            *_, cls_name, test_name = self_val.id().rsplit(".", 2)
            if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                return getattr(self_val, test_name).__func__
        frame = frame.f_back
    return None


@contextlib.contextmanager
def _quick_sampling():
    """Drawing samples without two costs of torch's test utilities, with the same samples.

    - ``torch.manual_seed`` seeds the CPU generator alone inside the block (the samples are drawn on the CPU).
      OpInfo's sample iterators reseed before every sample, and ``torch.manual_seed`` also queues a call per
      accelerator that is not initialised (cuda, xpu, mtia), each with a formatted stack: 85% of drawing the
      samples (0.7 ms each; max_pool2d has 700), and a list that only grows.
    - their search of the stack for the running test method (``extract_test_fn``) walks the frames without
      reading their source (``_stack_test_fn``)."""
    import torch
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    seed_all = torch.manual_seed
    patched = [(m, m.extract_test_fn) for m in (common_utils, core) if hasattr(m, "extract_test_fn")]
    torch.manual_seed = torch.default_generator.manual_seed
    for m, _ in patched:
        m.extract_test_fn = _stack_test_fn
    try:
        yield
    finally:
        torch.manual_seed = seed_all
        for m, fn in patched:
            m.extract_test_fn = fn


def samples(info, dtype: str, limit: Optional[int] = None) -> list:
    """``(index, sample)`` pairs of ``info`` for ``dtype``; with ``limit``, that many spread over the list
    (``limit=1``: the first sample, without drawing the others). The values are drawn after
    ``torch.manual_seed(0)``: the same in every process."""
    import torch

    tdtype = getattr(torch, dtype)
    if tdtype not in info.supported_dtypes("cpu"):
        return []
    torch.manual_seed(0)
    try:
        with _quick_sampling():
            drawn = info.sample_inputs("cpu", tdtype, requires_grad=False)
            all_ = list(itertools.islice(drawn, 1) if limit == 1 else drawn)
    except Exception:  # noqa: BLE001 - a sample generator that fails here has nothing to run
        return []
    idx = list(range(len(all_)))
    if limit is not None and len(idx) > limit:
        idx = sorted({round(k * (len(all_) - 1) / max(limit - 1, 1)) for k in range(limit)})
    return [(i, all_[i]) for i in idx]


def dtypes_for(info) -> tuple:
    """float32 and float64; integer and bool for operators defined on those only (bitwise ones)."""
    import torch

    supported = info.supported_dtypes("cpu")
    floats = tuple(d for d in DTYPES_CHECKED if getattr(torch, d) in supported)
    return floats or tuple(d for d in ("int64", "bool") if getattr(torch, d) in supported)


def run(infos: Sequence, dtypes: Optional[Sequence[str]] = None, limit: Optional[int] = None) -> list[SampleResult]:
    """Every (or ``limit`` per operator and dtype) sample of ``infos`` (dtypes: ``dtypes_for``)."""
    out = []
    for info in infos:
        for dtype in dtypes or dtypes_for(info):
            for i, s in samples(info, dtype, limit):
                out.append(run_sample(info, s, dtype, i))
    return out


# ------------------------------------------------------------------ every sample, in parallel


@dataclass(frozen=True)
class Unit:
    """Samples ``indices`` of one OpInfo and dtype, run by one worker within ``budget`` seconds (None: no limit)."""

    opinfo: str
    dtype: str
    indices: tuple
    budget: Optional[float] = None


def units(infos: Sequence, limit: Optional[int] = None, chunk: int = 96, budget: Optional[float] = None) -> list[Unit]:
    """The samples of ``infos`` cut into units of at most ``chunk`` samples, largest OpInfos first; ``budget``
    (seconds per OpInfo, all dtypes) is shared among its units in proportion to their samples."""
    per_op = []
    for info in infos:
        pairs = [(dtype, [i for i, _ in samples(info, dtype, limit)]) for dtype in dtypes_for(info)]
        per_op.append((sum(len(ix) for _, ix in pairs), full_name(info), pairs))
    out = []
    for total, name, pairs in sorted(per_op, key=lambda t: -t[0]):
        for dtype, ix in pairs:
            for k in range(0, len(ix), chunk):
                part = tuple(ix[k:k + chunk])
                out.append(Unit(name, dtype, part, None if budget is None else budget * len(part) / total))
    return out


_WORKER: dict = {}  # per process: OpInfos by name, the samples of the last (OpInfo, dtype)


def run_unit(unit: Unit) -> list[SampleResult]:
    """Run one unit (in a worker process); samples past the budget are ``unrun``, with the budget as reason."""
    import time

    if "infos" not in _WORKER:
        _WORKER["infos"] = {full_name(o): o for o in opinfos()}
    info = _WORKER["infos"][unit.opinfo]
    key = (unit.opinfo, unit.dtype)
    if _WORKER.get("key") != key:
        _WORKER["key"], _WORKER["samples"] = key, dict(samples(info, unit.dtype))
    start, out = time.perf_counter(), []
    for i in unit.indices:
        if unit.budget is not None and time.perf_counter() - start > unit.budget:
            out.append(SampleResult(unit.opinfo, unit.dtype, i, "unrun", "not run: the OpInfo's time budget ran out"))
            continue
        out.append(run_sample(info, _WORKER["samples"][i], unit.dtype, i))
    return out


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")


def run_parallel(infos: Sequence, jobs: int = 2, limit: Optional[int] = None, budget: Optional[float] = None,
                 on_done: Optional[Callable] = None) -> list[SampleResult]:
    """Every (or ``limit`` per operator and dtype) sample of ``infos`` on ``jobs`` worker processes;
    ``on_done(opinfo_name, results)`` is called as each OpInfo completes. Results come in ``infos`` order."""
    import concurrent.futures as cf
    import multiprocessing

    work = units(infos, limit, budget=budget)
    left = collections.Counter(u.opinfo for u in work)
    done: dict = collections.defaultdict(list)
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker) as pool:
        futures = {pool.submit(run_unit, u): u for u in work}
        for fut in cf.as_completed(futures):
            u = futures[fut]
            done[u.opinfo] += fut.result()
            left[u.opinfo] -= 1
            if not left[u.opinfo] and on_done is not None:
                on_done(u.opinfo, done[u.opinfo])
    order = {full_name(o): k for k, o in enumerate(infos)}
    dorder = {d: k for k, d in enumerate(DTYPES_CHECKED + ("int64", "bool"))}
    return sorted((r for rs in done.values() for r in rs), key=lambda r: (order[r.opinfo], dorder[r.dtype], r.index))


def summary(results: Sequence[SampleResult]) -> dict:
    """Counts: operators, samples, passed, skipped, failed, not run (time budget), gradient-checked, and skip
    reasons with counts."""
    c = collections.Counter(r.status for r in results)
    reasons = collections.Counter(r.reason for r in results if r.status == "skipped")
    return {"operators": len({r.opinfo for r in results}), "samples": len(results), "passed": c["passed"],
            "skipped": c["skipped"], "failed": c["failed"], "unrun": c["unrun"],
            "grad_checked": sum(r.grad_checked for r in results), "skip_reasons": reasons}


def report(results: Sequence[SampleResult], command: str, budget: Optional[float] = None) -> str:
    """The markdown page ``docs/opinfo.md`` (``budget``: the per-OpInfo time budget of the run, if any)."""
    s = summary(results)
    limited = f" with a time budget of {budget:g} s per OpInfo" if budget is not None else ""
    lines = [
        "# OpInfo results", "",
        f"<!-- generated by `{command}`: do not edit by hand -->", "",
        "Every sample input of PyTorch's OpInfo database (`op_db`) for the operators of the Core ATen table "
        "(float32 and float64) is exported with `torch.export`, imported by `pullback.frontend`, run on the numpy "
        "target and compared with eager PyTorch; where PyTorch has a gradient, `FirstOrderGradient` is compared "
        "with autograd on a random cotangent (complex results: a complex cotangent, PyTorch's conjugate convention). "
        "Tolerances per dtype; a float32 value or gradient outside them still passes when it is no further from "
        "eager's float64 result than twice eager's own float32 error (ill-conditioned sums, such as bicubic "
        "sampling's grid gradient). `make opinfo` regenerates this page; `make test` runs a few samples "
        "per operator (`tests/frontend/test_opinfo.py`).", "",
        f"This run{limited}: " + ("every sample" if "--limit" not in command else "the samples spread over each list")
        + " of each OpInfo, float32 and float64 (integer and bool for the bitwise operators).", "",
        "| operators | samples | passed | gradient checked | skipped | failed | not run (time budget) |",
        "|---|---|---|---|---|---|---|",
        f"| {s['operators']} | {s['samples']} | {s['passed']} | {s['grad_checked']} | {s['skipped']} | {s['failed']} "
        f"| {s['unrun']} |", "",
        "## Skip reasons", "", "| samples | reason |", "|---|---|",
    ]
    for reason, n in sorted(s["skip_reasons"].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {n} | {_cell(reason)} |")
    if not s["skip_reasons"]:
        lines.append("| 0 | (none) |")
    lines += ["", "## Per operator", "",
              "| OpInfo | samples | passed | gradient checked | skipped | failed | not run (time budget) |",
              "|---|---|---|---|---|---|---|"]
    per: dict = collections.defaultdict(list)
    for r in results:
        per[r.opinfo].append(r)
    for name in sorted(per):
        rs = per[name]
        c = collections.Counter(r.status for r in rs)
        lines.append(f"| `{name}` | {len(rs)} | {c['passed']} | {sum(r.grad_checked for r in rs)} | {c['skipped']} "
                     f"| {c['failed']} | {c['unrun']} |")
    failed = [r for r in results if r.status == "failed"]
    if failed:
        lines += ["", "## Failures", "", "| OpInfo | dtype | sample | reason |", "|---|---|---|---|"]
        lines += [f"| `{r.opinfo}` | {r.dtype} | {r.index} | {_cell(r.reason)} |" for r in failed]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


__all__ = ["ALIASES", "SampleResult", "Unit", "opinfos", "run", "run_parallel", "run_sample", "run_unit", "samples", "summary",
           "report", "units"]
