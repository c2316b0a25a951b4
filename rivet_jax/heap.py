"""glibc's malloc thresholds, per kind of work: XLA's freed buffers back to the OS, numpy's temporaries reused.

Two kinds of phase want opposite settings. Training and rollouts (XLA): by default glibc raises its mmap threshold
each time a large mmapped block is freed (up to 32 MB), after which XLA's buffers of a few MB come from the heap
arenas of its many threads and stay resident once freed; the main job grew to 15.6 GB for ~3 GB live. Fixed small
thresholds (`return_freed_memory_to_the_os`, every launcher's first step) keep it near what is live (3.6 GB;
docs/timing.md). Off-policy estimation (numpy): every refit allocates tens of MB of temporaries, and with a 1 MB
mmap threshold each one is fresh pages from the kernel, faulted in and zeroed: on the 49-model pool's test split
53 million page faults, a fifth of the CPU time. `numpy_phase` lets such a phase reuse its freed buffers (one
FQE refit 2.6 s -> 2.15 s there) and gives the memory back when it ends; `xla_loop_phase` does the same for a
loop of thousands of small XLA calls (the online stage), whose per-call temporaries are one 6-8 MB block. All are
no-ops off glibc.

Python's cyclic garbage collector, too, is set for a launcher's process (`collect_cycles_rarely`): it holds
millions of long-lived objects, which every full collection walks again.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
from typing import Iterator

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # malloc.h
XLA_THRESHOLDS = (1 << 20, 4 << 20)            # mmap, trim: buffers over 1 MB mmapped, a free heap top over 4 MB trimmed
NUMPY_THRESHOLDS = (256 << 20, 1 << 30)
XLA_LOOP_THRESHOLDS = (8 << 20, 32 << 20)

_current: tuple[int, int] | None = None  # the thresholds in force, once a launcher fixed them; phases restore them


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _set(mmap_bytes: int, trim_bytes: int) -> bool:
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_bytes)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, trim_bytes))


def return_freed_memory_to_the_os() -> bool:
    """Fixes the thresholds at `XLA_THRESHOLDS` for the rest of the process; False off glibc."""
    global _current
    _current = XLA_THRESHOLDS if _set(*XLA_THRESHOLDS) else None
    return _current is not None


@contextlib.contextmanager
def _phase(thresholds: tuple[int, int]) -> Iterator[None]:
    """Within: `thresholds`; after: those in force before, and the free heap returned to the OS. Only a process
    that fixed its thresholds (a launcher) changes anything; a phase within a phase of the same kind changes
    nothing. The thresholds are the process's: phases belong to its main thread."""
    global _current
    outer = _current
    if outer is None or outer == thresholds:
        yield
        return
    _set(*thresholds)
    _current = thresholds
    try:
        yield
    finally:
        _set(*outer)
        _current = outer
        trim()


def trim() -> bool:
    """Returns the free memory of every heap arena to the OS now (glibc's `malloc_trim`); False off glibc. For a
    long phase whose other threads free buffers into arenas that never shrink on their own: the online stage trims
    before each validation, when its background checkpoint saves of the round before have landed (the main job's
    phase 3, 18 runs in lockstep, peaked 0.35 GB higher without it)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def numpy_phase() -> contextlib.AbstractContextManager[None]:
    """Buffers up to 256 MB come from the heap and a freed top up to 1 GB stays there, for reuse."""
    return _phase(NUMPY_THRESHOLDS)


def xla_loop_phase() -> contextlib.AbstractContextManager[None]:
    """Buffers up to 8 MB come from the heap (a freed top up to 32 MB stays): one small XLA program called thousands
    of times (the online stage's one-transition updates) allocates its temporaries as one 6-8 MB block per call,
    at the launchers' 1 MB threshold fresh pages from the kernel each time (4.0 against 2.6 ms an update). Only
    for such a loop: over the whole job the same thresholds keep ~0.9 GB more resident at the peak."""
    return _phase(XLA_LOOP_THRESHOLDS)


GC_THRESHOLDS = (10_000, 10, 10)   # Python's defaults: (700, 10, 10)


def collect_cycles_rarely() -> None:
    """Python's cyclic collector for a process of millions of long-lived objects (JAX's and Flax's modules, a corpus,
    the hashing vocabulary, rollouts' episodes): what is alive now (a launcher's imports) is frozen out of every
    later collection, and a young collection waits for 10,000 new container objects instead of 700, so full ones
    (which walk every tracked object) come 14 times less often. Reference counting still frees everything acyclic
    at once; only cycles wait longer. RouteSim's `launch.calibrate`: 17.6 -> 16.9 s on 2 cores. At exit, everything
    is frozen too: the interpreter's last collection would walk the whole heap (0.5 s there) for cycles whose memory
    the process's end returns anyway."""
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()
    atexit.register(gc.freeze)
