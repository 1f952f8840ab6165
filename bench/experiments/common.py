"""What the experiment scripts share: the clock, timing helpers and the thread set-up."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # this checkout's pullback

CLOCK = [time.perf_counter]  # --cpu-clock: time.process_time (meaningful with --threads 1)


def samples(fn, reps: int, warmup: int = 3) -> list:
    """Seconds of ``reps`` calls of ``fn`` on ``CLOCK`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = CLOCK[0]()
        fn()
        ts.append(CLOCK[0]() - t0)
    return ts


def median_ms(fn, reps: int, warmup: int = 3) -> float:
    return statistics.median(samples(fn, reps, warmup)) * 1e3


def add_common_args(ap) -> None:
    ap.add_argument("--cpu-clock", action="store_true",
                    help="time with the process's CPU time (with --threads 1: robust to other processes on the machine)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads = BLAS threads (= XLA threads when 1)")


def setup(args, tune_malloc: bool = True) -> None:
    """Apply --cpu-clock and --threads (torch, BLAS, XLA when 1) before jax is imported; tune malloc."""
    if args.cpu_clock:
        CLOCK[0] = time.process_time
    if args.threads == 1:  # XLA's own CPU thread pool too (jax is imported later)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads, user_api="blas")
    if tune_malloc:
        from pullback.runtime.tuning import keep_freed_memory

        keep_freed_memory()
