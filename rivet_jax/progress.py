"""Progress lines with an ETA for long phases (training runs, rollout sets, online trajectories)."""

from __future__ import annotations

import concurrent.futures
import resource
import sys
import time
from typing import Callable

from absl import logging


class Progress:
    """Counts the units of a long phase and logs `what: k/n, elapsed, ETA` when one finishes, at most every
    `every_s` seconds (and always for the last), so a long job never goes quiet and never floods its log: with units
    of at most 5 s, a line at least every 20 s.

    A plain log line rather than a progress bar: the job's output is usually a file (a bar's carriage returns make
    one unreadable line there)."""

    def __init__(self, what: str, total: int, every_s: float = 15.0, clock: Callable[[], float] = time.perf_counter,
                 log: Callable[..., None] = logging.info, last: bool = True):
        self.what, self.total, self.every_s, self.clock, self.log = what, total, every_s, clock, log
        self.last = last  # False: no line for the last unit unless it is due anyway (a caller that reports the end)
        self.done, self.started = 0, clock()
        self.logged_at = self.started

    def step(self, units: int = 1) -> None:
        self.done += units
        now = self.clock()
        if now - self.logged_at < self.every_s and (self.done < self.total or not self.last):
            return
        self.logged_at = now
        elapsed = now - self.started
        left = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        self.log("%s: %d/%d done, %.0fs elapsed, about %.0fs left", self.what, self.done, self.total, elapsed,
                 max(left, 0.0))


def result_of(future: concurrent.futures.Future, what: str, every_s: float = 15.0,
              log: Callable[..., None] = logging.info):
    """`future.result()`, with a line every `every_s` seconds while it is not done: a job waiting for work it
    started in another process (the main job's baselines and diagnostics) does not go quiet."""
    started = time.perf_counter()
    while True:
        try:
            return future.result(timeout=every_s)
        except concurrent.futures.TimeoutError:
            log("waiting for %s: %.0fs", what, time.perf_counter() - started)


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (VmHWM: what `/usr/bin/time -v` reports at the end).

    Not getrusage's ru_maxrss where the kernel has VmHWM: Linux's exec hands a process the high-water mark of the
    memory it replaces, so a job started from a 2 GB notebook or test worker would say 2 GB from its first line."""
    peak = process_peak_gb("self")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1e9 if sys.platform == "darwin" else 1e6)


def process_peak_gb(pid: int | str) -> float | None:
    """Process `pid`'s (or "self"'s) peak resident memory so far in GB, its VmHWM; None where there is none to read
    (no /proc, or the process has ended)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            peak = next((line for line in status if line.startswith("VmHWM:")), None)
    except OSError:
        return None
    return None if peak is None else int(peak.split()[1]) / 1e6   # kB


class Phases:
    """The seconds and the peak resident memory at each phase of a long job: the suffix of its progress lines, and
    `record` ([{phase, seconds, peak_rss_gb}], for its results) to find where the time and the memory go."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.started, self.record = clock, clock(), []

    def seconds(self) -> float:
        """Seconds since the job started."""
        return self.clock() - self.started

    def mark(self, phase: str) -> str:
        """Records `phase` as reached now; returns "<s>s elapsed, peak <GB> GB resident"."""
        seconds, peak = self.seconds(), peak_rss_gb()
        self.record.append({"phase": phase, "seconds": round(seconds, 1), "peak_rss_gb": round(peak, 2)})
        return f"{seconds:.0f}s elapsed, peak {peak:.1f} GB resident"
