"""RouteSim end to end through the launchers: collect -> offline training -> evaluation against the oracle."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rivet_jax.envs import collect

REPO = Path(__file__).resolve().parents[1]


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_collect_then_evaluate_on_tiny_routesim(tmp_path):
    workdir = tmp_path / "run"
    collected = run("launch.collect", "--config=configs/routesim.py:tiny", f"--workdir={workdir}")
    assert collected.returncode == 0, collected.stderr[-3000:]
    assert "| random |" in collected.stdout
    summary = json.loads((workdir / "corpus" / "summary.json").read_text())
    assert set(summary) == {"fixed:apex-flash", "fixed:apex-pro", "fixed:llama-70b", "fixed:mini-4o",
                            "fixed:quill-9b", "fixed:quill-plus", "random"}
    assert all(row["episodes"] == 10 for row in summary.values())  # tiny: 2 train tasks in each of 5 families

    evaluated = run("launch.evaluate", "--config=configs/routesim.py:tiny", f"--workdir={workdir}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "Corpus already in" in evaluated.stderr  # the corpus was reused, not collected again
    result = json.loads((workdir / "evaluation.json").read_text())
    rows = result["rows"]
    assert {"rivet", "oracle", "random"} <= set(rows)
    assert rows["oracle"]["regret"] == 0.0
    # the oracle is optimal in expectation; the learned router's regret is a finite number on this manifest
    assert all(row["regret"] >= -1e-9 for name, row in rows.items() if name != "rivet")
    assert 0.0 <= rows["rivet"]["accuracy"] <= 1.0 and rows["rivet"]["cost"] > 0
    assert result["c_ref"] > 0 and result["reference"] in rows
    assert "| rivet |" in evaluated.stdout
    assert (workdir / "train" / "checkpoints" / "td").is_dir()
    assert (workdir / "corpus" / collect.EPISODES_FILE).exists()


def test_progress_logs_rate_limited_lines_with_an_eta():
    from rivet_jax.progress import Progress

    now, lines = [0.0], []
    progress = Progress("runs", total=5, every_s=20.0, clock=lambda: now[0], log=lambda fmt, *a: lines.append(fmt % a))
    for t in (5.0, 10.0, 30.0, 35.0, 40.0):  # units finish at these times
        now[0] = t
        progress.step()
    # 5 s and 10 s are inside the first 20 s (quiet); 30 s logs (3 done, 10 s each, 2 left -> 20 s); 35 s is quiet;
    # the last unit always logs.
    assert lines == ["runs: 3/5 done, 30s elapsed, about 20s left", "runs: 5/5 done, 40s elapsed, about 0s left"]


def test_waiting_for_work_in_another_process_logs_a_line_every_interval_until_it_is_done():
    """`result_of`: the main job waiting for its baselines or diagnostics (worked out in another process) logs a
    line every `every_s` while the work is not done, then returns its result; done work returns at once, silently."""
    import concurrent.futures
    import threading
    from rivet_jax.progress import result_of

    release, lines = threading.Event(), []

    def log(fmt, *args):
        lines.append(fmt % args)
        if len(lines) == 3:
            release.set()   # the work finishes after the third line

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(lambda: release.wait(10) and "baselines")
        assert result_of(pending, "the baselines", every_s=0.01, log=log) == "baselines"
        assert len(lines) == 3 and all(line.startswith("waiting for the baselines: ") for line in lines)
        lines.clear()
        assert result_of(pool.submit(lambda: 7), "x", every_s=5.0, log=log) == 7 and lines == []


def test_progress_without_a_last_line_stays_quiet_at_the_end_unless_a_line_is_due():
    """`last=False` (a caller that reports the end itself, e.g. an epoch's own line): the last unit logs only when
    `every_s` has passed."""
    from rivet_jax.progress import Progress

    for end, expected in ((12.0, []), (25.0, ["steps: 3/3 done, 25s elapsed, about 0s left"])):
        now, lines = [0.0], []
        progress = Progress("steps", total=3, every_s=20.0, clock=lambda: now[0],
                            log=lambda fmt, *a: lines.append(fmt % a), last=False)
        for t in (4.0, 8.0, end):
            now[0] = t
            progress.step()
        assert lines == expected


def test_a_host_fed_epoch_reports_its_steps_as_it_goes(monkeypatch, tmp_path):
    """An epoch gathered on the host (the 100,000-episode run's: 1.5 minutes) logs how many of its steps are done,
    the chunk before the one in flight, rate-limited like every progress line (here every chunk)."""
    from configs import default
    from rivet_jax import engine, train
    from rivet_jax.progress import Progress
    from rivet_jax.settings import with_overrides

    lines = []
    monkeypatch.setattr(engine, "Progress", lambda what, total, last: Progress(
        what, total, every_s=0.0, log=lambda fmt, *a: lines.append(fmt % a), last=last))
    config = with_overrides(default.get_config("tiny"), {"stage": "mc", "data.demo": True,
                                                         "data.embeddings_on_disk": True, "data.host_chunk_steps": 2})
    train.train(config, tmp_path / "w")
    first = [re.fullmatch(r"mc epoch 1, 1 run\(s\) \(steps\): (\d+)/(\d+) done, .*", line) for line in lines
             if line.startswith("mc epoch 1,")]
    assert first and all(first), lines
    done, total = [int(m[1]) for m in first], int(first[0][2])
    assert done == list(range(2, total, 2)), (done, total)   # every chunk of 2 but the last, reported as it ends


def test_phases_record_seconds_and_the_peak_resident_memory():
    """Each phase's line and record carry the seconds since the start and the process's peak resident memory: the
    kernel's VmHWM (what /usr/bin/time -v reports), which holds 200 MB touched just before."""
    from rivet_jax.progress import Phases, peak_rss_gb

    now = [10.0]
    phases = Phases(clock=lambda: now[0])
    now[0] = 12.5
    line = phases.mark("load")
    held = np.ones(200_000_000 // 8)   # 200 MB, touched
    now[0] = 70.0
    phases.mark("train")
    assert [r["phase"] for r in phases.record] == ["load", "train"]
    assert [r["seconds"] for r in phases.record] == [2.5, 60.0]
    assert line.startswith("2s elapsed, peak ") and line.endswith(" GB resident")
    assert float(line.split()[3]) == pytest.approx(phases.record[0]["peak_rss_gb"], abs=0.051)
    status = Path("/proc/self/status")
    if status.exists():   # Linux: the kernel's own counters
        fields = dict(entry.split(":", 1) for entry in status.read_text().splitlines())
        hwm, rss = (int(fields[k].split()[0]) / 1e6 for k in ("VmHWM", "VmRSS"))
        assert peak_rss_gb() == pytest.approx(hwm, abs=0.01) and hwm >= rss >= held.nbytes / 1e9
        assert phases.record[1]["peak_rss_gb"] >= held.nbytes / 1e9
