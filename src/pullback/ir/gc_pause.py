"""``gc_paused()``: the cyclic garbage collector paused inside a block, then restored.

Passes, the parser and ``build`` make millions of new acyclic objects on a big program; each full
collection would rescan all of them (the heap grows with the program), for no garbage.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC paused inside (work making many new acyclic objects: it would only rescan them), then restored."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["gc_paused"]
