"""Pass instruments: hooks around every pass a PassContext runs.

``PassTiming`` (wall time per pass, nested), ``PrintIR`` (IR dumps) and
``WellFormedCheck`` (type inference and well-formedness after every pass; on in
the test suite).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import IO, Iterable, Optional

from ..ir.errors import PassError, PullbackError
from ..ir.module import IRModule
from ..text import astext
from .pass_infra import PassInfo


class PassInstrument:
    """Base instrument: every hook is a no-op; override what you need."""

    def enter_pass_ctx(self) -> None:
        """Called when a PassContext holding this instrument is entered."""

    def exit_pass_ctx(self) -> None:
        """Called when that PassContext exits."""

    def should_run(self, mod: IRModule, info: PassInfo) -> bool:
        """Return False to skip the pass (the skip is reported like any other)."""
        return True

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        """Called just before a pass runs, with its input."""

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        """Called after a pass ran, with its output."""

    def on_skip(self, mod: IRModule, info: PassInfo, reason: str) -> None:
        """Called when a pass is skipped, with the reason."""

    def on_error(self, mod: IRModule, info: PassInfo, exc: BaseException) -> None:
        """Called when a pass raised (``run_after_pass`` is not called then)."""


@dataclass
class PassTime:
    """One row of ``PassTiming.timings``; ``seconds`` is None for a skipped or failed pass."""

    name: str
    depth: int
    seconds: Optional[float] = None
    note: str = ""


class PassTiming(PassInstrument):
    """Wall time of every pass; passes run inside a Sequential are nested one level deeper.

    ``timings`` lists ``PassTime`` rows in start order; ``render()`` formats them.
    """

    def __init__(self):
        self.timings: list[PassTime] = []
        self._open: list[tuple[PassTime, float]] = []

    def reset(self) -> None:
        self.timings.clear()
        self._open.clear()

    def run_before_pass(self, mod, info):
        row = PassTime(info.name, len(self._open))
        self.timings.append(row)
        self._open.append((row, time.perf_counter()))

    def run_after_pass(self, mod, info):
        row, start = self._open.pop()
        row.seconds = time.perf_counter() - start

    def on_error(self, mod, info, exc):
        row, _ = self._open.pop()
        row.note = f"failed: {type(exc).__name__}"

    def on_skip(self, mod, info, reason):
        self.timings.append(PassTime(info.name, len(self._open), None, f"skipped: {reason}"))

    def render(self) -> str:
        """A text table: pass (indented by nesting), milliseconds, share of the total."""
        total = sum(r.seconds or 0.0 for r in self.timings if r.depth == 0)
        rows = [("pass", "ms", "%")]
        for r in self.timings:
            label = "  " * r.depth + r.name
            if r.seconds is None:
                rows.append((label, "-", r.note))
            else:
                share = f"{100.0 * r.seconds / total:.1f}" if total > 0 else "-"
                rows.append((label, f"{r.seconds * 1e3:.3f}", share))
        rows.append(("total", f"{total * 1e3:.3f}", "100.0" if total > 0 else "-"))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a:<{w0}}  {b:>{w1}}  {c}".rstrip() for a, b, c in rows]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(lines)


def _astext(mod: IRModule) -> str:
    return astext(mod)


class PrintIR(PassInstrument):
    """Print the module before and/or after passes (all passes, or those named in ``passes``).

    ``stream`` defaults to the ``sys.stdout`` current at print time.
    """

    def __init__(self, before: bool = False, after: bool = True, stream: Optional[IO[str]] = None,
                 passes: Optional[Iterable[str]] = None):
        self.before = before
        self.after = after
        self.stream = stream
        self.passes = None if passes is None else frozenset([passes] if isinstance(passes, str) else passes)

    def _emit(self, when: str, mod: IRModule, info: PassInfo) -> None:
        if self.passes is not None and info.name not in self.passes:
            return
        out = self.stream if self.stream is not None else sys.stdout
        out.write(f"# IR {when} {info.name}\n{_astext(mod)}\n")

    def run_before_pass(self, mod, info):
        if self.before:
            self._emit("before", mod, info)

    def run_after_pass(self, mod, info):
        if self.after:
            self._emit("after", mod, info)


def _check(mod: IRModule, verified=None) -> Optional[str]:
    """None if ``mod`` type-checks and is well formed, else the error message.

    ``verified`` (``analysis.well_formed.VerifiedNodes``) makes the check incremental:
    nodes verified by the previous successful check, and unchanged since, are skipped."""
    from ..analysis.type_infer import infer_module
    from ..analysis.well_formed import _check_well_formed

    try:
        infer_module(mod)
        _check_well_formed(mod, None, verified)
    except PullbackError as e:
        return f"{type(e).__name__}: {e}"
    return None


class WellFormedCheck(PassInstrument):
    """After every pass, infer types and check well-formedness of the result.

    Raises ``PassError("after pass NAME: ...")`` when a pass turned a valid module into an
    invalid one. An invalid input is not blamed on the pass (nothing is raised then).
    """

    def __init__(self):
        self._last_ok: Optional[IRModule] = None
        self._inputs: list[IRModule] = []  # one per running (possibly nested) pass
        self._verified = None  # nodes the last successful check verified (re-checked only if changed)

    def _forget(self) -> None:
        self._last_ok = None
        self._verified = None

    def exit_pass_ctx(self):
        self._forget()

    def run_before_pass(self, mod, info):
        self._inputs.append(mod)

    def run_after_pass(self, mod, info):
        given = self._inputs.pop()
        try:
            if mod is self._last_ok or mod is given:  # unchanged: nothing to blame the pass for
                return
            from ..analysis.well_formed import VerifiedNodes

            if self._verified is None:
                self._verified = VerifiedNodes()
            err = _check(mod, self._verified)
            if err is None:
                self._last_ok = mod
                return
            if given is self._last_ok or _check(given) is None:
                raise PassError(f"after pass {info.name}: {err}")
        finally:
            if not self._inputs:  # outermost pass done: do not keep its module alive
                self._forget()

    def on_error(self, mod, info, exc):
        self._inputs.pop()
        if not self._inputs:
            self._forget()


__all__ = ["PassInstrument", "PassTime", "PassTiming", "PrintIR", "WellFormedCheck"]
