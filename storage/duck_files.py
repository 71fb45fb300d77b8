"""writer/store's four DuckDB files, attached to one DuckDB instance.

An instance costs about 20 ms of CPU to start (an in-memory one too) and eight threads whatever
its `threads` setting; an attached file 0.4 ms and none (four instances had writer/store at 37
threads). Each file's connections are cursors of the instance with that file as their default
database (`USE`), so every statement names its tables as before and each transaction stays in
one file. The memory limit is the instance's, shared by the files.
"""
from __future__ import annotations

from pathlib import Path

import duckdb

from storage import schema

CHECKPOINT_THRESHOLD = "4MB"

Cursors = dict[str, duckdb.DuckDBPyConnection]


def open_files(db_dir: Path, memory_mb: int, *cursor_sets: Cursors) -> duckdb.DuckDBPyConnection:
    """The instance: the first file opened, the others attached under their names; then one
    cursor of each file into each of `cursor_sets` (filled in place)."""
    first, *others = schema.DATABASES
    # Small on purpose: DuckDB keeps the blocks it wrote in its buffer pool until the limit
    # presses, so a generous limit reads as memory that grows with the database.
    # One thread: every DuckDB thread builds its own share of a query's hash tables, and under
    # this limit two threads ran out of memory (open_runs over 20k finished runs, and every
    # restarted actor then waited on it for good) where one thread spills to disk and answers.
    # The loader appends from one thread anyway.
    instance = duckdb.connect(str(db_dir / f"{first}.db"), config={"memory_limit": f"{memory_mb}MB", "threads": 1})
    try:
        # A small WAL: appended rows leave memory for the file sooner, and a restart replays less.
        instance.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
        for db in others:
            path = str(db_dir / f"{db}.db").replace("'", "''")
            instance.execute(f"ATTACH '{path}' AS \"{db}\"")
        for db in schema.DATABASES:
            for cursors in cursor_sets:
                cursors[db] = instance.cursor()
                cursors[db].execute(f'USE "{db}"')
    except BaseException:
        instance.close()
        raise
    return instance


def close_files(instance: duckdb.DuckDBPyConnection | None, *cursor_sets: Cursors) -> None:
    for cursors in cursor_sets:
        for cursor in cursors.values():
            cursor.close()
    if instance is not None:
        instance.close()


def append_rows(con: duckdb.DuckDBPyConnection, tables: dict[str, list[tuple]],
                statement: tuple[str, list] | None = None) -> None:
    """Each table's rows through its appender, and `statement` after them, in one transaction:
    all of it is there, or none."""
    con.execute("BEGIN TRANSACTION")
    try:
        for table, table_rows in tables.items():
            appender = con.appender(table)
            appender.append_rows(table_rows)
            appender.flush()
        if statement is not None:
            con.execute(*statement)
        con.execute("COMMIT")
    except Exception:
        try:
            con.execute("ROLLBACK")
        except duckdb.TransactionException:
            pass  # a failed COMMIT already ended the transaction
        raise
