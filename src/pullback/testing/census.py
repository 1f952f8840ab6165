"""The driver shared by the census scripts (``scripts/torch_function_census.py``, ``torch_module_census.py``):
cases compiled through ``pullback.integrations.torch.compile`` one at a time and compared with eager PyTorch,
each reported ``OK``, ``DIFF: ...``, ``ERROR: ...`` or ``EXPECTED (reason)``."""

from __future__ import annotations

import argparse
import warnings
from typing import Callable, Optional, Sequence


def brief(e: BaseException) -> str:
    """An exception's message on one line, at most 200 characters."""
    return " ".join(str(e).split())[:200]


def assert_same_gradients(got: Sequence, want: Sequence, rtol: float, atol: float) -> None:
    """Pairs of gradients are equal; a gradient one side leaves None counts as zeros."""
    import torch

    for g, w in zip(got, want):
        if g is not None or w is not None:
            torch.testing.assert_close(torch.zeros_like(w) if g is None else g, torch.zeros_like(g) if w is None else w,
                                       rtol=rtol, atol=atol)


def side_by_side(build: Callable, eager: Callable, args: Sequence, compare: Callable) -> str:
    """``OK``, ``DIFF: ...`` or ``ERROR: ...``: ``build()`` (the compiled callable) and ``eager`` run on copies of
    ``args`` (float ones requiring gradients) after the same ``torch.manual_seed`` (random draws alike); their
    outputs must be equal, then ``compare(out, ref, xs, ys)`` checks the rest (gradients, buffers)."""
    import torch

    xs = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    ys = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    try:
        compiled = build()
        torch.manual_seed(1)
        out = compiled(*xs)
        torch.manual_seed(1)
        ref = eager(*ys)
    except Exception as e:  # noqa: BLE001 - reported
        return f"ERROR: {type(e).__name__}: {brief(e)}"
    try:
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
        compare(out, ref, xs, ys)
    except Exception as e:  # noqa: BLE001 - reported
        return f"DIFF: {brief(e)}"
    return "OK"


def main(doc: str, cases: dict, expected: dict, check: Callable[[str, str], str], noun: str, width: int = 22,
         expected_on: Optional[dict] = None) -> int:
    """The command line of a census script: ``[names ...] [--target T]``; prints a status per case and a total,
    returns 1 when a case gives a ``DIFF`` or an error it is not expected to give (``expected``, and
    ``expected_on[target]`` for one target only)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("names", nargs="*", help="cases to run (default: all)")
    ap.add_argument("--target", default="numpy")
    args = ap.parse_args()
    expected = {**expected, **(expected_on or {}).get(args.target, {})}
    warnings.simplefilter("ignore")
    bad = 0
    names = args.names or list(cases)
    for name in names:
        status = check(name, args.target)
        if status != "OK" and name in expected and status.startswith("ERROR"):
            status = f"EXPECTED ({expected[name]})"
        elif status == "OK" and name in expected:
            status = "OK (listed as expected to fail: update EXPECTED)"
        bad += status.startswith(("DIFF", "ERROR"))
        print(f"{name:<{width}s} {status}", flush=True)
    print(f"{len(names)} {noun}, {bad} unexpected")
    return 1 if bad else 0


__all__ = ["assert_same_gradients", "brief", "main", "side_by_side"]
