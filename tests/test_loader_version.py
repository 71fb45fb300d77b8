"""A DuckDB file says which writer/store loaded it (storage/loader_version.py): one loaded by a
store whose log reader could skip records is named in a WARNING at every open, with what to do."""
import logging

import duckdb

from storage import loader_version, records, segments
from storage.records import RecordKind
from storage.store import Store


def a_log_of_one_session(tmp_path) -> None:
    log = segments.SegmentLog(tmp_path / "wal" / "0", segment_bytes=1 << 20)
    body = records.encode_body({"session": "s", "tenant": "t", "turn": "t1", "seq": 1, "type": "turn.completed",
                                "data": {}, "at": 1.0})
    log.write(records.frame(RecordKind.EVENT, b"", body), sync=True)
    log.close()


def opened(tmp_path) -> Store:
    store = Store(tmp_path, writers=1, memory_limit_mb=64)
    store.open()
    store.load_all()
    return store


def versions(tmp_path) -> dict[str, int | None]:
    out = {}
    for db in ("events", "messages", "flows", "access"):
        con = duckdb.connect(str(tmp_path / "db" / f"{db}.db"), read_only=True)
        try:
            out[db] = con.execute("SELECT max(version) FROM loader_version").fetchone()[0]
        except duckdb.CatalogException:
            out[db] = None
        finally:
            con.close()
    return out


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "log reader" in r.getMessage()]


def test_files_made_empty_by_this_store_say_so_and_warn_of_nothing(tmp_path, caplog):
    a_log_of_one_session(tmp_path)
    with caplog.at_level(logging.WARNING):
        opened(tmp_path).close()
        opened(tmp_path).close()
    assert versions(tmp_path) == dict.fromkeys(("events", "messages", "flows", "access"), loader_version.LOADER_VERSION)
    assert warnings(caplog) == []


def test_a_file_an_older_store_loaded_is_named_at_every_open_until_rebuilt(tmp_path, caplog):
    a_log_of_one_session(tmp_path)
    opened(tmp_path).close()
    con = duckdb.connect(str(tmp_path / "db" / "events.db"))
    con.execute("DROP TABLE loader_version")   # as a store from before it left the file, with its rows
    con.close()
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            store = opened(tmp_path)
        assert store.query("events", "s")[0], "the rows it has are read as ever"
        store.close()
        assert len(warnings(caplog)) == 1 and warnings(caplog)[0].startswith("events.db was loaded")
    assert versions(tmp_path)["events"] is None   # it never claims the version it does not have
    (tmp_path / "db").rename(tmp_path / "db.old")   # what the warning says to do
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        store = opened(tmp_path)
    assert [r["type"] for r in store.query("events", "s")[0]] == ["turn.completed"]   # rebuilt from the log
    store.close()
    assert warnings(caplog) == [] and versions(tmp_path)["events"] == loader_version.LOADER_VERSION
