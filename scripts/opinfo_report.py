"""Run PyTorch's OpInfo samples through the importer and write docs/opinfo.md (``make opinfo``).

    python scripts/opinfo_report.py                  # every sample of every operator (long)
    python scripts/opinfo_report.py --limit 3        # three samples per operator and dtype
    python scripts/opinfo_report.py --ops cumsum sort --no-write

Exits 1 when a sample fails (a wrong value or gradient, or a crash); skipped samples are listed with their reason.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from pullback.frontend import opinfo

OUT = Path(__file__).resolve().parent.parent / "docs" / "opinfo.md"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="samples per operator and dtype (default: all)")
    ap.add_argument("--ops", nargs="*", default=None, help="OpInfo names (default: every operator of the table)")
    ap.add_argument("--no-write", action="store_true", help="print the summary only")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    start = time.time()
    results = []
    for info in opinfo.opinfos(args.ops):
        t = time.time()
        rs = opinfo.run([info], limit=args.limit)
        results += rs
        bad = [r for r in rs if r.status == "failed"]
        print(f"{opinfo.full_name(info):45s} {len(rs):4d} samples  {sum(r.status == 'passed' for r in rs):4d} passed  "
              f"{len(bad):3d} failed  {time.time() - t:6.1f}s", flush=True)
        for r in bad:
            print(f"    FAILED {r.dtype} sample {r.index}: {r.reason}")
    s = opinfo.summary(results)
    print(f"{s['operators']} operators, {s['samples']} samples: {s['passed']} passed ({s['grad_checked']} with gradients), "
          f"{s['skipped']} skipped, {s['failed']} failed in {time.time() - start:.0f}s")
    if not args.no_write:
        command = "python scripts/opinfo_report.py" + (f" --limit {args.limit}" if args.limit else "")
        args.out.write_text(opinfo.report(results, command))
        print(f"wrote {args.out}")
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
