"""Per-op time and peak intermediate memory of one run.

Peak memory counts the buffers kernels allocate while they are alive: each new
buffer (the base of a NumPy view, the storage of a torch tensor: the target's
``buffer``) counts once and is registered with a weakref finalizer, so the
figure is what was actually live, including values held by tuples. Inputs,
constants and views of them are not intermediates.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from time import perf_counter
from typing import Callable, Optional

from .values import leaves


@dataclass
class ProfileRow:
    op: str
    calls: int
    seconds: float
    share: float


@dataclass
class Profile:
    """The result of ``Executable.profile``: per-op rows (slowest first) and ``peak_bytes``."""

    func: str
    rows: list = field(default_factory=list)
    peak_bytes: int = 0
    total_seconds: float = 0.0
    outputs: object = None

    def render(self) -> str:
        """A text table sorted by time."""
        head = f"{'op':<24s} {'calls':>8s} {'total ms':>10s} {'share':>7s}"
        lines = [f"profile of @{self.func}", head, "-" * len(head)]
        for r in self.rows:
            lines.append(f"{r.op:<24s} {r.calls:>8d} {r.seconds * 1e3:>10.3f} {r.share * 100:>6.1f}%")
        lines.append("-" * len(head))
        kernel = sum(r.seconds for r in self.rows)
        lines.append(f"{'kernels':<24s} {sum(r.calls for r in self.rows):>8d} {kernel * 1e3:>10.3f}")
        lines.append(f"wall time {self.total_seconds * 1e3:.3f} ms, peak intermediate memory {self.peak_bytes} bytes")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


class Profiler:
    """Collects kernel timings and live-buffer bytes during one run."""

    def __init__(self, excluded: list, buffer: Callable[[object], Optional[tuple]]):
        self.times: dict[str, list] = {}
        self.live: dict[int, int] = {}
        self.live_bytes = 0
        self.peak = 0
        self.buffer = buffer  # value -> (owner, nbytes) or None
        owners = [buffer(a) for a in excluded]
        self.excluded = {id(b[0]) for b in owners if b is not None}
        self._keep = (excluded, owners)  # keep ids valid during the run

    def kernel(self, fn, vals, attrs, name: str):
        t0 = perf_counter()
        v = fn(*vals, attrs)
        dt = perf_counter() - t0
        rec = self.times.get(name)
        if rec is None:
            self.times[name] = [1, dt]
        else:
            rec[0] += 1
            rec[1] += dt
        self.track(v)
        return v

    def track(self, value) -> None:
        for a in leaves(value):
            found = self.buffer(a)
            if found is None:
                continue  # scalars, read-only data: no buffer to follow
            b, nbytes = found
            key = id(b)
            if key in self.live or key in self.excluded:
                continue
            self.live[key] = nbytes
            self.live_bytes += nbytes
            if self.live_bytes > self.peak:
                self.peak = self.live_bytes
            weakref.finalize(b, self._release, key).atexit = False

    def _release(self, key: int) -> None:
        self.live_bytes -= self.live.pop(key, 0)

    def result(self, func: str, total: float, outputs) -> Profile:
        kernel = sum(t for _, t in self.times.values()) or 1.0
        rows = [ProfileRow(k, c, t, t / kernel) for k, (c, t) in self.times.items()]
        rows.sort(key=lambda r: -r.seconds)
        return Profile(func, rows, self.peak, total, outputs)
