"""Run PyTorch's OpInfo samples through the importer and write docs/opinfo.md (``make opinfo``).

    python scripts/opinfo_report.py -n 2             # every sample of every operator on 2 worker processes
    python scripts/opinfo_report.py --limit 3        # three samples per operator and dtype
    python scripts/opinfo_report.py --budget 600     # at most 600 s per OpInfo (the rest: "not run", listed)
    python scripts/opinfo_report.py --ops cumsum sort --no-write
    python scripts/opinfo_report.py --results run.jsonl   # record each OpInfo's results as it completes;
                                                          # run again to resume (--ops reruns the named ones)

Exits 1 when a sample fails (a wrong value or gradient, or a crash); skipped samples are listed with their reason,
samples a time budget left out are counted as "not run" per OpInfo.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

from pullback.frontend import opinfo

OUT = Path(__file__).resolve().parent.parent / "docs" / "opinfo.md"


def _print_op(name: str, rs: list, started: float) -> None:
    bad = [r for r in rs if r.status == "failed"]
    unrun = sum(r.status == "unrun" for r in rs)
    print(f"{name:45s} {len(rs):5d} samples  {sum(r.status == 'passed' for r in rs):5d} passed  {len(bad):3d} failed"
          + (f"  {unrun} not run (budget)" if unrun else "") + f"  at {time.time() - started:6.0f}s", flush=True)
    for r in bad:
        print(f"    FAILED {r.dtype} sample {r.index}: {r.reason}", flush=True)


def _load(path: Path | None) -> dict:
    """Results recorded in ``path`` by earlier runs, by OpInfo (the latest record of each wins)."""
    if path is None or not path.exists():
        return {}
    done: dict = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            done[rec["opinfo"]] = [opinfo.SampleResult(**r) for r in rec["results"]]
    return done


def _record(path: Path | None, name: str, rs: list) -> None:
    if path is not None:
        with path.open("a") as f:
            f.write(json.dumps({"opinfo": name, "results": [dataclasses.asdict(r) for r in rs]}) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="samples per operator and dtype (default: all)")
    ap.add_argument("--ops", nargs="*", default=None, help="OpInfo names (default: every operator of the table)")
    ap.add_argument("-n", "--jobs", type=int, default=1, help="worker processes (default 1: in this process)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per OpInfo (default: no limit)")
    ap.add_argument("--no-write", action="store_true", help="print the summary only")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--results", type=Path, default=None,
                    help="a JSON-lines file recording each OpInfo's results; OpInfos already in it are not rerun "
                         "(except those named by --ops) and the report covers every OpInfo of the table")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    start = time.time()
    previous = _load(args.results)
    every = opinfo.opinfos()
    infos = [o for o in every if (opinfo.full_name(o) in args.ops if args.ops is not None
                                  else opinfo.full_name(o) not in previous)]

    def done(name: str, rs: list) -> None:
        _print_op(name, rs, start)
        _record(args.results, name, rs)
        previous[name] = rs
    if args.jobs > 1 or args.budget is not None:
        results = opinfo.run_parallel(infos, max(args.jobs, 1), args.limit, args.budget,
                                      on_done=done)
    else:
        results = []
        for info in infos:
            rs = opinfo.run([info], limit=args.limit)
            results += rs
            done(opinfo.full_name(info), rs)
    if args.results is not None:  # the whole table: this run's results and the recorded ones
        results = [r for o in every for r in previous.get(opinfo.full_name(o), [])]
    s = opinfo.summary(results)
    print(f"{s['operators']} operators, {s['samples']} samples: {s['passed']} passed ({s['grad_checked']} with gradients), "
          f"{s['skipped']} skipped, {s['failed']} failed, {s['unrun']} not run (time budget) in {time.time() - start:.0f}s")
    if not args.no_write:
        command = "python scripts/opinfo_report.py" + (f" --limit {args.limit}" if args.limit else "") + (
            f" --budget {args.budget:g}" if args.budget is not None else "") + (
            f" --results {args.results.name}" if args.results is not None else "")
        args.out.write_text(opinfo.report(results, command, args.budget))
        print(f"wrote {args.out}")
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
