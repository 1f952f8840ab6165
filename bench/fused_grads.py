"""Forward + backward of single operators at the bench workloads' sizes, per target (issue 14).

Each row is one operator (float32) at a size one of ``bench/torch_train.py``'s workloads runs it at.
pullback rows time ``@main_grad`` of the vjp program of the op (``FirstOrderGradient(mode="vjp")`` +
``standard_cleanup``: the forward and the backward in one call) built for a target; ``eager`` times
PyTorch autograd (forward + ``backward``) of the same op. Times are the process's CPU time
(``time.process_time``) with one thread everywhere (torch, BLAS, XLA) and glibc malloc keeping freed memory
(``runtime.tuning.keep_freed_memory``, as ``bench/torch_train.py`` does), the median of ``--reps`` calls
per round and the median over ``--rounds`` interleaved rounds: one worker process per (source tree,
target) stays alive, and each round asks every worker in turn, so a slow spell of the shared machine
hits all columns alike.

``--compare SRC`` adds the same columns for another checkout's ``src`` (e.g. the code before a change:
``git archive <commit> src | tar -x -C /tmp/before``) and prints the ratio after / before.

    PYTHONPATH=src .venv/bin/python bench/fused_grads.py [--targets numpy,torch,jax] [--rounds 5]
        [--reps 10] [--only softmax,layer_norm] [--compare /tmp/before/src] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
TARGETS = ("numpy", "torch", "jax")

# name -> (workload, input shapes (the first is the data), op builder args, small shapes)
CASES = {
    "softmax": ("transformer/bert attention", [(32, 128, 128)], [(2, 8, 8)]),
    "log_softmax": ("gpt2 LM head", [(1024, 1024)], [(4, 16)]),
    "layer_norm": ("transformer/bert/gpt2", [(1024, 256), (256,), (256,)], [(8, 16), (16,), (16,)]),
    "gelu": ("transformer/bert feed-forward", [(1024, 1024)], [(8, 16)]),
    "gelu_tanh": ("gpt2 feed-forward", [(1024, 1024)], [(8, 16)]),
    "relu": ("cnn block 1", [(32, 16, 32, 32)], [(2, 4, 8, 8)]),
    "batch_norm": ("cnn block 1 (training)", [(32, 16, 32, 32), (16,), (16,), (16,), (16,)],
                   [(2, 4, 8, 8), (4,), (4,), (4,), (4,)]),
    "batch_norm_resnet": ("resnet layer1 (training)", [(16, 64, 8, 8), (64,), (64,), (64,), (64,)],
                          [(2, 8, 4, 4), (8,), (8,), (8,), (8,)]),
    "max_pool2d": ("cnn 2x2/2", [(32, 16, 32, 32)], [(2, 4, 8, 8)]),
    "max_pool2d_stem": ("resnet stem 3x3/2 pad 1", [(16, 64, 16, 16)], [(2, 8, 8, 8)]),
}


def _pullback_body(name: str, op, xs):
    nn = op.nn
    if name in ("softmax", "log_softmax"):
        return getattr(nn, name)(xs[0], axis=-1)
    if name == "layer_norm":
        return nn.layer_norm(*xs)
    if name in ("gelu", "gelu_tanh"):
        return nn.gelu(xs[0], approximate="tanh" if name == "gelu_tanh" else "none")
    if name == "relu":
        return nn.relu(xs[0])
    if name.startswith("batch_norm"):
        return nn.batch_norm(*xs, training=True)[0]
    if name == "max_pool2d":
        return nn.max_pool2d(xs[0], (2, 2), (2, 2))
    if name == "max_pool2d_stem":
        return nn.max_pool2d(xs[0], (3, 3), (2, 2), padding=(1, 1))
    raise KeyError(name)


def _eager(name: str, ts):
    import torch
    import torch.nn.functional as F

    if name in ("softmax", "log_softmax"):
        return getattr(torch, name)(ts[0], -1)
    if name == "layer_norm":
        return F.layer_norm(ts[0], (ts[0].shape[-1],), ts[1], ts[2])
    if name in ("gelu", "gelu_tanh"):
        return F.gelu(ts[0], approximate="tanh" if name == "gelu_tanh" else "none")
    if name == "relu":
        return torch.relu(ts[0])
    if name.startswith("batch_norm"):
        return F.batch_norm(ts[0], ts[3].clone(), ts[4].clone(), ts[1], ts[2], True)
    if name == "max_pool2d":
        return F.max_pool2d(ts[0], 2, 2)
    if name == "max_pool2d_stem":
        return F.max_pool2d(ts[0], 3, 2, 1)
    raise KeyError(name)


def _inputs(name: str, small: bool):
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = CASES[name][2] if small else CASES[name][1]
    out = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if name.startswith("batch_norm"):
        out[4] = np.abs(out[4]) + 0.5  # moving variance
    return out


# ------------------------------------------------------------------ worker: one source tree, one target


def _single_thread() -> None:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                               "intra_op_parallelism_threads=1").strip()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = "1"


def _samples(fn, reps: int) -> list:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        out.append((time.process_time() - t0) * 1e3)
    return out


def _prepare(target: str, names: list, small: bool) -> dict:
    """name -> a zero-argument callable running fwd + bwd once on ``target`` (``eager``: PyTorch)."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    try:  # as bench/torch_train.py: freed blocks stay in the process (PyTorch's caching allocator does the same)
        from pullback.runtime.tuning import keep_freed_memory

        keep_freed_memory()
    except ImportError:
        pass
    runs = {}
    for name in names:
        arrays = _inputs(name, small)
        if target == "eager":
            ts = [torch.from_numpy(a).requires_grad_(i < 3)
                  for i, a in enumerate(arrays)]
            ct = torch.from_numpy(np.ones(_eager(name, ts).shape, np.float32))

            def run(ts=ts, ct=ct, name=name):
                torch.autograd.grad(_eager(name, ts), [t for t in ts if t.requires_grad], ct)
        else:
            import pullback as pb
            from pullback import op
            from pullback.transform import FirstOrderGradient, standard_cleanup

            xs = [pb.var(f"x{i}", shape=a.shape, dtype="float32") for i, a in enumerate(arrays)]
            wrt = [x.name_hint for x in xs[:3]] if name.startswith(("batch_norm", "layer_norm")) else None
            mod = pb.IRModule.from_expr(pb.Function(xs, _pullback_body(name, op, xs)))
            mod = standard_cleanup()(FirstOrderGradient("main", wrt=wrt, mode="vjp")(mod))
            fn = pb.build(mod, target=target)["main_grad"]
            ct = np.ones([int(d) for d in mod["main"].body.checked_type.shape], np.float32)
            args = arrays + [ct]
            if target == "torch":
                args = [torch.from_numpy(a) for a in args]
            elif target == "jax":
                import jax.numpy as jnp

                args = [jnp.asarray(a) for a in args]

            def run(fn=fn, args=args):
                fn(*args)
        runs[name] = run
    return runs


def worker(target: str, names: list, reps: int, small: bool) -> None:
    """Answer each line ``run`` on stdin with one JSON line ``{name: [ms per call]}`` on stdout."""
    runs = _prepare(target, names, small)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        out = {}
        for name, run in runs.items():
            try:
                out[name] = _samples(run, reps)
            except Exception as e:  # noqa: BLE001 - reported in the table
                out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"
        print(json.dumps(out), flush=True)


# ------------------------------------------------------------------ parent: interleaved rounds, the table


def _spawn(src: str, target: str, args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [sys.executable, __file__, "--worker", target, "--only", ",".join(args.only), "--reps", str(args.reps)]
    if args.small:
        cmd.append("--small")
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _read(p: subprocess.Popen) -> dict:
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"worker {p.args} died")
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--compare", default=None, help="another checkout's src directory (the 'before' columns)")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a smoke test of the script)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.only = [n for n in args.only.split(",") if n]
    unknown = [n for n in args.only if n not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown} (cases: {', '.join(CASES)})")
    if args.worker:
        _single_thread()
        worker(args.worker, args.only, args.reps, args.small)
        return
    targets = [t for t in args.targets.split(",") if t]
    trees = [("after", str(SRC))] + ([("before", args.compare)] if args.compare else [])
    cols = [("eager", "eager", str(SRC))] + [(f"{t} {tree}" if args.compare else t, t, src)
                                              for t in targets for tree, src in trees]
    procs = {c[0]: _spawn(c[2], c[1], args) for c in cols}
    for p in procs.values():
        _read(p)
    rounds: dict = {c[0]: {n: [] for n in args.only} for c in cols}
    for r in range(args.rounds):
        for label, p in procs.items():
            p.stdin.write("run\n")
            p.stdin.flush()
            for name, v in _read(p).items():
                rounds[label][name].append(statistics.median(v) if isinstance(v, list) else v)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for p in procs.values():
        p.stdin.close()
        p.wait()
    _print_table(args, cols, rounds, targets)


def _cell(v: list) -> str:
    nums = [x for x in v if isinstance(x, float)]
    return f"{statistics.median(nums):.2f}" if nums else (v[0] if v else "-")


def _print_table(args, cols, rounds, targets) -> None:
    med = {c[0]: {n: (statistics.median([x for x in v if isinstance(x, float)]) if any(isinstance(x, float) for x in v)
                      else None) for n, v in rounds[c[0]].items()} for c in cols}
    head = ["op", "shape", "workload"] + [c[0] for c in cols]
    if args.compare:
        head += [f"{t} after/before" for t in targets]
    print("\nfwd+bwd, CPU ms per call, 1 thread (median of %d rounds x %d calls)\n" % (args.rounds, args.reps))
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in args.only:
        shape = "x".join(map(str, (CASES[name][2] if args.small else CASES[name][1])[0]))
        row = [name, shape, CASES[name][0]] + [_cell(rounds[c[0]][name]) for c in cols]
        if args.compare:
            for t in targets:
                a, b = med[f"{t} after"][name], med[f"{t} before"][name]
                row.append(f"{a / b:.2f}x" if a is not None and b else "-")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
