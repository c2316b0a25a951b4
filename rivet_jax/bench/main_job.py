"""Where the main job's time and memory go: `launch.reproduce` on a reduced manifest in a child process, its peak
resident memory measured by the kernel (what `/usr/bin/time -v` reports) and its `results.json` phases turned into
seconds and peak memory per phase.

The job's own progress lines mark each phase as it starts (`progress.Phases`: seconds elapsed and the peak so far);
a phase's seconds are the time to the next mark, and its peak is the peak reached by the next mark (a peak never
falls, so a phase that used less than an earlier one shows the earlier peak).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from rivet_jax.progress import process_peak_gb

MAIN_JOB = "configs/routesim.py:tiny"   # the reduced manifest: the tiny reproduction (every phase, seconds long)
POLL_S = 0.05                           # how often the child's peak memory is read


def phase_rows(meta: dict) -> list[dict]:
    """[{phase, seconds, peak_rss_gb}] from a results.json's meta ({"seconds": total, "phases": marks in order})."""
    marks = meta["phases"]
    ends = [(m["seconds"], m["peak_rss_gb"]) for m in marks[1:]] + [(meta["seconds"], None)]
    return [{"phase": mark["phase"], "seconds": round(max(end - mark["seconds"], 0.0), 1), "peak_rss_gb": peak}
            for mark, (end, peak) in zip(marks, ends)]


def run_main_job(workdir: str | Path, config: str = MAIN_JOB, command: Sequence[str] | None = None) -> dict:
    """Runs the main job (`python -m launch.reproduce --config=<config> --workdir=<workdir>`, or `command`) to the
    end in a child process; returns its wall seconds, its peak resident memory in GB (the child's own VmHWM, read
    every `POLL_S` while it runs), and its phases (`phase_rows`; the last one's peak is the child's)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    argv = list(command or [sys.executable, "-m", "launch.reproduce", f"--config={config}", f"--workdir={workdir}"])
    log = workdir / "main_job.log"   # its progress lines (a pipe left unread would fill and stop the job)
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        peak, status, usage = _wait_for_peak(child.pid)
    seconds = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"the main job failed (exit {child.returncode}: {' '.join(argv)}); the end of {log}:\n"
                           + log.read_text(encoding="utf-8", errors="replace")[-2000:])
    if peak is None:   # no /proc: the kernel's count at the end (which, on Linux, starts from this process' peak)
        peak = usage.ru_maxrss / (1e9 if sys.platform == "darwin" else 1e6)
    meta = json.loads((workdir / "results.json").read_text())["meta"]
    rows = phase_rows(meta)
    if rows:
        rows[-1]["peak_rss_gb"] = round(peak, 2)
    return {"command": " ".join(argv), "seconds": round(seconds, 1), "peak_rss_gb": round(peak, 2), "phases": rows,
            "outside_phases_s": round(max(seconds - meta["seconds"], 0.0), 1)}   # start-up (imports), files at the end


def _wait_for_peak(pid: int) -> tuple[float | None, int, object]:
    """Waits for child `pid`; returns its last VmHWM in GB (None without /proc), its wait status and its resource
    usage. Read while it runs: the usage's ru_maxrss would not do on Linux, where exec hands the child this
    process' own peak (a benchmark run from a 2 GB notebook or test worker would report 2 GB for any job)."""
    peak = None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return peak, status, usage
        now = process_peak_gb(pid)
        if now is not None:
            peak = now if peak is None else max(peak, now)
        time.sleep(POLL_S)


def main_job_rows(result: dict) -> list[tuple[str, str, str]]:
    """The benchmark table's rows: the whole job, then one per phase."""
    rows = [("main job (reduced manifest)", f"{result['seconds']:.0f} s",
             f"peak {result['peak_rss_gb']:.2f} GB resident; {result['command']}")]
    for row in result["phases"]:
        rows.append((f"  phase: {row['phase'][:60]}", f"{row['seconds']:.1f} s",
                     f"peak {row['peak_rss_gb']:.2f} GB resident by its end"))
    rows.append(("  outside the phases", f"{result['outside_phases_s']:.1f} s",
                 "start-up (imports, JAX) and the files written after the last mark"))
    return rows
