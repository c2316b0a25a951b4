"""glibc's thresholds per kind of work (rivet_jax/heap.py): a numpy phase or an update loop reuses its buffers, then
the process's own thresholds come back, even when the phase fails; a process that never fixed them is left alone."""

import pytest

from rivet_jax import heap


@pytest.fixture
def calls(monkeypatch):
    made = []
    monkeypatch.setattr(heap, "_set", lambda mmap_bytes, trim_bytes: made.append((mmap_bytes, trim_bytes)) or True)
    monkeypatch.setattr(heap, "_current", None)
    return made


@pytest.mark.parametrize("phase, thresholds", [(heap.numpy_phase, heap.NUMPY_THRESHOLDS),
                                               (heap.xla_loop_phase, heap.XLA_LOOP_THRESHOLDS)])
def test_a_phase_of_a_launcher_sets_its_thresholds_and_restores_the_launchers(calls, phase, thresholds):
    assert heap.return_freed_memory_to_the_os()
    with phase():
        assert calls == [heap.XLA_THRESHOLDS, thresholds]
    assert calls == [heap.XLA_THRESHOLDS, thresholds, heap.XLA_THRESHOLDS]
    with pytest.raises(RuntimeError):
        with phase():
            raise RuntimeError("a failed fit")
    assert calls[-1] == heap.XLA_THRESHOLDS and len(calls) == 5


def test_a_phase_within_a_phase_restores_the_outer_ones_and_one_of_the_same_kind_changes_nothing(calls):
    heap.return_freed_memory_to_the_os()
    with heap.xla_loop_phase():
        with heap.xla_loop_phase():
            assert calls == [heap.XLA_THRESHOLDS, heap.XLA_LOOP_THRESHOLDS]
        with heap.numpy_phase():
            pass
        assert calls[-1] == heap.XLA_LOOP_THRESHOLDS
    assert calls == [heap.XLA_THRESHOLDS, heap.XLA_LOOP_THRESHOLDS, heap.NUMPY_THRESHOLDS, heap.XLA_LOOP_THRESHOLDS,
                     heap.XLA_THRESHOLDS]


def test_a_process_that_never_fixed_its_thresholds_is_left_alone(calls):
    with heap.numpy_phase(), heap.xla_loop_phase():
        pass
    assert calls == []


def test_on_glibc_the_thresholds_are_set():
    if heap._libc() is None:
        pytest.skip("not glibc: mallopt is absent and the thresholds are a no-op")
    assert heap._set(*heap.XLA_THRESHOLDS)


def test_a_launcher_collects_cycles_rarely_with_its_imports_frozen():
    import subprocess
    import sys
    from pathlib import Path

    script = ("import gc\nfrom launch.common import run_app\n"
              "def main(argv):\n    print(gc.get_threshold(), gc.get_freeze_count() > 100_000)\n"
              "run_app(main, ['launcher'])\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == f"{heap.GC_THRESHOLDS} True", result.stderr[-2000:]
