"""Opening, reading line by line and atomically writing the data files, with failures as `DataError`s.

Shared by the episode and model-card readers/writers and the converters, so that a missing file, a
non-UTF-8 line or a half-written output is reported (or avoided) the same way everywhere.
"""

from __future__ import annotations

import glob
import lzma
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from rivet_jax.data.validation import DataError, Where, parse_json

__all__ = ["PathLike", "open_error", "numbered_lines", "decode_line", "read_json_document", "atomic_write_text",
           "episode_paths"]

PathLike = str | os.PathLike


def episode_paths(spec: str) -> list[str]:
    """The episode files a setting names: one path, several separated by commas, or glob patterns (`logs/*.jsonl`,
    sorted), in the order given; a pattern that matches no file is a DataError naming it."""
    paths: list[str] = []
    for part in (p.strip() for p in str(spec).split(",")):
        if not part:
            continue
        if glob.has_magic(part):
            matched = sorted(glob.glob(part))
            if not matched:
                raise DataError(part, None, "<file>", "no file matches this pattern")
            paths += matched
        else:
            paths.append(part)
    if not paths:
        raise DataError(str(spec), None, "<file>", "no episode file named")
    return paths


def open_error(path: str, err: OSError) -> DataError:
    """The DataError for a file that could not be opened."""
    if isinstance(err, FileNotFoundError):
        return DataError(path, None, "<file>", "file does not exist")
    return DataError(path, None, "<file>", f"cannot read file: {err.strerror or err}")


def numbered_lines(path: str) -> Iterator[tuple[Where, bytes]]:
    """(location, raw line) for each line of the file, numbered from 1; DataError if it cannot be opened.

    A line ends at LF, CR LF or a lone CR (old Mac files), so such a file is neither one long bad line nor
    numbered differently from what an editor shows. A name ending in `.xz` is read through its decompression (the
    line numbers are those of the decompressed text); a damaged or cut stream is a DataError at the line it reached.
    """
    try:
        # Latin-1 maps every byte to one character and back, so this reads bytes with Python's universal newlines;
        # UTF-8 is decoded line by line (`decode_line`) so that a bad byte fails its own line only. (No byte of a
        # multi-byte UTF-8 character is CR or LF, so no character is split.)
        if path.endswith(".xz"):
            f = lzma.open(path, "rt", encoding="latin-1", newline=None)
        else:
            f = open(path, encoding="latin-1", newline=None)
    except OSError as err:
        raise open_error(path, err) from None
    line_no = 0
    with f:
        try:
            for line_no, line in enumerate(f, start=1):
                yield Where(path, line_no), line.encode("latin-1")
        except (lzma.LZMAError, EOFError) as err:  # EOFError: the stream ends before its end marker
            raise DataError(path, line_no + 1, "<file>", f"the xz stream is damaged or cut short: {err}") from None


def decode_line(raw: bytes, where: Where) -> str:
    """The line as text; a byte-order mark is dropped on the first line only (where it may legitimately be)."""
    try:
        return raw.decode("utf-8-sig" if where.line == 1 else "utf-8")
    except UnicodeDecodeError as err:
        raise where.error("<json>", f"not valid UTF-8: {err.reason}") from None


def read_json_document(path: PathLike) -> Any:
    """A whole file as one JSON value (the model cards, a trajectory document); its errors name the file (and a
    syntax error's line)."""
    path_str = os.fspath(path)
    try:
        with open(path_str, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise open_error(path_str, err) from None
    except UnicodeDecodeError as err:
        raise DataError(path_str, None, "<json>", f"not valid UTF-8: {err}") from None
    return parse_json(text, Where(path_str, None))


def atomic_write_text(path: PathLike, text: str) -> None:
    """Write via a temp file in the same directory + os.replace, so readers never see half a file."""
    path_str = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path_str))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path_str)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path_str)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
