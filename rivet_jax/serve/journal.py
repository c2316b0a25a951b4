"""The proxy's files on disk: one framing rule, appends that are durable or undone, and one writer per directory.

Framing (every file the proxy writes and reads; the training reader, `data.files.numbered_lines`, reads it alike):
one JSON object per line, UTF-8, each line ending in a line feed. The writer escapes U+2028 and U+2029 (JSON allows
it; some readers break lines there) and never writes NaN or Infinity; json.dumps already escapes CR and LF inside
strings. A reader splits on line feeds only, decodes each line by itself, and tells a *torn tail* (the last line,
with no line feed: a write cut short by a crash, never answered) from a *bad line* (anything else that does not
read: quarantined with its line number, never a reason to refuse to start).

Appends (`Journal.append`): written, flushed and fsynced before the call returns; a write that fails (a full disk,
an I/O error) is truncated back to the last whole line and raised as `StorageError`, so the file never holds half
a record in its middle and the caller keeps its state as it was.

One writer (`DirectoryLock`): an exclusive `flock` on `<dir>/.lock` for as long as the proxy runs; a second proxy
on the same directory is refused at start (`LogDirBusyError`, naming the holder's pid).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from rivet_jax.config_checks import ConfigError
from rivet_jax.data.files import decode_line
from rivet_jax.data.validation import DataError, Where, parse_json

__all__ = ["StorageError", "LogDirBusyError", "DirectoryLock", "Journal", "Line", "encode_record", "read_lines",
           "repair_torn_tail"]


class StorageError(OSError):
    """A record could not be made durable (the disk is full, an I/O error): nothing was changed; answered 503."""


class LogDirBusyError(ConfigError):
    """Another process records to this directory (refused at start, one line, as any ConfigError)."""


def encode_record(record: dict) -> bytes:
    """One line of the framing (module docstring); ValueError for NaN/Infinity, UnicodeEncodeError for a lone
    surrogate: a record that cannot be written as valid UTF-8 JSON is never written at all."""
    text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    return (text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") + "\n").encode("utf-8")


@dataclasses.dataclass(frozen=True)
class Line:
    """One line of a journal as read back: its number (from 1), the record, or why it does not read."""

    number: int
    record: dict | None
    error: str | None
    raw: bytes
    torn: bool = False   # the last line, without its line feed (a write cut short)


def read_lines(path: Path) -> Iterator[Line]:
    """Every line of a journal file (none if it does not exist), read by the framing rule."""
    if not path.exists():
        return
    data = path.read_bytes()
    lines = data.split(b"\n")
    for number, body in enumerate(lines, start=1):
        torn = number == len(lines)  # after the last line feed: empty, or a write cut short
        if not body.strip():
            continue
        where = Where(str(path), number)
        try:
            record = parse_json(decode_line(body, where), where)
            if not isinstance(record, dict):
                raise where.error("<record>", f"expected a JSON object, got {type(record).__name__}")
        except DataError as error:
            yield Line(number, None, str(error), body, torn)
            continue
        yield Line(number, record, None, body, torn)


def repair_torn_tail(path: Path) -> bytes:
    """Cuts a torn last line (module docstring) off the file; returns the bytes cut (b"" when the file is whole)."""
    if not path.exists():
        return b""
    with open(path, "rb+") as f:
        size = pos = f.seek(0, os.SEEK_END)
        while pos > 0:  # the last line feed, read backwards a block at a time
            step = min(pos, 1 << 16)
            f.seek(pos - step)
            cut = f.read(step).rfind(b"\n")
            if cut >= 0:
                keep = pos - step + cut + 1
                break
            pos -= step
        else:
            keep = 0
        if keep == size:
            return b""
        f.seek(keep)
        torn = f.read()
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return torn


class Journal:
    """An append-only JSON-lines file (module docstring: framing, durable-or-undone appends)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file = open(self.path, "ab")

    def append(self, record: dict) -> None:
        data = encode_record(record)
        start = self._file.tell()
        try:
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as error:
            self._undo(start)
            raise StorageError(error.errno, f"cannot write {self.path}: {os.strerror(error.errno or errno.EIO)}",
                               str(self.path)) from None

    def _undo(self, start: int) -> None:
        """Back to the last whole line: the failed write's bytes may have reached the file, or sit in the buffer."""
        try:
            self._file.close()
        except OSError:
            pass  # the buffered part of the failed write is dropped with the file object
        with open(self.path, "rb+") as f:
            f.truncate(start)
            try:
                os.fsync(f.fileno())
            except OSError:
                pass  # the truncation is what matters; the device may still refuse to sync
        self._file = open(self.path, "ab")

    def close(self) -> None:
        self._file.close()


class DirectoryLock:
    """An exclusive lock on a directory for this process's lifetime (module docstring)."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / ".lock"
        self._file = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            raise LogDirBusyError(f"{directory} is being recorded to by another process (pid {holder}): give this "
                                  f"proxy its own logdir (config.logdir), or stop the other one") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(str(os.getpid()))
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
