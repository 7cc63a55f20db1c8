"""Giving back what a burst of reconciles used, and a debug dump of where the memory is.

A new leader's first pass over thousands of runs touches far more memory than the runs keep afterwards
(every listed body decoded, thousands of reconciles queued, every status patch's answer). Python frees
those objects, but the pages stay with the process: glibc's heap keeps freed chunks for reuse and returns
only its top, so without help the process keeps its first pass's high-water mark for life (bench/REPORT.md,
the operator at 10,000 runs). ``release`` runs a full collection and glibc's ``malloc_trim(0)``, which hands
every wholly free page of every heap back to the system. ``Wakeups`` calls it (through ``Releaser``) once a
burst of at least ``BURST`` reconciles has drained and ``SETTLE_SECONDS`` passed without a new one.

Python's own small-object allocator (pymalloc) keeps its 1 MiB arenas until each is entirely free, which a
long-lived object allocated between short-lived ones prevents: ``malloc_trim`` cannot return those, so the
first pass should touch little in the first place (``io/handlers.py``'s Memory). ``PYTHONMALLOC=malloc``
(every object from glibc's heap, so that a free page is a free page) was measured and is not used: 142 MB
after the trim against pymalloc's 133 MB at 3,192 runs (bench/REPORT.md).

What it costs: one full ``gc.collect()`` (0.65 s of the loop at 3,192 runs on a loaded machine) and the trim, once per
burst. Not available (musl, macOS): only the collection runs.

``dump`` (``debug_memory_signal``, off by default) writes the process's RSS, what glibc's heap and pymalloc's
arenas hold against what their live blocks use (the allocators' retained pages), the objects by type and,
when ``tracemalloc`` traces (``PYTHONTRACEMALLOC=25`` in the environment), the top allocation sites.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import gc
import logging
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("agentrun_operator.memory")

BURST = 500  # reconciles alive at once that make a burst worth giving back
SETTLE_SECONDS = 10.0  # after the burst: its status patches' watch echoes arrive (and are dropped) meanwhile


def rss_mb() -> float:
    """This process's resident memory (MB), from /proc (0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


MALLOC_TRIM = _malloc_trim()


def release() -> tuple[float, float]:
    """Collect garbage and give every free heap page back (the module docstring); RSS before and after (MB)."""
    before = rss_mb()
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)
    return before, rss_mb()


class Releaser:
    """Calls ``release`` ``SETTLE_SECONDS`` after a burst of reconciles drained (``Wakeups`` reports both)."""

    def __init__(self, *, burst: int = BURST, settle: float = SETTLE_SECONDS) -> None:
        self.burst = burst
        self.settle = settle
        self.alive = 0
        self.peak = 0
        self.releases = 0
        self._timer: asyncio.TimerHandle | None = None

    def started(self) -> None:
        """A reconcile started (it may be queued at the gate)."""
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        if self._timer is not None:  # still busy: wait for this burst to drain too
            self._timer.cancel()
            self._timer = None

    def ended(self) -> None:
        """A reconcile ended; the last of a burst schedules the release."""
        self.alive -= 1
        if self.alive == 0 and self.peak >= self.burst:
            self._timer = asyncio.get_running_loop().call_later(
                self.settle, self._release, context=contextvars.Context()
            )

    def _release(self) -> None:
        self._timer = None
        peak, self.peak = self.peak, 0
        began = time.perf_counter()
        before, after = release()
        self.releases += 1
        log.info(
            "a burst of %d reconciles drained: memory given back, RSS %.0f -> %.0f MB (%.2f s)",
            peak,
            before,
            after,
            time.perf_counter() - began,
        )

    def close(self) -> None:
        """Cancel a pending release."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def heap_lines() -> list[str]:
    """glibc's heap (mallinfo2: in use vs kept free) and pymalloc's arenas (in blocks vs kept free)."""
    lines: list[str] = []
    with contextlib.suppress(OSError, AttributeError):
        mallinfo2 = ctypes.CDLL(None).mallinfo2
        mallinfo2.restype = _MallInfo2
        info = mallinfo2()
        lines.append(
            f"glibc_heap_mb {info.arena / 2**20:.1f} in_use_mb {info.uordblks / 2**20:.1f}"
            f" free_mb {info.fordblks / 2**20:.1f} mmapped_mb {info.hblkhd / 2**20:.1f}"
        )
    # pymalloc's summary goes to the C stderr: caught in a file for the few lines that say arenas vs blocks.
    with tempfile.TemporaryFile("w+") as caught:
        saved = os.dup(2)
        try:
            os.dup2(caught.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        lines += [f"pymalloc {line}" for line in caught.read().splitlines() if line.startswith(PYMALLOC_SUMMARY)]
    return lines


PYMALLOC_SUMMARY = ("# arenas allocated current", "# arenas highwater", "# bytes in allocated", "# bytes in available")


def dump(path: Path, *, top: int = 40) -> None:
    """Write where the memory is to ``path`` (the module docstring): RSS, the allocators' split (in use vs
    kept), objects by type, tracemalloc's top sites."""
    gc.collect()
    lines = [f"rss_mb {rss_mb():.1f}", f"allocated_blocks {sys.getallocatedblocks()}", *heap_lines()]
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot()
        traced, peak = tracemalloc.get_traced_memory()
        lines.append(f"tracemalloc_mb {traced / 2**20:.1f} peak_mb {peak / 2**20:.1f}")
        lines.append("-- by file")
        for stat in snapshot.statistics("filename")[:top]:
            lines.append(f"{stat.size / 2**20:9.2f} MB {stat.count:9d} {stat.traceback[0].filename}")
        lines.append("-- by line")
        for stat in snapshot.statistics("lineno")[:top]:
            frame = stat.traceback[0]
            lines.append(f"{stat.size / 2**20:9.2f} MB {stat.count:9d} {frame.filename}:{frame.lineno}")
    lines.append("-- objects by type")
    counts = Counter(type(o).__name__ for o in gc.get_objects())
    lines.extend(f"{n:9d} {name}" for name, n in counts.most_common(top))
    path.write_text("\n".join(lines) + "\n")


def dump_on_signal(loop: asyncio.AbstractEventLoop, signum: int, path: Path) -> None:
    """Debug hook: on ``signum`` write ``dump`` to ``path`` (off unless configured)."""
    loop.add_signal_handler(signum, dump, path)
    log.warning("debug hook: signal %s writes where the memory is to %s", signal.Signals(signum).name, path)
