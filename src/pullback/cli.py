"""The ``pullback`` command. Bad input exits non-zero with one readable line."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .ir.errors import PullbackError


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(torch=args.torch, steps=args.steps)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pullback", description="pullback: differentiate, optimise and run tensor programs.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="the main job: differentiate, optimise and run a real model")
    d.add_argument("--torch", action="store_true", help="also start from torch.nn models and check against PyTorch autograd")
    d.add_argument("--steps", type=int, default=3, help="training steps to time")
    d.set_defaults(func=_cmd_demo)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PullbackError as e:
        if args.debug:
            raise
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"pullback: error: {type(e).__name__}: {first}", file=sys.stderr)
        return 1
