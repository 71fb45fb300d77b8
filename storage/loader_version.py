"""Which writer/store loaded a DuckDB file: one whose log reader could skip records, or not.

Before d10742a (2026-12-04) the reader skipped the rest of a sealed segment whenever one of its
looks ended exactly on a record's end (storage/segments.py, `whole_records`): a store that caught
up after a restart or a lag could leave transcripts, events and checkpoints out of DuckDB. The
log has them all, and a file loaded from an empty start by today's reader has them too.

So each file records `loader_version` when it is created empty. A file with rows and no such
record was loaded by an older store: writer/store says so at every open (a WARNING line naming
what to do), until the operator moves the DuckDB files aside and writer/store rebuilds them from
the log (README, "Operating it"). Rebuilding by itself would stall every read for as long as the
log takes to load (136 s for 6M records here), so it is left to the operator's hour.
"""
from __future__ import annotations

import logging

import duckdb

LOADER_VERSION = 2   # 1: the reader that could skip records; 2: d10742a on
DDL = "CREATE TABLE IF NOT EXISTS loader_version (version INTEGER)"


def check(con: duckdb.DuckDBPyConnection, db: str, has_rows: bool, log: logging.Logger) -> int | None:
    """The version that loaded the file (recorded now if the file is new); None if one from
    before this record loaded it, which is then said in a WARNING line."""
    con.execute(DDL)
    (version,) = con.execute("SELECT max(version) FROM loader_version").fetchone()
    if version is None and not has_rows:
        con.execute("INSERT INTO loader_version VALUES (?)", [LOADER_VERSION])
        return LOADER_VERSION
    if version is None or version < LOADER_VERSION:
        log.warning("%s.db was loaded by a writer/store whose log reader could skip records (fixed on "
                    "2026-12-04): some rows may be missing from it, though the log holds every record. To "
                    "rebuild the DuckDB files from the log, stop the server and move the data directory's "
                    "db/ aside; the next start loads the log again (reads wait until it has)", db)
    return version
