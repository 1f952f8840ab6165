"""The main job (``make demo``): differentiate, optimise and run real models.

For a transformer encoder layer and a small CNN written with pullback ops:
FirstOrderGradient, then ``standard_cleanup`` and ``FuseOps``; a before/after
table; a finite-difference check of the gradient; a few SGD training steps
timed on the NumPy executor. Needs NumPy only.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import numpy as np

from .analysis import program_stats
from .analysis.fusion import fusion_report
from .ir.module import IRModule
from .runtime import build
from .testing import check_grad
from .testing.models import cnn, transformer_layer
from .transform import FirstOrderGradient, standard_cleanup
from .transform.fuse_ops import FuseOps

DATA_PARAMS = ("x", "y")  # model inputs that are data, not trained parameters


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 74 - len(title)))


def _row(label: str, mod: IRModule, func: str, groups) -> list:
    s = program_stats(mod, func)
    return [label, s["calls"], s["like_ops"], s["identity_arith"], groups, f"{s['flops'] / 1e6:.2f}", f"{s['peak_bytes'] / 1024:.0f}"]


def _print_table(rows: list) -> None:
    header = ["program", "ops", "like-ops", "identity", "groups", "MFLOP", "peak KiB"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % widths[0:1][0] if i == 0 else "{:>%d}" % w for i, w in enumerate(widths))
    print(fmt.format(*header))
    for r in rows:
        print(fmt.format(*[str(c) for c in r]))


def _timed(f: Callable, *args) -> tuple:
    """``(f(*args), seconds it took)``."""
    t0 = time.perf_counter()
    return f(*args), time.perf_counter() - t0


def _pipeline(title: str, mod: IRModule, inputs: list, trained: list, steps: int, lr: float,
              wrt=None, reference: Optional[Callable] = None) -> bool:
    """AD, clean-up and fusion of ``@main``, the before/after table, gradient checks, SGD steps.

    ``trained`` are the indices of the inputs SGD updates, ``wrt`` the same parameters (the gradient
    tuple follows their order); ``reference(inputs) -> (loss, grads)``
    (optional) gives an independent gradient to compare with, e.g. PyTorch autograd.
    """
    fwd_ops = program_stats(mod, "main")["calls"]
    _section(f"{title}: {fwd_ops} forward ops")
    grad_mod, t_ad = _timed(FirstOrderGradient("main", wrt=wrt, mode="grad"), mod)
    clean, t_clean = _timed(standard_cleanup(), grad_mod)
    fused, t_fuse = _timed(FuseOps(), clean)
    print(f"FirstOrderGradient {t_ad * 1e3:.0f} ms, standard_cleanup {t_clean * 1e3:.0f} ms, FuseOps {t_fuse * 1e3:.0f} ms")
    _print_table([
        _row("forward @main", mod, "main", "-"),
        _row("gradient, as AD wrote it", grad_mod, "main_grad", "-"),
        _row("after standard_cleanup", clean, "main_grad", "-"),
        _row("after FuseOps", fused, "main_grad", fusion_report(fused, "main_grad").num_groups),
    ])

    worst = check_grad(mod, inputs, wrt=wrt, max_coords=3, rtol=1e-5, atol=1e-6)
    print(f"gradient vs central finite differences (float64, 3 coordinates per parameter): max abs error {worst:.2e}")
    exe_raw = build(grad_mod)
    exe = build(fused)
    _, grads_raw = exe_raw["main_grad"](*inputs)
    loss, grads = exe["main_grad"](*inputs)
    ok = all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(grads, grads_raw))
    print(f"cleaned+fused gradient equals the raw AD gradient: {ok}")
    if reference is not None:
        ref_loss, ref_grads = reference(inputs)
        err = max(float(np.max(np.abs(a - b)) / (1e-6 + float(np.max(np.abs(b))))) for a, b in zip(grads, ref_grads))
        same = err < 1e-4 and abs(float(loss) - ref_loss) <= 1e-5 * max(1.0, abs(ref_loss))
        print(f"loss {float(loss):.6f} vs PyTorch {ref_loss:.6f}; gradients vs PyTorch autograd: max relative error {err:.1e}")
        ok &= same

    slot = {i: k for k, i in enumerate(trained)}
    times, losses = [], []
    params = list(inputs)
    for _ in range(steps):
        t0 = time.perf_counter()
        loss, grads = exe["main_grad"](*params)
        for i, k in slot.items():
            params[i] = (params[i] - lr * grads[k]).astype(params[i].dtype)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    loss_after = float(exe["main"](*params))
    print(f"SGD training: loss {losses[0]:.5f} -> {loss_after:.5f} after {steps} steps; "
          f"median {statistics.median(times) * 1e3:.1f} ms per step (forward + backward + update)")
    return ok and loss_after < losses[0]


def _demo_model(name: str, builder: Callable, steps: int, lr: float) -> bool:
    mod, make_inputs = builder()
    names = [p.name_hint for p in mod["main"].params]
    trained = [i for i, n in enumerate(names) if n not in DATA_PARAMS]
    wrt = [mod["main"].params[i] for i in trained]
    return _pipeline(name, mod, make_inputs(0), trained, steps, lr, wrt=wrt)


def run_torch_demo(steps: int = 3) -> bool:
    """The same pipeline starting from ``torch.nn.TransformerEncoderLayer``, checked against PyTorch autograd."""
    import torch

    from .frontend.torch_importer import import_torch, main_inputs

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                             activation="gelu", batch_first=True).eval()

    class MSE(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, y):
            return (self.inner(x) - y).pow(2).mean()

    model = MSE(layer)
    x, y = torch.randn(4, 32, 64), torch.randn(4, 32, 64)
    prog = import_torch(model, (x, y))
    inputs = main_inputs(prog, [x.numpy(), y.numpy()])
    names = [p.name_hint for p in prog.main.params]
    trained = [names.index(n) for n in prog.trainable]
    state = dict(model.named_parameters())

    def reference(arrays):
        model.zero_grad()
        with torch.no_grad():
            for n, k in zip(names, arrays):
                if n in prog.state_names:
                    state[prog.state_key(n)].copy_(torch.from_numpy(np.asarray(k)))
        out = model(torch.from_numpy(np.asarray(arrays[0])), torch.from_numpy(np.asarray(arrays[1])))
        out.backward()
        return float(out.detach()), [state[prog.state_key(names[i])].grad.numpy() for i in trained]

    return _pipeline("torch.nn.TransformerEncoderLayer imported with torch.export", prog.mod, inputs, trained,
                     steps, lr=0.05, wrt=[prog.main.params[i] for i in trained], reference=reference)


def run_demo(torch: bool = False, steps: int = 3) -> int:
    """Run the demo; returns a process exit code."""
    ok = True
    ok &= _demo_model("transformer encoder layer (batch 4, seq 32, d_model 64, 4 heads, ff 128)",
                      lambda: transformer_layer(batch=4, seq=32, d_model=64, heads=4, d_ff=128, loss="mse"), steps, lr=0.05)
    ok &= _demo_model("CNN (batch 8, 3x16x16 images, conv 3->8->16, 10 classes)",
                      lambda: cnn(batch=8, image=16, channels=(3, 8, 16), classes=10), steps, lr=0.1)
    if torch:
        ok &= run_torch_demo(steps)
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1
