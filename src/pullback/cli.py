"""The ``pullback`` command. Bad input exits non-zero with one readable line.

Subcommands: ``grad``, ``opt``, ``run``, ``stats``, ``viz``, ``import-torch``
and ``demo``; each is one small function
``_cmd_NAME(args) -> exit code``, registered in ``build_parser``. Modules are
read and written in the text format (``.pb``); ``-o`` omitted writes to stdout.

Every failure is one line on stderr and a non-zero exit: bad arguments (exit 2),
pullback errors, a backend running out of memory (exit 1), and, as a last resort,
an unexpected exception ("internal error", exit 1; ``--debug`` shows tracebacks).
Output paths are checked before any work and files are written whole (a
temporary file renamed into place), so nothing is written when a command fails.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

from .ir.errors import DiagnosticError, PullbackError


class CLIError(PullbackError):
    """A command-line usage problem (file missing, input names, options)."""


# ---------------------------------------------------------------- helpers


@contextmanager
def _progress(what: str) -> Iterator[None]:
    """A ``\\r`` status line on stderr while a long step runs (only when stderr is a terminal)."""
    tty = sys.stderr.isatty()
    if tty:
        sys.stderr.write(f"\rpullback: {what}...")
        sys.stderr.flush()
    try:
        yield
    finally:
        if tty:  # erase the status line
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _read_module(path: str):
    from .text import parse

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CLIError(f"{path} is not a text file (expected a module in the pullback text format)") from None
    with _progress(f"parsing {path}"):
        return parse(text, source_name=path)


def _check_output(path: Optional[str], suffix: Optional[str] = None, option: str = "-o") -> None:
    """Fail before any work if ``path`` cannot be an output file (a directory, a missing folder, a wrong
    suffix); ``-`` (stdout) is fine for text outputs only (``suffix`` None)."""
    if path is None or (path == "-" and suffix is None):
        return
    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{option} {path} is a directory; give a file name")
    if suffix is not None and p.suffix != suffix:
        raise CLIError(f"{option} {path}: expected a {suffix} file name (e.g. {p.with_suffix(suffix).name})")
    if not p.parent.is_dir():
        raise CLIError(f"{option} {path}: the folder {p.parent} does not exist")


def _write_file(path: str, write) -> None:
    """``write(binary_file)`` to ``path`` whole: into a temporary file beside it, then renamed."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, p)
    except OSError as e:
        raise CLIError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_text(text: str, path: Optional[str]) -> None:
    text = text if text.endswith("\n") else text + "\n"
    if path is None or path == "-":
        sys.stdout.write(text)
        return
    _write_file(path, lambda f: f.write(text.encode()))


def _check_room(path: str, nbytes: int) -> None:
    """A CLIError, before anything is written, when ``nbytes`` do not fit on the disk of ``path``
    (a broadcast result can be a tiny view of a huge array)."""
    import shutil

    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if nbytes > free:
        raise CLIError(f"-o {path}: the result is {nbytes:,} bytes, more than the {free:,} bytes free there")


def _write_npz(arrays: dict, path: str) -> None:
    import numpy as np

    _write_file(path, lambda f: np.savez(f, **arrays))  # a file object: numpy adds no suffix


def _write_module(mod, path: Optional[str]) -> None:
    from .text import astext

    _write_text(astext(mod), path)


def _function(mod, name: str):
    if name not in mod:
        raise CLIError(f"the module has no function @{name} (functions: {', '.join('@' + k for k in mod)})")
    return mod[name]


def _split(value: Optional[str]) -> Optional[list[str]]:
    if value is None:
        return None
    items = [s.strip() for s in value.split(",") if s.strip()]
    if not items:
        raise CLIError(f"expected a comma-separated list of names, got {value!r}")
    return items


# ---------------------------------------------------------------- grad / opt


def _cmd_grad(args: argparse.Namespace) -> int:
    from .transform import FirstOrderGradient

    _check_output(args.output)
    mod = _read_module(args.input)
    _function(mod, args.func)
    with _progress(f"differentiating @{args.func}"):
        out = FirstOrderGradient(args.func, wrt=_split(args.wrt), mode=args.mode)(mod)
    _write_module(out, args.output)
    return 0


PIPELINES = {  # --pipeline NAME -> registered pass names
    "standard": ["standard_cleanup"],
    "fuse": ["standard_cleanup", "FuseOps"],
}


def _cmd_opt(args: argparse.Namespace) -> int:
    from .transform import PassContext, PassTiming, PrintIR, Sequential, get_pass

    _check_output(args.output)
    names = PIPELINES[args.pipeline] if args.pipeline else _split(args.passes)
    passes = [get_pass(n) for n in names]  # unknown name: PassError listing the registered passes
    instruments = []
    timing = PassTiming() if args.time_passes else None
    if timing is not None:
        instruments.append(timing)
    if args.print_after_all:
        instruments.append(PrintIR(after=True, stream=sys.stderr))
    mod = _read_module(args.input)
    with PassContext(opt_level=args.opt_level, instruments=instruments), _progress(f"running {', '.join(names)}"):
        out = Sequential(passes, name="pullback opt")(mod)
    _write_module(out, args.output)
    if timing is not None:
        print(timing.render(), file=sys.stderr)
    return 0


# ---------------------------------------------------------------- run


def _load_npz(path: str) -> dict:
    import numpy as np

    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a .npy file: one array, no names
            raise CLIError(f"{path} holds one array (.npy); --inputs takes an .npz of arrays named like the "
                           f"parameters (numpy.savez({Path(path).with_suffix('.npz').name!r}, x=...))")
        with loaded as data:
            return {k: data[k] for k in data.files}
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CLIError(f"{path} is not an .npz file of arrays ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _param_leaves(name: str, ty) -> list[tuple[str, object]]:
    """``(npz key, TensorType)`` of every tensor leaf of a parameter: ``x``, or ``x.0``, ``x.1.0``."""
    from .ir.types import TupleType

    out, stack = [], [(name, ty)]
    while stack:
        key, t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend((f"{key}.{i}", f) for i, f in reversed(list(enumerate(t.fields))))
        else:
            out.append((key, t))
    return out


def _pack(ty, leaves: Iterator):
    """Nested tuples shaped like ``ty`` with the next values of ``leaves`` (iterative)."""
    from .ir.types import TupleType

    if not isinstance(ty, TupleType):
        return next(leaves)
    out: list = []
    stack: list = [("visit", ty)]
    while stack:
        kind, t = stack.pop()
        if kind == "pack":
            fields = tuple(out[len(out) - t:])
            del out[len(out) - t:]
            out.append(fields)
        elif isinstance(t, TupleType):
            stack.append(("pack", len(t.fields)))
            stack.extend(("visit", f) for f in reversed(t.fields))
        else:
            out.append(next(leaves))
    return out[0]


def _inputs_for(fn, fn_name: str, data: dict, path: str) -> list:
    """The arguments of ``fn`` from the npz ``data`` by parameter name; missing/extra names are errors."""
    wanted = [(p, _param_leaves(p.name_hint, p.type_annotation)) for p in fn.params]
    keys = [k for _, leaves in wanted for k, _ in leaves]
    missing = [k for k in keys if k not in data]
    extra = sorted(set(data) - set(keys))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected {', '.join(extra)}")
        raise CLIError(f"{path} does not match the parameters of @{fn_name} ({', '.join(keys) or 'none'}): "
                       + "; ".join(parts))
    return [_pack(p.type_annotation, iter([data[k] for k, _ in leaves])) for p, leaves in wanted]


@contextmanager
def _backend_errors(doing: str) -> Iterator[None]:
    """Out-of-memory and backend (JAX/XLA, torch) failures while ``doing`` as one-line CLIErrors."""
    try:
        yield
    except MemoryError as e:
        raise CLIError(f"out of memory {doing}" + (f": {e}" if str(e) else "")) from None
    except PullbackError:
        raise
    except Exception as e:
        if not type(e).__module__.startswith(("jax", "jaxlib", "torch")):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        oom = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "can't allocate memory")
        what = "out of memory" if any(w in first for w in oom) else "the backend failed"
        raise CLIError(f"{what} {doing}: {first}") from None


def _output_leaves(value) -> list[tuple[str, object]]:
    """``(name, array)`` for every leaf of a (nested tuple) result: ``out``, ``out.0``, ``out.1.0``."""
    out, stack = [], [("out", value)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, tuple):
            stack.extend((f"{key}.{i}", f) for i, f in reversed(list(enumerate(v))))
        else:
            out.append((key, v))
    return out


def _cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from .analysis.type_infer import infer_module
    from .runtime import build

    _check_output(args.output, ".npz")
    mod = _read_module(args.input)
    fn = _function(mod, args.func)
    infer_module(mod)
    data: dict = {}
    for path in args.inputs:
        arrays = _load_npz(path)
        twice = sorted(set(arrays) & set(data))
        if twice:
            raise CLIError(f"{path}: {', '.join(twice)} also given by an earlier --inputs file")
        data.update(arrays)
    inputs = _inputs_for(fn, args.func, data, " + ".join(args.inputs))
    with _backend_errors(f"running @{args.func} on the {args.target} target"):
        with _progress(f"building for {args.target}"):
            exe = build(mod, target=args.target)
        if args.profile:
            if not hasattr(exe, "profile"):
                raise CLIError(f"--profile is not supported by the {args.target} target (use --target numpy)")
            prof = exe.profile(*inputs, func=args.func)
            result = prof.outputs
        else:
            result = exe[args.func](*inputs)
        leaves = [(k, np.asarray(v)) for k, v in _output_leaves(result)]
    if args.output:
        _check_room(args.output, sum(v.nbytes for _, v in leaves))
        _write_npz(dict(leaves), args.output)
    else:
        with np.printoptions(precision=6, suppress=True, threshold=200):
            for k, v in leaves:
                print(f"{k}: {v.dtype}{list(v.shape)}\n{v}")
    if args.profile:
        print(prof.render())
    return 0


# ---------------------------------------------------------------- stats / viz


def _cmd_stats(args: argparse.Namespace) -> int:
    from .analysis import program_stats
    from .analysis.fusion import fusion_report

    mod = _read_module(args.input)
    _function(mod, args.func)
    s = program_stats(mod, args.func)
    with _progress("fusion analysis"):
        rep = fusion_report(mod, args.func)
    width = max([len(k) for k in s["ops"]] + [8])
    lines = [f"@{args.func}: {s['calls']} operator calls", "op histogram:"]
    lines += [f"  {name:<{width}}  {count:>6}" for name, count in sorted(s["ops"].items(), key=lambda kv: (-kv[1], kv[0]))]
    lines += [
        f"like-operators:          {s['like_ops']}",
        f"identity arithmetic:     {s['identity_arith']}",
        f"FLOPs:                   {s['flops']:,}",
        f"static peak memory:      {s['peak_bytes']:,} bytes ({s['peak_bytes_no_reuse']:,} without reuse)",
        f"fusion groups (FuseOps): {rep.num_groups} ({rep.num_fused} fused, {rep.num_groups - rep.num_fused} single"
        + (f", {rep.existing_primitives} already primitive" if rep.existing_primitives else "") + ")",
    ]
    print("\n".join(lines))
    return 0


def _cmd_viz(args: argparse.Namespace) -> int:
    from .viz import write_graph

    _check_output(args.output)
    mod = _read_module(args.input)
    _function(mod, args.func)
    with _progress(f"drawing {args.output}"):
        write_graph(mod, args.output, args.func)
    return 0


# ---------------------------------------------------------------- import-torch / demo


def _torch_frontend():
    """``pullback.frontend.from_torch`` if the PyTorch frontend is there, else None."""
    try:
        from .frontend import from_torch  # type: ignore[attr-defined]
    except ImportError:
        return None
    return from_torch


MAX_EXAMPLE_ELEMENTS = 2**31  # --input-shape: a random example input this large is a typo, not a model


def _shape(text: str) -> tuple[int, ...]:
    parts = [d.strip() for d in text.split(",") if d.strip()]
    if not all(d.isdigit() and len(d) <= 12 for d in parts):
        raise argparse.ArgumentTypeError(f"expected a shape like 2,3 (non-negative ints), got {_clip(repr(text), 60)}")
    dims = tuple(int(d) for d in parts)
    if math.prod(dims) > MAX_EXAMPLE_ELEMENTS:
        raise argparse.ArgumentTypeError(f"shape {text!r} has {math.prod(dims)} elements (at most {MAX_EXAMPLE_ELEMENTS})")
    return dims


def _int_in(lo: int, hi: Optional[int] = None):
    """An argparse type: an int in ``[lo, hi]``."""

    def parse(text: str) -> int:
        t = text.strip()
        if not (t.lstrip("-").isdigit() and len(t) <= 12):
            raise argparse.ArgumentTypeError(f"expected an integer, got {_clip(repr(text), 60)}")
        v = int(t)
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected an integer from {lo} to {hi}, got {v}" if hi is not None
                                             else f"expected an integer >= {lo}, got {v}")
        return v

    return parse


def _cmd_import_torch(args: argparse.Namespace) -> int:
    import importlib


    from_torch = _torch_frontend()
    if from_torch is None:
        raise CLIError("the PyTorch frontend (pullback.frontend.from_torch) is not available")
    _check_output(args.output)
    if args.params:
        _check_output(args.params, ".npz", "--params")
    module_name, sep, factory_name = args.model.partition(":")
    if not sep or not module_name or not factory_name:
        raise CLIError(f"expected MODULE:FACTORY (e.g. mypkg.models:make_model), got {args.model!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise CLIError(f"cannot import {module_name}: {e}") from None
    except Exception as e:  # the user's module failed while importing
        raise CLIError(f"importing {module_name} raised {_one_line(e)}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise CLIError(f"{module_name} has no callable {factory_name}")
    try:
        import torch
    except ImportError:
        raise CLIError("import-torch needs PyTorch (pip install torch)") from None
    try:
        model = factory()
    except Exception as e:  # the user's factory failed
        raise CLIError(f"{args.model}() raised {_one_line(e)}") from None
    if not isinstance(model, torch.nn.Module):
        raise CLIError(f"{args.model} returned {type(model).__name__}, expected a torch.nn.Module")
    example = tuple(torch.randn(*s) for s in args.input_shape)
    with _progress("importing the PyTorch model"), warnings.catch_warnings():
        if not args.debug:  # torch.export's deprecation chatter is not the user's business
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
        mod, params = from_torch(model, example)
    if args.params:
        _write_npz(params, args.params)
    _write_module(mod, args.output)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(torch=args.torch, steps=args.steps)


# ---------------------------------------------------------------- parser and main


def _add_io(p: argparse.ArgumentParser, output_help: str = "output file (default: stdout)") -> None:
    p.add_argument("input", metavar="IN.pb", help="module in the pullback text format")
    p.add_argument("-o", "--output", metavar="OUT", help=output_help)


def _add_func(p: argparse.ArgumentParser) -> None:
    p.add_argument("--func", default="main", help="function of the module (default: main)")


class _ArgumentParser(argparse.ArgumentParser):
    """argparse with the CLI's error style: one line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"pullback: error: {self.prog}: {_clip(message)} (see {self.prog} --help)\n")


def _clip(text: str, limit: int = 300) -> str:
    """``text`` on one line, its middle cut out when longer than ``limit``."""
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[: limit - 60]} ... {text[-50:]}"


def build_parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(prog="pullback", description="pullback: differentiate, optimise and run tensor programs.")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    common = _ArgumentParser(add_help=False)  # --debug is accepted after the subcommand too
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grad", parents=[common], help="differentiate a function: adds @FUNC_grad returning (result, gradients)")
    _add_io(g, "output .pb file (default: stdout)")
    _add_func(g)
    g.add_argument("--wrt", metavar="x,w", help="parameters to differentiate with respect to (default: every float one)")
    g.add_argument("--mode", choices=("grad", "vjp"), default="grad",
                   help="grad: seed with ones; vjp: add a cotangent parameter (default: grad)")
    g.set_defaults(func_=_cmd_grad)

    o = sub.add_parser("opt", parents=[common], help="run passes (by registered name) or a pipeline on a module")
    _add_io(o, "output .pb file (default: stdout)")
    which = o.add_mutually_exclusive_group(required=True)
    which.add_argument("--passes", metavar="P1,P2,...", help="comma-separated registered pass names, in order")
    which.add_argument("--pipeline", choices=sorted(PIPELINES),
                       help="standard: standard_cleanup; fuse: standard_cleanup then FuseOps")
    o.add_argument("--opt-level", type=_int_in(0, 3), default=2, help="PassContext opt_level, 0 to 3 (default: 2)")
    o.add_argument("--time-passes", action="store_true", help="print the time of every pass (stderr)")
    o.add_argument("--print-after-all", action="store_true", help="print the module after every pass (stderr)")
    o.set_defaults(func_=_cmd_opt)

    r = sub.add_parser("run", parents=[common], help="run a function on inputs from an .npz file (arrays named like the parameters)")
    _add_io(r, "write the outputs to this .npz (keys out, out.0, out.1.0, ...) instead of printing them")
    r.add_argument("--inputs", required=True, action="append", metavar="inputs.npz",
                   help="one array per parameter, by name (tuple parameters: NAME.0, NAME.1, ...); "
                        "repeat to merge several files (e.g. data and the params.npz of import-torch)")
    _add_func(r)
    r.add_argument("--target", choices=("numpy", "jax", "torch"), default="numpy", help="executor (default: numpy)")
    r.add_argument("--profile", action="store_true", help="print the per-op time table and peak memory")
    r.set_defaults(func_=_cmd_run)

    s = sub.add_parser("stats", parents=[common], help="op histogram, like-operators, identity arithmetic, FLOPs, peak memory, fusion groups")
    s.add_argument("input", metavar="IN.pb", help="module in the pullback text format")
    _add_func(s)
    s.set_defaults(func_=_cmd_stats)

    v = sub.add_parser("viz", parents=[common], help="draw the dataflow graph (.dot always; .svg/.png need Graphviz)")
    v.add_argument("input", metavar="IN.pb", help="module in the pullback text format")
    v.add_argument("-o", "--output", required=True, metavar="graph.dot|.svg|.png", help="picture file; format from the suffix")
    _add_func(v)
    v.set_defaults(func_=_cmd_viz)

    t = sub.add_parser("import-torch", parents=[common], help="import a torch.nn.Module made by MODULE:FACTORY into a .pb file")
    t.add_argument("model", metavar="MODULE:FACTORY", help="importable module and a function returning the model")
    t.add_argument("--input-shape", type=_shape, action="append", required=True, metavar="2,3",
                   help="shape of one float32 example input (repeat for several inputs)")
    t.add_argument("-o", "--output", metavar="model.pb", help="output .pb file (default: stdout)")
    t.add_argument("--params", metavar="params.npz", help="write the parameter and buffer values (by @main parameter name)")
    t.set_defaults(func_=_cmd_import_torch)

    d = sub.add_parser("demo", parents=[common], help="the main job: differentiate, optimise and run a real model")
    d.add_argument("--torch", action="store_true", help="also start from torch.nn models and check against PyTorch autograd")
    d.add_argument("--steps", type=_int_in(1, 10_000), default=3, help="training steps to time (1 to 10000, default: 3)")
    d.set_defaults(func_=_cmd_demo)
    return p


def _one_line(e: BaseException) -> str:
    """The error as one line: its first line (a DiagnosticError: its problems joined by '; '), plus notes."""
    if isinstance(e, DiagnosticError):
        text = f"{e.header}: " + "; ".join(e.diagnostics)
    else:
        text = str(e).splitlines()[0] if str(e) else ""
    notes = " ".join(n.strip() for n in getattr(e, "__notes__", ()) if n.strip())
    return f"{type(e).__name__}: {text}" + (f" {notes}" if notes else "")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func_(args) or 0)
    except PullbackError as e:
        if args.debug:
            raise
        print(f"pullback: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\npullback: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug: still one line (the traceback with --debug)
        if args.debug:
            raise
        print(f"pullback: internal error: {_one_line(e)} (please report it; --debug shows the traceback)",
              file=sys.stderr)
        return 1
