"""writer/store's four DuckDB files in one instance (storage/duck_files.py)."""
from __future__ import annotations

import duckdb

from storage import duck_files, schema


def test_each_files_cursors_write_to_that_file_alone_and_a_reopen_finds_it(tmp_path):
    db_dir = tmp_path / "it's here"   # a quote in the path: the ATTACH names it as a literal
    db_dir.mkdir()
    conns, cursors = {}, {}
    instance = duck_files.open_files(db_dir, 64, conns, cursors)
    try:
        assert set(conns) == set(cursors) == set(schema.DATABASES)
        for db in schema.DATABASES:
            assert conns[db].execute("SELECT current_database()").fetchone() == (db,)
            assert cursors[db].execute("SELECT current_database()").fetchone() == (db,)
            conns[db].execute("CREATE TABLE mark (db VARCHAR)")
            conns[db].execute("INSERT INTO mark VALUES (?)", [db])
        assert conns["flows"].execute("SELECT current_setting('memory_limit')").fetchone() == ("61.0 MiB",)
    finally:
        duck_files.close_files(instance, conns, cursors)
    for db in schema.DATABASES:   # each file on its own, as a tool or an older version opens it
        con = duckdb.connect(str(db_dir / f"{db}.db"))
        try:
            assert con.execute("SELECT db FROM mark").fetchall() == [(db,)]
        finally:
            con.close()
    instance = duck_files.open_files(db_dir, 64, conns)   # closed for good: the files open again
    try:
        assert conns["access"].execute("SELECT db FROM mark").fetchall() == [("access",)]
    finally:
        duck_files.close_files(instance, conns)
