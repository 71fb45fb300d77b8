"""DuckDB's memory limit, raised for a statement that holds a big value, then lowered again.

writer/store keeps its DuckDB files to a small memory limit (storage/duck_files.py says why). But a
row may hold a value of up to MAX_VALUE_BYTES (a flow's result, a tool's output, a long message),
and DuckDB gives such a value blocks of its own size: at 16 MB (each file's limit once), three 4 MB
values in a batch, or one 8 MB value in a batch of its own, cannot be loaded or read back. The
loader then retried that batch for ever and loaded nothing after it. Worse, a COMMIT whose
autocheckpoint cannot pin such a block is durable yet invalidates the file (DuckDB's
FatalException). So the loader commits a batch that holds a big record with the limit raised up
front (`raised`), and any other statement DuckDB refuses for memory runs once more raised (`run`);
the limit goes back down when the last raised statement ends (the loader, the query thread and the
pass thread may each be in one). A COMMIT refused for memory comes as a TransactionException
("Failed to commit: could not allocate block…"), not as OutOfMemoryException; the transaction is
rolled back, so it too runs once more raised (it used to go to the loader's generic retry: an ERROR
in the log and a second's pause in loading).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import duckdb

RETRY_EXTRA_MB = 1024   # a ceiling only: DuckDB takes what the statement needs
# How DuckDB words a buffer it could not get, whatever the exception's class
_MEMORY_REFUSALS = ("could not allocate block", "failed to pin block")


T = TypeVar("T")


class MemoryLimit:
    """The DuckDB instance's limit, which its files share. `run(handle, fn)` calls fn(); refused
    for memory, once more raised."""

    def __init__(self, base_mb: int) -> None:
        self.base_mb = base_mb
        self.lock = threading.Lock()
        self.raised_by = 0       # statements running with the limit raised
        self.retries = 0
        self.stuck_high = False  # the limit could not go back down yet (see `_lower`)

    def run(self, handle: duckdb.DuckDBPyConnection, fn: Callable[[], T]) -> T:
        if self.stuck_high:
            with self.lock:
                if not self.raised_by:
                    self._lower(handle)
        try:
            return fn()
        except duckdb.Error as exc:
            if not refused_for_memory(exc):
                raise
        with self.raised(handle):
            return fn()

    @contextmanager
    def raised(self, handle: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """The limit raised while inside (`handle`: the caller's own cursor of the instance)."""
        with self.lock:
            self.raised_by += 1
            self.retries += 1
            handle.execute(f"SET memory_limit = '{self.base_mb + RETRY_EXTRA_MB}MB'")
        try:
            yield
        finally:
            with self.lock:
                self.raised_by -= 1
                if not self.raised_by:
                    self._lower(handle)

    def _lower(self, handle: duckdb.DuckDBPyConnection) -> None:
        """The limit back down. DuckDB refuses while it holds more than the limit in blocks it
        cannot evict (a deletion's row versions stay in memory until the next checkpoint): the
        limit then stays up, and the next `run` tries again. Refused, it used to fail the
        statement that had just succeeded — a close's deletions, committed, reported failed."""
        try:
            handle.execute(f"SET memory_limit = '{self.base_mb}MB'")
        except duckdb.Error as exc:
            if not refused_for_memory(exc):   # an OutOfMemoryException ("Failed to change memory limit")
                raise
            self.stuck_high = True
            return
        self.stuck_high = False


def refused_for_memory(exc: BaseException) -> bool:
    """Whether DuckDB refused a statement for want of memory (and left nothing of it behind).
    Not FatalException: a file DuckDB invalidated is not retried but reopened (storage/store.py)."""
    if isinstance(exc, duckdb.OutOfMemoryException):
        return True
    text = str(exc).lower()
    return isinstance(exc, duckdb.TransactionException) and any(words in text for words in _MEMORY_REFUSALS)
