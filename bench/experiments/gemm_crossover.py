# ruff: noqa: B023  (closures are timed inside the loop iteration that defines them)
"""Where oneDNN's float32 inner product beats MKL's sgemm (``ops.onednn.MIN_MACS``), cold and warm.

A training step meets each GEMM with its weight, and often its rows, cold in the caches: each is touched once a
forward or backward, and the kernels between evict it. A warm loop (the same operands again and again) shows
oneDNN's fixed cost (a primitive per call, the weight's reorder) paid from the caches and misplaces the crossover:
on a 2-core AMD EPYC it put it at 2^21 multiply-adds, where the steps of a ConvNeXt (GEMMs of 2^23) took 5.4 ms of
GEMMs through oneDNN against 4.7-4.9 through MKL. ``cold`` rows write ``--flush-mb`` megabytes between calls.

Per shape (rows M, inner K, outputs N, with a bias): the median time of ``mkldnn._linear_pointwise`` (what the
torch target calls) and of ``torch.addmm`` (eager's ``F.linear``), and their ratio; below, the smallest size from
which oneDNN is faster cold in every row at or above it (the threshold this machine suggests).

    PYTHONPATH=src .venv/bin/python bench/experiments/gemm_crossover.py [--threads 2] [--reps 60] [--flush-mb 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import add_common_args, setup

SHAPES = [(16, 512, 512), (128, 128, 512), (128, 512, 128), (32, 256, 1024), (2048, 32, 128), (2048, 128, 32),
          (512, 256, 64), (8192, 32, 128), (256, 256, 256), (1024, 128, 512), (4096, 64, 256), (1024, 256, 256),
          (2048, 256, 256), (1024, 256, 1024), (1024, 1024, 1024)]


def median_us(fn, reps: int, flush=None) -> float:
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        if flush is not None:
            flush()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--flush-mb", type=int, default=64, help="megabytes written between the calls of a cold row")
    args = ap.parse_args()
    setup(args)
    import torch

    linear = torch.ops.mkldnn._linear_pointwise
    junk = torch.empty(args.flush_mb * 2**20 // 4)
    flush = lambda: junk.fill_(1.0)  # noqa: E731
    print(f"{'M':>6s} {'K':>5s} {'N':>5s} {'MACs':>8s} | {'cold oneDNN':>11s} {'MKL':>7s} {'ratio':>6s} | "
          f"{'warm oneDNN':>11s} {'MKL':>7s} {'ratio':>6s}   (us, median of {args.reps})")
    cold = []
    for m, k, n in sorted(SHAPES, key=lambda s: s[0] * s[1] * s[2]):
        x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
        one = lambda: linear(x, w, b, "none", [], "")
        mkl = lambda: torch.addmm(b, x, w.t())
        r = [median_us(one, args.reps, flush), median_us(mkl, args.reps, flush), median_us(one, args.reps),
             median_us(mkl, args.reps)]
        macs = m * k * n
        cold.append((macs, r[0] / r[1]))
        print(f"{m:6d} {k:5d} {n:5d} {macs / 2**20:7.1f}M | {r[0]:11.0f} {r[1]:7.0f} {r[0] / r[1]:6.2f} | "
              f"{r[2]:11.0f} {r[3]:7.0f} {r[2] / r[3]:6.2f}")
    faster_above = [macs for i, (macs, _) in enumerate(cold) if all(ratio < 1.0 for _, ratio in cold[i:])]
    from pullback.ops import onednn

    print(f"oneDNN faster cold from {faster_above[0] / 2**20:.1f}M multiply-adds up" if faster_above else
          "oneDNN not faster cold at the largest size", f"(ops.onednn.MIN_MACS: {onednn.MIN_MACS / 2**20:.0f}M)")


if __name__ == "__main__":
    main()
