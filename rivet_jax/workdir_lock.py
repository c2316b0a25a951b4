"""One training run per workdir at a time.

Two runs writing one workdir's checkpoints interleave their saves and deletions; each then fails with orbax
tracebacks, or the late one reads a step the other just removed. `hold_workdirs` takes an exclusive `flock` on
`<workdir>/.lock` (with the holder's PID and host written in it) for the whole of training, and refuses a second
run at once with one line. The kernel releases a flock when its holder exits, however it exits, so a lock file
left by a killed run never blocks the next one. In a multi-host run only process 0 takes the lock: the other
processes are the same run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from pathlib import Path
from typing import Iterator, Sequence

import jax
from absl import logging

LOCK_FILE = ".lock"


class WorkdirBusyError(RuntimeError):
    """Another live process is training in the workdir."""


@contextlib.contextmanager
def hold_workdir(workdir: str | os.PathLike) -> Iterator[None]:
    """Holds `workdir` exclusively for this process until the block ends; WorkdirBusyError if another holds it."""
    if jax.process_index() != 0:
        yield
        return
    path = Path(workdir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "a process that has not yet written it"
            raise WorkdirBusyError(f"{Path(workdir).resolve()} is in use by another training run ({holder}, lock "
                                   f"{path}): wait for it to end, or train in another workdir") from None
        except OSError as error:  # a filesystem without flock: train, but say what is not guarded
            logging.warning("cannot lock %s (%s): a second run on this workdir would not be refused", path, error)
        else:  # written only once the lock is ours: a refused run must not erase the holder's PID
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def hold_workdirs(workdirs: Sequence[str | os.PathLike]) -> Iterator[None]:
    """`hold_workdir` of every distinct workdir (a run group's), all or none."""
    with contextlib.ExitStack() as stack:
        for workdir in sorted({Path(w).resolve() for w in workdirs}):
            stack.enter_context(hold_workdir(workdir))
        yield
