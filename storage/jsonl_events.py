"""The optional JSON-lines copy of the events (`storage.jsonl_dir`): one line per event, exactly once.

writer/store appends a load batch's event lines and fdatasyncs them *before* the DuckDB
transaction that loads the same events, and that transaction records where the file then ends
(`jsonl_progress` in events.db). Whatever lies past that end belongs to a batch DuckDB never
took — a kill between the two, or a failed commit — and is cut: on open, or at once after a
failed commit. The loader resumes from DuckDB's progress and writes those lines again. Writing
the lines after the commit instead (as this layer first did) lost them to a kill between the two.

Each batch opens the file anew, in append mode, so a file moved away by a log rotator is simply
started again. A file shorter than recorded (rotated, or truncated by someone else) is left
alone: writing goes on at its end. So is a file in a directory other than the one recorded.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable

import orjson

FILE_NAME = "events.jsonl"
RECORD_END = "UPDATE jsonl_progress SET path = ?, bytes = ?"   # in events.db (storage/schema.py)


class JsonlEvents:
    def __init__(self, directory: Path, log: logging.Logger) -> None:
        self.path = directory / FILE_NAME
        self.log = log

    def open(self, committed: tuple[str, int] | None) -> int:
        """Cuts what no commit covered (`committed`: the path and end recorded last, if any) and
        returns where the file ends now. Raises OSError when the directory cannot take the file:
        a setting that cannot work fails the start, not every batch after it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open()
        try:
            size = os.fstat(fd).st_size
            if committed is not None and committed[0] == str(self.path) and size > committed[1]:
                os.ftruncate(fd, committed[1])
                os.fdatasync(fd)
                self.log.info("%s: cut %d bytes past its last committed batch (written again from the log)",
                              self.path, size - committed[1])
                size = committed[1]
            return size
        finally:
            os.close(fd)

    def open_with(self, con: Any) -> None:
        """`open` against what events.db (`con`) recorded; the file as it then stands counts as
        committed (a new path's too: a crash before the next commit must cut back to here)."""
        row = con.execute("SELECT path, bytes FROM jsonl_progress").fetchone()
        size = self.open(row)
        con.execute("INSERT INTO jsonl_progress VALUES (?, ?)" if row is None else RECORD_END, [str(self.path), size])

    def write_then(self, events: list[dict], commit: Callable[[tuple[str, list]], None]) -> None:
        """Writes the lines, then calls `commit` with the statement that records their end, for the
        transaction that loads the same events; cuts them if it fails."""
        start, end = self.write(events)
        try:
            commit((RECORD_END, [str(self.path), end]))
        except BaseException:
            self.cut(start)
            raise

    def write(self, events: list[dict]) -> tuple[int, int]:
        """Appends one line per event and fdatasyncs them; returns where they start and end. On
        failure (a full disk) nothing of them stays."""
        data = b"".join(orjson.dumps(e, default=_jsonable) + b"\n" for e in events)
        fd = self._open()
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fdatasync(fd)
            except OSError:
                os.ftruncate(fd, start)
                raise
            return start, start + len(data)
        finally:
            os.close(fd)

    def cut(self, end: int) -> None:
        """Drops what was written past `end` (its batch's commit failed; the retry writes it again)."""
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except FileNotFoundError:
            return   # moved away meanwhile: nothing of ours to cut
        try:
            if os.fstat(fd).st_size > end:
                os.ftruncate(fd, end)
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def _open(self) -> int:
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if created:   # its directory entry is part of what a commit relies on
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return fd


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    raise TypeError
